"""``arli rollout``: a chunk policy under simulated latency, success per (mode, strategy, delay)."""

from __future__ import annotations

import json
import os
import time

import numpy as np
from tqdm import tqdm

from arli.chunking import ChunkScheduler
from arli.config import RolloutConfig
from arli.latency import FixedLatency, latency_from_config, to_delay_steps
from arli.rollout import gripper_hold, run_episode
from sim_envs import make_env, task_name
from sim_envs.experts import ExpertChunkPolicy


def evaluate_cell(cfg: RolloutConfig, strategy: str, latency, max_delay: int) -> dict:
    """Success rate over ``cfg.episodes`` seeded episodes for one cell."""
    env = make_env(cfg.env.name, dt=cfg.env.dt, image_size=cfg.env.image_size,
                   max_episode_steps=cfg.env.max_episode_steps)
    ch = cfg.chunking
    mode = "sync" if strategy == "sync" else "async"
    strat = "naive" if strategy == "sync" else strategy
    # keep every async cell valid: s = clamp(configured s, d_max, H - d_max)
    horizon = min(max(ch.execute_horizon, max_delay), ch.chunk_size - max_delay) if mode == "async" \
        else ch.execute_horizon
    scheduler = ChunkScheduler(ch.chunk_size, horizon, 5, mode, strat, max_delay, ch.blend_steps,
                               hold=gripper_hold())
    policy = ExpertChunkPolicy(task_name(cfg.env.name), ch.chunk_size)
    rng = np.random.default_rng(cfg.seed)
    results = [run_episode(env, policy, scheduler, latency, rng, seed=cfg.seed + i)
               for i in range(cfg.episodes)]
    env.close()
    return {
        "mode": mode, "strategy": strat, "execute_horizon": horizon,
        "success": float(np.mean([r.success for r in results])),
        "episodes": len(results),
        "mean_steps": float(np.mean([r.steps for r in results])),
        "mean_delay_steps": float(np.mean([np.mean(r.delays) for r in results])),
    }


def main(cfg: RolloutConfig) -> int:
    dt = cfg.env.dt
    if cfg.delay_steps:
        latencies = [(d, FixedLatency(d * dt)) for d in cfg.delay_steps]
    else:
        model = latency_from_config(cfg.latency)
        latencies = [(to_delay_steps(model.max_latency(), dt), model)]
    cells = []
    grid = [(d, lat, s) for d, lat in latencies for s in cfg.strategies]
    start = time.time()
    for max_delay, latency, strategy in tqdm(grid, desc="rollout cells", unit="cell"):
        if 2 * max_delay > cfg.chunking.chunk_size and strategy != "sync":
            tqdm.write(f"skip async/{strategy} at d={max_delay}: needs chunk_size >= {2 * max_delay}")
            continue
        cell = evaluate_cell(cfg, strategy, latency, max_delay)
        cell["delay_steps"] = max_delay
        cells.append(cell)
    print(f"\nexpert open-loop chunks on {cfg.env.name} (H={cfg.chunking.chunk_size}, "
          f"{cfg.episodes} episodes per cell, {time.time() - start:.0f} s)")
    print(f"{'mode':<6} {'strategy':<8} {'delay':>5} {'s':>3} {'success':>8} {'steps':>6}")
    for c in cells:
        print(f"{c['mode']:<6} {c['strategy']:<8} {c['delay_steps']:>5} {c['execute_horizon']:>3} "
              f"{c['success']:>8.2f} {c['mean_steps']:>6.1f}")
    os.makedirs(cfg.output_dir, exist_ok=True)
    path = os.path.join(cfg.output_dir, "rollout.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"env": cfg.env.name, "cells": cells}, fh, indent=1)
    print(f"wrote {path}")
    return 0
