"""In-process rollouts of a chunk policy under simulated (sim-time) latency.

The policy is queried at the request step ``t0`` with ``o_t0``; its chunk is handed to the
scheduler ``d`` control steps later, exactly as if inference had taken ``d * dt`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import gymnasium as gym
import numpy as np

from arli.chunking import ChunkScheduler, make_hold
from arli.latency import LatencyModel, to_delay_steps
from arli.types import Observation, StepInfo


class ChunkPolicy(Protocol):
    chunk_size: int

    def predict_actions(self, state: np.ndarray, committed_prefix: np.ndarray | None = None,
                        delay_steps: int | None = None, image: np.ndarray | None = None,
                        guidance: np.ndarray | None = None) -> np.ndarray:
        """state (n,) -> actions (H, m); the committed prefix fills slots 0..d-1."""

    def reset(self, seed: int | None = None) -> None: ...


@dataclass
class EpisodeResult:
    success: bool
    steps: int
    requests: int
    starved_steps: int
    delays: list[int] = field(default_factory=list)


StepHook = Callable[[int, dict, StepInfo], None]


def gripper_hold(action_dim: int = 5):
    """Hold for our delta-action tasks: no motion, keep the gripper command."""
    return make_hold(action_dim, absolute_dims=(action_dim - 1,))


def run_episode(
    env: gym.Env,
    policy: ChunkPolicy,
    scheduler: ChunkScheduler,
    latency: LatencyModel,
    rng: np.random.Generator,
    seed: int,
    on_step: StepHook | None = None,
) -> EpisodeResult:
    """One episode; ``on_step(t, obs, info)`` sees every executed step."""
    dt = float(getattr(env.unwrapped, "dt", 0.05))
    obs, info = env.reset(seed=seed)
    policy.reset(seed)
    scheduler.reset()
    pending: list[tuple[int, int, np.ndarray]] = []  # (arrival step, request id, actions)
    delays: list[int] = []
    t = 0
    done = False

    def land(step: int) -> None:
        for item in [p for p in pending if p[0] <= step]:
            pending.remove(item)
            scheduler.deliver(item[1], item[2], step)

    while not done:
        land(t)  # chunks that arrived during the last period switch in first
        if scheduler.should_request(t):
            d = to_delay_steps(latency.sample(rng), dt)
            req = scheduler.make_request(Observation(obs["state"], t, t * dt), t, d)
            actions = policy.predict_actions(obs["state"], req.committed_prefix, d,
                                             obs.get("image"), req.guidance)
            pending.append((t + d, req.request_id, actions))
            delays.append(d)
            land(t)  # d = 0: available before this step runs
        step_info = scheduler.step(t)
        if on_step is not None:
            on_step(t, obs, step_info)
        obs, _, terminated, truncated, info = env.step(step_info.base_action)
        done = terminated or truncated
        t += 1
    return EpisodeResult(bool(info["is_success"]), t, len(delays), scheduler.starved_steps, delays)
