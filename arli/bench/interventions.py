"""``arli bench interventions``: does the intervention rate fall as the residual learns?

Runs ``arli finetune run.regime=hil`` (the online intervener is the scripted operator behind
the device interface, ``robot_drivers.teleop.ScriptedOperator``: it takes over when the
robot's action strays from its own, drives a short segment, hands back) unless
``report_only``; then plots the share of control steps the intervener drove, per window of
training episodes, against online env steps, with the evaluation success of the residual
alone (no intervener) → reports/interventions.{md,json,png}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from arli.bench.common import machine_info, publish, success_plot
from arli.config import BenchInterventionsConfig


def windows(episodes: list[dict], size: int) -> list[dict]:
    """Consecutive windows of ``size`` episodes: env steps at the end, intervention rate."""
    out = []
    for i in range(0, len(episodes) - size + 1, size):
        w = episodes[i:i + size]
        steps = sum(e["steps"] for e in w)
        out.append({"env_steps": w[-1]["env_steps"], "intervention_rate": sum(e["intervened"] for e in w) / steps,
                    "assisted_share": float(np.mean([e["intervened"] > 0 for e in w])),
                    "success": float(np.mean([e["success"] for e in w]))})
    return out


def plot(win: list[dict], history: list[dict], path: str, title: str) -> None:
    with success_plot(path, title, "online environment steps", "rate or share", (7, 4), legend_size=8) as ax:
        ax.plot([w["env_steps"] for w in win], [w["intervention_rate"] for w in win], marker=".",
                label="intervention rate (share of steps the operator drove)")
        ax.plot([w["env_steps"] for w in win], [w["assisted_share"] for w in win], ls="--", alpha=0.7,
                label="episodes with an intervention")
        ax.plot([h["env_steps"] for h in history], [h["success"] for h in history], marker="o",
                label="eval success, residual alone")


def main(cfg: BenchInterventionsConfig) -> int:
    run = cfg.run_dir
    if not cfg.report_only:
        os.makedirs(run, exist_ok=True)
        argv = [sys.executable, "-m", "arli.cli", "finetune", f"env={cfg.env.name}", "run.regime=hil",
                f"run.env_steps={cfg.env_steps}", f"output_dir={run}", *cfg.overrides]
        print("running", " ".join(argv[3:]), f"(log {run}.log)", flush=True)
        with open(f"{run}.log", "w", encoding="utf-8") as fh:
            if subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT) != 0:
                raise RuntimeError(f"the hil run failed; see {run}.log")
    summary = json.load(open(os.path.join(run, "summary.json"), encoding="utf-8"))
    win = windows(summary["episodes"], cfg.window)
    if len(win) < 2:
        raise ValueError(f"only {len(summary['episodes'])} training episodes: too few for windows of {cfg.window}")
    first, last = win[0], win[-1]
    # Trend over thirds of the run, not two noisy windows: it falls when the last third's
    # mean rate is at least 25% below the first third's.
    third = max(1, len(win) // 3)
    early = float(np.mean([w["intervention_rate"] for w in win[:third]]))
    late = float(np.mean([w["intervention_rate"] for w in win[-third:]]))
    falling = late <= 0.75 * early
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(win, summary["history"], os.path.join(cfg.report_dir, "interventions.png"),
         f"hil on {summary['env']}, d={summary['delay_steps']}: interventions vs learning")
    payload = {"env": summary["env"], "delay_steps": summary["delay_steps"], "env_steps": summary["env_steps"],
               "window_episodes": cfg.window, "first_window": first, "last_window": last,
               "intervention_rate_falls": falling, "first_third_rate": early, "last_third_rate": late, "intervention_share_overall": summary["intervention_share"],
               "takeovers": summary["takeovers"], "base_success": summary["base_success"],
               "anchor_only_success": summary["anchor_only_success"],
               "finetuned_success": summary["finetuned_success"], "windows": win, "machine": machine_info()}
    md = [f"# Interventions fall as the residual learns ({summary['env']}, d = {summary['delay_steps']})", "",
          f"`arli bench interventions` — `arli finetune run.regime=hil run.env_steps={cfg.env_steps}`: the intervener is "
          "the scripted operator behind the device interface (`robot_drivers/teleop/scripted.py`; a SpaceMouse, "
          "gamepad or keyboard plugs in at the same place). It watches every training episode, takes over after "
          "3 steps of the robot's motion (dx, dy, dz, dyaw; not the gripper's timing) differing from its own by more "
          "than 0.6, drives 15 steps and hands back. "
          f"Windows of {cfg.window} training episodes.", "",
          "| | env steps | intervention rate | episodes with an intervention | training success (assisted) |",
          "|---|---:|---:|---:|---:|",
          f"| first window | {first['env_steps']} | {first['intervention_rate']:.2f} | {first['assisted_share']:.2f} | "
          f"{first['success']:.2f} |",
          f"| last window | {last['env_steps']} | {last['intervention_rate']:.2f} | {last['assisted_share']:.2f} | "
          f"{last['success']:.2f} |", "",
          f"Intervention rate, mean of the first third of windows -> the last third: {early:.3f} -> {late:.3f} "
          f"of control steps ({'falls' if falling else 'does NOT fall'} by the criterion: >= 25% lower; every window: "
          + ", ".join(f"{w['intervention_rate']:.2f}" for w in win) + f"). Overall {summary['intervention_share']:.2f}, "
          f"{summary['takeovers']} takeovers.", "",
          f"Evaluation of the residual alone (no intervener, the same test seeds): base {summary['base_success']:.2f}, "
          f"anchor-pretrained start {summary['anchor_only_success']:.2f}, after the hil run "
          f"{summary['finetuned_success']:.2f}.", "", "![interventions](interventions.png)", "",
          "| env steps | intervention rate | assisted episodes | training success |", "|---:|---:|---:|---:|"]
    md += [f"| {w['env_steps']} | {w['intervention_rate']:.3f} | {w['assisted_share']:.2f} | {w['success']:.2f} |"
           for w in win]
    md += ["", f"Machine: {machine_info()}", ""]
    summary = {"first_third_rate": early, "last_third_rate": late, "falls": falling}
    return publish(cfg.report_dir, "interventions", payload, md, slice(4, 10), summary if cfg.json else None)
