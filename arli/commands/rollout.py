"""``arli rollout``: a chunk policy under simulated latency, success per (mode, strategy, delay)."""

from __future__ import annotations

import json
import os
import time

from arli.config import RolloutConfig
from arli.latency import FixedLatency, latency_from_config
from arli.policies.expert import ExpertChunkPolicy
from arli.rollout import cells_markdown, sweep
from sim_envs import make_env, task_name


def main(cfg: RolloutConfig) -> int:
    dt = cfg.env.dt
    if cfg.delay_steps:
        latencies = [FixedLatency(d * dt) for d in cfg.delay_steps]
    else:
        latencies = [latency_from_config(cfg.latency)]
    env = make_env(cfg.env.name, dt=dt, max_episode_steps=cfg.env.max_episode_steps, **cfg.env.render_kwargs())
    policy = ExpertChunkPolicy(task_name(cfg.env.name), cfg.chunk_size)
    start = time.time()
    cells, skipped = sweep(env, policy, cfg.chunking, list(cfg.strategies), latencies, cfg.episodes, cfg.seed,
                           "rollout cells")
    print(f"\nexpert open-loop chunks on {cfg.env.name} (H={cfg.chunk_size}, "
          f"{cfg.episodes} episodes per cell, {time.time() - start:.0f} s)\n")
    print(cells_markdown(cells))
    for note in skipped:
        print(f"skipped: {note}")
    os.makedirs(cfg.output_dir, exist_ok=True)
    path = os.path.join(cfg.output_dir, "rollout.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"env": cfg.env.name, "cells": cells, "skipped": skipped}, fh, indent=1)
    print(f"wrote {path}")
    return 0
