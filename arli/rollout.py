"""In-process rollouts of a chunk policy under simulated (sim-time) latency.

The policy is queried at the request step ``t0`` with ``o_t0``; its chunk is handed to the
scheduler ``d`` control steps later, exactly as if inference had taken ``d * dt`` seconds.
The loop itself is the robot runtime's (``arli.runtime.loop``); this module wires it to a
gym env and an in-process policy, and evaluates success per (strategy, latency) cell.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from tqdm import tqdm

from arli.chunking import ChunkScheduler, make_hold
from arli.latency import LatencyModel, to_delay_steps
from arli.policies.base import BasePolicy
from arli.runtime.clock import SimClock
from arli.runtime.inference import SimInference
from arli.interfaces import StepController
from arli.runtime.loop import Episode, EpisodeResult
from robot_drivers.sim import SimDriver


def gripper_hold(action_dim: int = 5):
    """Hold for our delta-action tasks: no motion, keep the gripper command."""
    return make_hold(action_dim, absolute_dims=(action_dim - 1,))


def run_episode(
    env: gym.Env,
    policy: BasePolicy,
    scheduler: ChunkScheduler,
    latency: LatencyModel,
    rng: np.random.Generator,
    seed: int,
    controller: StepController | None = None,
) -> EpisodeResult:
    """One episode of the runtime loop in sim time: ``env`` behind ``SimDriver``, the policy
    behind ``SimInference`` (replies delayed by ``latency`` draws from ``rng``)."""
    episode = sim_episode(env, policy, scheduler, latency, rng, seed, controller)
    while not episode.done:
        episode.step()
    return episode.finish()


def sim_episode(env: gym.Env, policy: BasePolicy, scheduler: ChunkScheduler, latency: LatencyModel,
                rng: np.random.Generator, seed: int, controller: StepController | None = None) -> Episode:
    """The runtime loop's ``Episode`` in sim time, to be stepped by the caller."""
    driver = SimDriver(env)
    inference = SimInference(policy, latency, rng, driver.dt)
    return Episode(driver, inference, scheduler, SimClock(driver.dt), seed, controller)


def planning_delay(latency: LatencyModel, dt: float, chunk_size: int) -> int:
    """The delay (steps) the scheduler plans for: the model's maximum, capped at H // 2 so a
    long-tailed model (a recorded trace with a spike) still runs. Longer delays are spikes:
    the runtime holds through them and counts them (``EpisodeResult.spikes``)."""
    return min(to_delay_steps(latency.max_latency(), dt), chunk_size // 2)


CELL_STRATEGIES = ("sync", "naive", "blend", "rtc")  # "sync" = synchronous execution


def async_horizon(execute_horizon: int, chunk_size: int, max_delay: int) -> int:
    """Clamp s into [d_max, H - d_max] so every async cell of a sweep is valid."""
    return min(max(execute_horizon, max_delay), chunk_size - max_delay)


def evaluate_policy(
    env: gym.Env,
    policy: BasePolicy,
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
    H = policy.chunk_size
    true_max = to_delay_steps(latency.max_latency(), dt)
    max_delay = true_max if strategy == "sync" else planning_delay(latency, dt, H)
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
        "delay_steps": true_max, "latency_spikes": int(sum(r.spikes for r in results)), "execute_horizon": horizon,
        "success": float(np.mean([r.success for r in results])), "episodes": len(results),
        "mean_steps": float(np.mean([r.steps for r in results])),
        "mean_delay_steps": float(np.mean([np.mean(r.delays) for r in results])),
        "starved_steps": int(sum(r.starved_steps for r in results)),
    }


def sweep(
    env: gym.Env,
    policy: BasePolicy,
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
