"""In-process rollouts of a chunk policy under simulated (sim-time) latency.

The policy is queried at the request step ``t0`` with ``o_t0``; its chunk is handed to the
scheduler ``d`` control steps later, exactly as if inference had taken ``d * dt`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import gymnasium as gym
import numpy as np
from tqdm import tqdm

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


def gripper_hold(action_dim: int = 5):
    """Hold for our delta-action tasks: no motion, keep the gripper command."""
    return make_hold(action_dim, absolute_dims=(action_dim - 1,))


class StepController:
    """Decides the executed action and sees the outcome of every step of ``run_episode``.

    The default executes the base action; the residual learner and the intervener
    override ``act`` and collect transitions in ``after_step`` / ``end``.
    """

    def begin_episode(self) -> None:
        """A new episode starts (called by ``run_episode`` before its first step)."""

    def act(self, t: int, obs: dict, info: StepInfo) -> np.ndarray:
        return info.base_action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        """Outcome of the action chosen by ``act`` at step t."""

    def end(self, obs: dict, info: StepInfo, terminated: bool, truncated: bool) -> None:
        """Episode over: the final observation and what the scheduler would do next."""


def run_episode(
    env: gym.Env,
    policy: ChunkPolicy,
    scheduler: ChunkScheduler,
    latency: LatencyModel,
    rng: np.random.Generator,
    seed: int,
    controller: StepController | None = None,
) -> EpisodeResult:
    """One episode with the base policy's chunks under sim-time latency."""
    ctl = controller or StepController()
    dt = float(getattr(env.unwrapped, "dt", 0.05))
    obs, info = env.reset(seed=seed)
    policy.reset(seed)
    scheduler.reset()
    ctl.begin_episode()
    pending: list[tuple[int, int, np.ndarray]] = []  # (arrival step, request id, actions)
    delays: list[int] = []
    t = 0
    terminated = truncated = False

    def land(step: int) -> None:
        for item in [p for p in pending if p[0] <= step]:
            pending.remove(item)
            scheduler.deliver(item[1], item[2], step)

    while not (terminated or truncated):
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
        action = ctl.act(t, obs, step_info)
        obs, reward, terminated, truncated, info = env.step(action)
        ctl.after_step(t, float(reward), terminated, truncated)
        t += 1
    land(t)
    ctl.end(obs, scheduler.peek(t), terminated, truncated)
    return EpisodeResult(bool(info["is_success"]), t, len(delays), scheduler.starved_steps, delays)


CELL_STRATEGIES = ("sync", "naive", "blend", "rtc")  # "sync" = synchronous execution


def async_horizon(execute_horizon: int, chunk_size: int, max_delay: int) -> int:
    """Clamp s into [d_max, H - d_max] so every async cell of a sweep is valid."""
    return min(max(execute_horizon, max_delay), chunk_size - max_delay)


def evaluate_policy(
    env: gym.Env,
    policy: ChunkPolicy,
    strategy: str,
    latency: LatencyModel,
    episodes: int,
    seed: int,
    execute_horizon: int = 8,
    blend_steps: int = 4,
    controller: StepController | None = None,
    min_delay_steps: int = 0,
) -> dict:
    """Success of ``policy`` over ``episodes`` seeded episodes for one (strategy, latency) cell.

    strategy: "sync" (synchronous execution) or an async switch strategy. The episode seeds
    are ``seed .. seed + episodes - 1`` for every cell, so cells are paired comparisons.
    """
    if strategy not in CELL_STRATEGIES:
        raise ValueError(f"strategy must be one of {CELL_STRATEGIES}, got {strategy!r}")
    dt = float(getattr(env.unwrapped, "dt", 0.05))
    max_delay = to_delay_steps(latency.max_latency(), dt)
    H = policy.chunk_size
    mode = "sync" if strategy == "sync" else "async"
    horizon = execute_horizon if mode == "sync" else async_horizon(execute_horizon, H, max_delay)
    scheduler = ChunkScheduler(H, horizon, env.action_space.shape[0], mode,
                               "naive" if mode == "sync" else strategy, max_delay, blend_steps,
                               hold=gripper_hold(env.action_space.shape[0]),
                               min_delay_steps=min(min_delay_steps, max_delay))
    rng = np.random.default_rng(seed)
    results = [run_episode(env, policy, scheduler, latency, rng, seed + i, controller)
               for i in range(episodes)]
    return {
        "mode": mode, "strategy": strategy if mode == "async" else "none",
        "delay_steps": max_delay, "execute_horizon": horizon,
        "success": float(np.mean([r.success for r in results])), "episodes": len(results),
        "mean_steps": float(np.mean([r.steps for r in results])),
        "mean_delay_steps": float(np.mean([np.mean(r.delays) for r in results])),
        "starved_steps": int(sum(r.starved_steps for r in results)),
    }


def sweep(
    env: gym.Env,
    policy: ChunkPolicy,
    strategies: list[str],
    latencies: list[LatencyModel],
    episodes: int,
    seed: int,
    execute_horizon: int = 8,
    blend_steps: int = 4,
    desc: str = "cells",
) -> tuple[list[dict], list[str]]:
    """``evaluate_policy`` over latencies x strategies; returns (cells, skipped-cell notes).

    Async cells with ``2 d > H`` are skipped: no execute_horizon satisfies d <= s <= H - d.
    """
    dt = float(getattr(env.unwrapped, "dt", 0.05))
    grid, skipped = [], []
    for latency in latencies:
        d = to_delay_steps(latency.max_latency(), dt)
        for strategy in strategies:
            if strategy != "sync" and 2 * d > policy.chunk_size:
                skipped.append(f"async {strategy} at d={d} (needs chunk_size >= {2 * d})")
            else:
                grid.append((strategy, latency))
    cells = []
    for strategy, latency in tqdm(grid, desc=desc, unit="cell"):
        cell = evaluate_policy(env, policy, strategy, latency, episodes, seed, execute_horizon,
                               blend_steps)
        tqdm.write(f"{cell['mode']:>5} {cell['strategy']:>6} d={cell['delay_steps']}: "
                   f"success {cell['success']:.2f}")
        cells.append(cell)
    return cells, skipped


def cells_markdown(cells: list[dict]) -> str:
    """Markdown table of sweep cells."""
    rows = [f"| {c['mode']} | {c['strategy']} | {c['delay_steps']} | {c['execute_horizon']} | "
            f"{c['success']:.2f} | {c['mean_steps']:.0f} |" for c in cells]
    return ("| mode | strategy | delay_steps | execute_horizon | success | mean steps |\n"
            "|---|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n")
