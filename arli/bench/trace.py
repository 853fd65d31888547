"""Traced base-policy episodes: why a chunk policy fails under delay, measured.

For every step of an episode under asynchronous execution, the tracer records the executed
base action, what the scripted expert would do in the same state, the age of the
observation the executing chunk was planned from (t - t0), how far the hand moved since that
observation, and whether the step is the first slot of a newly landed chunk (a switch).
``summarize`` turns these into the numbers the ``arli bench base`` report reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from arli.chunking import ChunkingConfig, make_scheduler
from arli.interfaces import StepController
from arli.latency import FixedLatency
from arli.rollout import run_episode
from arli.types import Observation, StepInfo


@dataclass
class _Episode:
    expert_gap: list[float] = field(default_factory=list)  # max |a - a_expert| per step
    switch_jump: list[float] = field(default_factory=list)  # |a_t - a_{t-1}| at chunk switches
    inner_jump: list[float] = field(default_factory=list)  # ... inside a chunk
    obs_age: list[int] = field(default_factory=list)  # t - t0 of the executing chunk
    hand_moved_mm: list[float] = field(default_factory=list)  # |ee_t - ee_t0|
    object_z0: float | None = None
    object_z_max: float = -np.inf
    success: bool = False


class Tracer(StepController):
    """Executes the base action and records what it is compared with (see module doc).

    expert: state (n,) -> action (m,); object_z: index of the manipulated object's height in
    the state (to tell "never grasped" from "grasped, not placed"), or None.
    """

    def __init__(self, expert, object_z: int | None = None):
        self.expert, self.object_z = expert, object_z
        self.episodes: list[_Episode] = []

    def begin_episode(self) -> None:
        self.episodes.append(_Episode())
        self._last_action: np.ndarray | None = None
        self._last_chunk = -1

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        ep, state, action = self.episodes[-1], obs.state, info.base_action
        ep.expert_gap.append(float(np.max(np.abs(action - self.expert(state)))))
        if self._last_action is not None:
            jump = float(np.max(np.abs(action[:3] - self._last_action[:3])))
            (ep.switch_jump if info.chunk_id != self._last_chunk else ep.inner_jump).append(jump)
        if info.chunk_obs is not None:
            ep.obs_age.append(t - info.chunk_obs.step)
            ep.hand_moved_mm.append(1000 * float(np.linalg.norm(state[:3] - info.chunk_obs.state[:3])))
        if self.object_z is not None:
            ep.object_z0 = float(state[self.object_z]) if ep.object_z0 is None else ep.object_z0
            ep.object_z_max = max(ep.object_z_max, float(state[self.object_z]))
        self._last_action, self._last_chunk = action, info.chunk_id
        return action


def trace_episodes(env, policy, expert, delay: int, episodes: int, seed: int, chunking: ChunkingConfig,
                   object_z: int | None = None) -> Tracer:
    """Run ``episodes`` async-naive episodes at fixed ``delay`` with a Tracer."""
    dt = float(env.unwrapped.dt)
    scheduler = make_scheduler(chunking, policy.chunk_size, env.action_space.shape[0], delay, delay, "naive")
    tracer, rng = Tracer(expert, object_z), np.random.default_rng(seed)
    for i in range(episodes):
        result = run_episode(env, policy, scheduler, FixedLatency(delay * dt), rng, seed + i, tracer)
        tracer.episodes[-1].success = result.success
    return tracer


def summarize(tracer: Tracer, lift: float = 0.01) -> dict[str, float]:
    """Means over every traced step, and the failure split (when the object height is traced):
    ``failed_never_grasped`` = share of failed episodes whose object never rose ``lift`` m."""
    eps = tracer.episodes

    def mean(key: str) -> float:
        values = [v for e in eps for v in getattr(e, key)]
        return float(np.mean(values)) if values else float("nan")

    out = {"episodes": len(eps), "success": float(np.mean([e.success for e in eps])),
           "expert_gap": mean("expert_gap"), "switch_jump": mean("switch_jump"),
           "inner_jump": mean("inner_jump"), "obs_age": mean("obs_age"),
           "hand_moved_mm": mean("hand_moved_mm")}
    failed = [e for e in eps if not e.success]
    if tracer.object_z is not None and failed:
        out["failed_never_grasped"] = float(np.mean([e.object_z_max - e.object_z0 < lift for e in failed]))
    return out


def object_height_index(env) -> int | None:
    """Index of the manipulated object's height in the state (first task feature named *_z)."""
    names = list(getattr(env.unwrapped, "state_names", ()))
    from sim_envs.base import PROPRIO_DIM  # noqa: PLC0415

    return next((i for i, n in enumerate(names) if i >= PROPRIO_DIM and n.endswith("_z")), None)
