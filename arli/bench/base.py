"""``arli bench base``: the pretrained base policy under sync execution and async execution
with naive / blend / rtc switching at several delays (same seeds for every cell)."""

from __future__ import annotations

import os

import numpy as np
from tqdm import tqdm

from arli.bench.common import machine_info, print_last_line_json, write_report
from arli.chunking import ChunkScheduler
from arli.config import BenchBaseConfig
from arli.latency import FixedLatency
from arli.policies.flow import FlowPolicy
from arli.rollout import gripper_hold, run_episode
from sim_envs import make_env


def ensure_checkpoint(cfg: BenchBaseConfig) -> None:
    if not os.path.exists(os.path.join(cfg.checkpoint, "config.json")):
        from arli.commands.pretrain import pretrain  # noqa: PLC0415

        print(f"no base policy at {cfg.checkpoint}: running arli pretrain")
        cfg.pretrain.output_dir = cfg.checkpoint
        cfg.pretrain.env = cfg.env
        pretrain(cfg.pretrain)


def evaluate_cell(policy: FlowPolicy, cfg: BenchBaseConfig, strategy: str, delay: int) -> dict:
    H = policy.chunk_size
    mode = "sync" if strategy == "sync" else "async"
    horizon = cfg.execute_horizon if mode == "sync" else min(max(cfg.execute_horizon, delay), H - delay)
    sched = ChunkScheduler(H, horizon, policy.action_dim, mode, "naive" if mode == "sync" else strategy,
                           delay, cfg.blend_steps, hold=gripper_hold())
    env = make_env(cfg.env.name, dt=cfg.env.dt)
    rng = np.random.default_rng(cfg.seed)
    latency = FixedLatency(delay * cfg.env.dt)
    results = [run_episode(env, policy, sched, latency, rng, cfg.seed + i) for i in range(cfg.episodes)]
    return {"mode": mode, "strategy": strategy if mode == "async" else "none", "delay_steps": delay,
            "execute_horizon": horizon, "success": float(np.mean([r.success for r in results])),
            "episodes": len(results), "mean_steps": float(np.mean([r.steps for r in results]))}


def plot(cells: list[dict], path: str, title: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in ("sync", "naive", "blend", "rtc"):
        pts = [(c["delay_steps"], c["success"]) for c in cells
               if (c["mode"] == "sync" and key == "sync") or (c["mode"] == "async" and c["strategy"] == key)]
        if pts:
            x, y = zip(*sorted(pts))
            ax.plot(x, y, marker="o", label=key if key == "sync" else f"async {key}")
    ax.set_xlabel("delay_steps d (dt = 50 ms)")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(cfg: BenchBaseConfig) -> int:
    ensure_checkpoint(cfg)
    policy = FlowPolicy.load(cfg.checkpoint)
    grid = [(s, d) for d in cfg.delay_steps for s in cfg.strategies
            if s == "sync" or 2 * d <= policy.chunk_size]
    skipped = [(s, d) for d in cfg.delay_steps for s in cfg.strategies if (s, d) not in grid]
    cells = []
    for strategy, delay in tqdm(grid, desc="bench base", unit="cell"):
        cells.append(evaluate_cell(policy, cfg, strategy, delay))
        c = cells[-1]
        tqdm.write(f"{c['mode']:>5} {c['strategy']:>6} d={delay}: success {c['success']:.2f}")
    payload = {"env": cfg.env.name, "cells": cells}
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(cells, os.path.join(cfg.report_dir, "base.png"),
         f"base flow policy on {cfg.env.name} ({cfg.episodes} episodes/cell)")
    rows = "\n".join(
        f"| {c['mode']} | {c['strategy']} | {c['delay_steps']} | {c['execute_horizon']} | "
        f"{c['success']:.2f} | {c['mean_steps']:.0f} |" for c in cells)
    md = (
        f"# Base policy under inference latency — `{cfg.env.name}`\n\n"
        f"Command: `arli bench base env={cfg.env.name} episodes={cfg.episodes}`\n\n"
        f"Policy: built-in pi0-style flow policy `{cfg.checkpoint}` (H = {policy.chunk_size}, "
        f"{policy.cfg.num_steps} Euler steps, RTC mode `{policy.cfg.rtc_mode}`, "
        f"beta = {policy.cfg.rtc_max_weight}). Same evaluation seeds in every cell "
        f"({cfg.seed} ..), {cfg.episodes} episodes per cell; latency simulated in sim time.\n\n"
        "| mode | strategy | delay_steps | execute_horizon | success | mean steps |\n"
        "|---|---|---:|---:|---:|---:|\n" + rows + "\n\n![success vs delay](base.png)\n\n"
        + (f"Skipped (need chunk_size >= 2 d): {skipped}\n\n" if skipped else "")
        + f"Machine: {machine_info()}\n"
    )
    write_report(cfg.report_dir, "base", payload, md)
    print(md)
    print_last_line_json(payload)
    return 0
