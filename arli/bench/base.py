"""``arli bench base``: the pretrained base policy under sync execution and async execution
with naive / blend / rtc switching at several delays (same seeds for every cell)."""

from __future__ import annotations

import os

from arli.bench.common import machine_info, print_last_line_json, success_plot, write_report
from arli.pretrain import ensure_base_policy
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


def trace_table(env_name: str, env, policy, delays: list[int], episodes: int, seed: int,
                chunking) -> tuple[list[dict], str]:
    """Traced async-naive episodes per delay (see ``arli.bench.trace``) and their reading."""
    from arli.bench.trace import object_height_index, summarize, trace_episodes  # noqa: PLC0415
    from sim_envs.experts import EXPERTS  # noqa: PLC0415

    if env_name not in EXPERTS:
        return [], ""
    rows = []
    for d in delays:
        tracer = trace_episodes(env, policy, EXPERTS[env_name], d, episodes, seed, chunking,
                                object_height_index(env))
        rows.append({"delay_steps": d, **summarize(tracer)})
    md = ["## Why it fails: traced episodes (async naive)\n",
          f"{episodes} episodes per delay. *expert gap*: max-over-dims |executed - expert action in the same "
          "state|; *jump*: max |change of the hand command| between consecutive steps, at chunk switches and "
          "inside chunks; *obs age*: steps since the executing chunk's observation; *hand moved*: how far the "
          "hand travelled since that observation; *never grasped*: failed episodes whose object never rose 1 cm.\n",
          "| d | success | expert gap | jump at switch | jump inside | obs age | hand moved (mm) | failed: never grasped |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        never = r.get("failed_never_grasped")
        md.append(f"| {r['delay_steps']} | {r['success']:.2f} | {r['expert_gap']:.2f} | {r['switch_jump']:.2f} | "
                  f"{r['inner_jump']:.2f} | {r['obs_age']:.1f} | {r['hand_moved_mm']:.1f} | "
                  + ("—" if never is None else f"{never:.2f}") + " |")
    zero, worst = rows[0], rows[-1]
    md.append("")
    md.append(f"* From d = {zero['delay_steps']} to d = {worst['delay_steps']}: the executing chunk's observation "
              f"is {worst['obs_age'] - zero['obs_age']:+.1f} steps older and the hand has moved "
              f"{worst['hand_moved_mm'] - zero['hand_moved_mm']:+.1f} mm more since it was taken; the executed "
              f"action departs from the expert's by {worst['expert_gap']:.2f} (vs {zero['expert_gap']:.2f}); the "
              f"command jumps {worst['switch_jump']:.2f} at switches (vs {worst['inner_jump']:.2f} inside chunks).")
    if worst.get("failed_never_grasped") is not None:
        md.append(f"* At d = {worst['delay_steps']}, {worst['failed_never_grasped']:.0%} of the failed episodes never "
                  "grasped the object; the rest grasped it and failed to place it (the precision phase).")
    return rows, "\n".join(md) + "\n\n"


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
                              cfg.pretrain.policy.chunk_size, state_dim=env.observation_space["state"].shape[0])
    latencies = [FixedLatency(d * cfg.env.dt) for d in cfg.delay_steps]
    cells, skipped = sweep(env, policy, cfg.chunking, list(cfg.strategies), latencies, cfg.episodes, cfg.seed,
                           "bench base")
    traces, trace_md = trace_table(cfg.env.name, env, policy, sorted({0, *cfg.delay_steps}),
                                   cfg.trace_episodes, cfg.seed, cfg.chunking) if cfg.trace_episodes else ([], "")
    payload = {"env": cfg.env.name, "cells": cells, "traces": traces}
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(cells, os.path.join(cfg.report_dir, f"base_{cfg.env.name}.png"),
         f"base flow policy on {cfg.env.name} ({cfg.episodes} episodes/cell)")
    md = (
        f"# Base policy under inference latency — `{cfg.env.name}`\n\n"
        f"Command: `arli bench base env={cfg.env.name} episodes={cfg.episodes} "
        f"'strategies=[{','.join(cfg.strategies)}]' 'delay_steps={list(cfg.delay_steps)}' "
        f"trace_episodes={cfg.trace_episodes}`\n\n"
        f"Policy: `{cfg.checkpoint}` ({describe(policy)}). Same evaluation seeds in every cell "
        f"({cfg.seed} ..), {cfg.episodes} episodes per cell; latency simulated in sim time.\n\n"
        + cells_markdown(cells) + f"\n![success vs delay](base_{cfg.env.name}.png)\n\n"
        + reading(cells) + trace_md + (f"Skipped: {skipped}\n\n" if skipped else "")
        + f"Machine: {machine_info()}\n"
    )
    write_report(cfg.report_dir, f"base_{cfg.env.name}", payload, md)
    print(md)
    print_last_line_json(payload)
    return 0
