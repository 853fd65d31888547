"""``arli bench base``: the pretrained base policy under sync execution and async execution
with naive / blend / rtc switching at several delays (same seeds for every cell)."""

from __future__ import annotations

import os

from arli.bench.common import machine_info, print_last_line_json, success_plot, write_report
from arli.commands.pretrain import ensure_base_policy
from arli.config import BenchBaseConfig
from arli.latency import FixedLatency
from arli.policies.load import load_base_policy
from arli.rollout import cells_markdown, sweep
from sim_envs import make_env


def reading(cells: list[dict]) -> str:
    """What the numbers say, computed from them (not written by hand)."""
    by = {(c["mode"], c["strategy"], c["delay_steps"]): c["success"] for c in cells}
    zero = by.get(("sync", "none", 0))
    lines = ["## Reading\n"]
    if zero is not None:
        band = "inside" if 0.5 <= zero <= 0.85 else "outside"
        lines.append(f"* Zero-delay success {zero:.2f} ({band} the 50-85% band that leaves room for RL).")
    for d in sorted({c["delay_steps"] for c in cells if c["delay_steps"] > 0}):
        sync = by.get(("sync", "none", d))
        best = max(((s, by[("async", s, d)]) for s in ("naive", "blend", "rtc")
                    if ("async", s, d) in by), key=lambda x: x[1], default=None)
        if sync is not None and best is not None:
            lines.append(f"* d = {d}: sync {sync:.2f} (pauses, {d} steps per chunk) vs best async "
                         f"`{best[0]}` {best[1]:.2f}.")
    return "\n".join(lines) + "\n\n"


def describe(policy) -> str:
    cfg = getattr(policy, "cfg", None)
    if cfg is None:
        return f"scripted expert's open-loop chunks, H = {policy.chunk_size}"
    if getattr(cfg, "rtc_mode", None) is not None:
        return (f"built-in pi0-style flow policy, H = {policy.chunk_size}, {cfg.num_steps} Euler "
                f"steps, RTC mode `{cfg.rtc_mode}`, beta = {cfg.rtc_max_weight}")
    return f"LeRobot `{cfg.type}` policy, H = {policy.chunk_size}"


def plot(cells: list[dict], path: str, title: str) -> None:
    with success_plot(path, title, "delay_steps d (dt = 50 ms)") as ax:
        for key in ("sync", "naive", "blend", "rtc"):
            pts = [(c["delay_steps"], c["success"]) for c in cells
                   if (c["mode"] == "sync" and key == "sync") or (c["mode"] == "async" and c["strategy"] == key)]
            if pts:
                x, y = zip(*sorted(pts))
                ax.plot(x, y, marker="o", label=key if key == "sync" else f"async {key}")


def main(cfg: BenchBaseConfig) -> int:
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    env = make_env(cfg.env.name, dt=cfg.env.dt)
    policy = load_base_policy(cfg.checkpoint, env.unwrapped.instruction, cfg.env.name,
                              cfg.pretrain.policy.chunk_size)
    latencies = [FixedLatency(d * cfg.env.dt) for d in cfg.delay_steps]
    cells, skipped = sweep(env, policy, list(cfg.strategies), latencies, cfg.episodes, cfg.seed,
                           cfg.execute_horizon, cfg.blend_steps, "bench base")
    payload = {"env": cfg.env.name, "cells": cells}
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(cells, os.path.join(cfg.report_dir, "base.png"),
         f"base flow policy on {cfg.env.name} ({cfg.episodes} episodes/cell)")
    md = (
        f"# Base policy under inference latency — `{cfg.env.name}`\n\n"
        f"Command: `arli bench base env={cfg.env.name} episodes={cfg.episodes}`\n\n"
        f"Policy: `{cfg.checkpoint}` ({describe(policy)}). Same evaluation seeds in every cell "
        f"({cfg.seed} ..), {cfg.episodes} episodes per cell; latency simulated in sim time.\n\n"
        + cells_markdown(cells) + "\n![success vs delay](base.png)\n\n"
        + reading(cells) + (f"Skipped: {skipped}\n\n" if skipped else "")
        + f"Machine: {machine_info()}\n"
    )
    write_report(cfg.report_dir, "base", payload, md)
    print(md)
    print_last_line_json(payload)
    return 0
