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

from arli.chunking import ChunkingConfig, ChunkScheduler, delay_bounds, make_scheduler
from arli.latency import LatencyModel, to_delay_steps
from arli.policies.base import BasePolicy
from arli.interfaces import StepController
from arli.runtime.clock import SimClock
from arli.runtime.inference import SimInference
from arli.runtime.loop import Episode, EpisodeResult
from robot_drivers.sim import SimDriver


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
    inference = SimInference(policy, latency, rng, driver.dt, initial_delay_steps=scheduler.max_delay_steps)
    return Episode(driver, inference, scheduler, SimClock(driver.dt), seed, controller)


def evaluate_policy(
    env: gym.Env,
    policy: BasePolicy,
    chunking: ChunkingConfig,
    latency: LatencyModel,
    episodes: int,
    seed: int,
    controller: StepController | None = None,
    strategy: str | None = None,
) -> dict:
    """Success of ``policy`` over ``episodes`` seeded episodes for one (strategy, latency) cell.

    ``strategy`` overrides ``chunking.strategy`` ("sync" = synchronous execution). The
    episode seeds are ``seed .. seed + episodes - 1`` for every cell, so cells are paired
    comparisons.
    """
    dt = float(getattr(env.unwrapped, "dt", 0.05))
    planned, low = delay_bounds(chunking, latency.max_latency(), latency.min_latency(), dt)
    scheduler = make_scheduler(chunking, policy.chunk_size, env.action_space.shape[0], planned, low, strategy)
    rng = np.random.default_rng(seed)
    results = [run_episode(env, policy, scheduler, latency, rng, seed + i, controller)
               for i in range(episodes)]
    sync = scheduler.mode == "sync"
    return {
        "mode": scheduler.mode, "strategy": "none" if sync else scheduler.strategy,
        "delay_steps": to_delay_steps(latency.max_latency(), dt),
        "latency_spikes": int(sum(r.spikes for r in results)), "execute_horizon": scheduler.execute_horizon,
        "success": float(np.mean([r.success for r in results])), "episodes": len(results),
        "outcomes": [bool(r.success) for r in results],
        "mean_steps": float(np.mean([r.steps for r in results])),
        # episodes that ended before any reply landed have no delay to average
        "mean_delay_steps": float(np.mean([np.mean(r.delays) for r in results if r.delays]))
        if any(r.delays for r in results) else float("nan"),
        "starved_steps": int(sum(r.starved_steps for r in results)),
        "sim_unstable_episodes": int(sum(r.sim_unstable for r in results)),  # counted as failures
    }


def sweep(
    env: gym.Env,
    policy: BasePolicy,
    chunking: ChunkingConfig,
    strategies: list[str],
    latencies: list[LatencyModel],
    episodes: int,
    seed: int,
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
        cell = evaluate_policy(env, policy, chunking, latency, episodes, seed, strategy=strategy)
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
