"""``arli bench pipeline``: the multi-process sim run (``arli launch sim``: inference server,
learner, 2 actors, real wall-clock latency) against the in-process run (``arli finetune``,
latency in sim time) with the same config and budget. Both are evaluated by the same
in-process evaluator on the same test seeds at d = 4. Writes reports/pipeline.{md,json,png}
with a histogram of the latencies the actors measured.

``report_only=true`` rebuilds the report from ``output_dir`` without running anything.
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np

from arli.bench.common import figure, machine_info, publish
from arli.config import BenchPipelineConfig, LaunchConfig


def _run(argv: list[str], log: str) -> None:
    with open(log, "w", encoding="utf-8") as fh:
        rc = subprocess.call([sys.executable, "-m", "arli.cli", *argv], stdout=fh, stderr=subprocess.STDOUT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    if rc != 0:
        raise RuntimeError(f"`arli {' '.join(argv)}` failed (exit {rc}); see {log}")


def plot(latencies_ms: dict[str, np.ndarray], dt_ms: float, path: str) -> None:
    with figure(path, (7, 3.8)) as ax:
        for name, values in latencies_ms.items():
            ax.hist(values, bins=60, alpha=0.6, label=f"{name} ({len(values)} requests)")
        for k in range(3, 6):
            ax.axvline(k * dt_ms, color="gray", ls=":", lw=1)
        ax.set_xlabel("measured chunk latency: capture of o_t0 -> reply on the robot (ms); dotted: control ticks")
        ax.set_ylabel("requests")
        ax.set_yscale("log")
        ax.legend()
        ax.grid(alpha=0.3)


def main(cfg: BenchPipelineConfig) -> int:
    out = cfg.output_dir
    inproc, launch = os.path.join(out, "inprocess"), os.path.join(out, "launch")
    if not cfg.report_only:
        os.makedirs(out, exist_ok=True)
        # the delay the launched actors see: the server pads replies to LaunchConfig.min_latency_s
        d = int(math.ceil(LaunchConfig.min_latency_s / cfg.env.dt - 1e-9))
        print(f"in-process run: arli finetune run.env_steps={cfg.env_steps} delay_steps={d} "
              f"(log {out}/inprocess.log)", flush=True)
        _run(["finetune", f"env={cfg.env.name}", f"run.env_steps={cfg.env_steps}", f"delay_steps={d}",
              f"output_dir={inproc}"], os.path.join(out, "inprocess.log"))
        print(f"multi-process run: arli launch sim actors={cfg.actors} (logs in {launch}/)", flush=True)
        _run(["launch", "sim", f"env={cfg.env.name}", f"actors={cfg.actors}", f"env_steps={cfg.env_steps}",
              f"output_dir={launch}"], os.path.join(out, "launch.log"))
    a = json.load(open(os.path.join(inproc, "summary.json"), encoding="utf-8"))
    b = json.load(open(os.path.join(launch, "learner", "summary.json"), encoding="utf-8"))
    n = a["eval"]["episodes"]
    # what RL trained on both sides: the in-process run's end guard may deploy its start instead,
    # and the learner service has no such end
    pa, pb = a.get("trained_success", a["finetuned_success"]), b["finetuned_success"]
    se = math.sqrt(max(pa * (1 - pa), 1e-9) / n + max(pb * (1 - pb), 1e-9) / b["eval"]["episodes"])
    within = abs(pa - pb) <= 2 * se
    actors = sorted(glob.glob(os.path.join(launch, "actor*", "stats.json")))
    stats = [json.load(open(p, encoding="utf-8")) for p in actors]
    lat = {s["actor_id"]: np.asarray(json.load(open(os.path.join(os.path.dirname(p), "latency_trace.json"),
                                                    encoding="utf-8"))) * 1000 for s, p in zip(stats, actors)}
    all_lat = np.concatenate(list(lat.values()))
    dt_ms = 50.0
    delays = np.ceil(all_lat / dt_ms - 1e-9).astype(int)
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(lat, dt_ms, os.path.join(cfg.report_dir, "pipeline.png"))
    train = {s["actor_id"]: {"episodes": s["episodes"], "success": s["successes"] / max(s["episodes"], 1),
                             "spikes": s["spikes"], "residual_p99_ms": s["residual_p99_ms"]} for s in stats}
    payload = {"env": a["env"], "env_steps": cfg.env_steps, "inprocess_success": pa, "pipeline_success": pb,
               "difference": pb - pa, "two_se": 2 * se, "within_noise": within,
               "base_success": a["base_success"], "anchor_only_success": a.get("anchor_only_success"),
               "latency_ms": {"p50": float(np.percentile(all_lat, 50)), "p90": float(np.percentile(all_lat, 90)),
                              "p99": float(np.percentile(all_lat, 99)), "max": float(all_lat.max())},
               "delay_steps_share": {int(d): float(np.mean(delays == d)) for d in np.unique(delays)},
               "actors": train, "pipeline_env_steps": b["env_steps"], "pipeline_updates": b["updates"],
               "inprocess_updates": a["updates"], "machine": machine_info()}
    md = [f"# Pipeline: multi-process sim run vs in-process run ({a['env']}, d = 4)", "",
          f"`arli bench pipeline env_steps={cfg.env_steps}` — the same finetuning config and budget, run as "
          f"(1) `arli finetune` in one process with latency in sim time and (2) `arli launch sim actors={cfg.actors}`: "
          "inference server, learner service and two sim actors as separate processes talking ZeroMQ on loopback, "
          "the actors on a 20 Hz wall clock, the server padding replies to 160 ms (d = 4 at 50 ms per step) so "
          "the real latency matches the in-process delay. Both final residuals are evaluated the same way "
          f"(in-process evaluator, the same {n} seeds, async naive, d = 4).", "",
          "| run | env steps | updates | final success |", "|---|---:|---:|---:|",
          f"| base policy alone | | | {a['base_success']:.2f} |",
          f"| anchor-pretrained residual (0 online steps) | | | {a.get('anchor_only_success') or 0:.2f} |",
          f"| in-process (`arli finetune`) | {a['env_steps']} | {a['updates']} | {pa:.2f} |",
          f"| multi-process (`arli launch sim`, 2 actors, 1 learner) | {b['env_steps']} | {b['updates']} | {pb:.2f} |",
          "", f"Difference {pb - pa:+.2f}; two standard errors of the difference: {2 * se:.2f} -> "
          f"**{'within noise' if within else 'NOT within noise'}**.", "",
          "Measured latency on the robot side (capture of o_t0 -> reply received, every request of both actors): "
          f"p50 {payload['latency_ms']['p50']:.1f} ms, p90 {payload['latency_ms']['p90']:.1f}, "
          f"p99 {payload['latency_ms']['p99']:.1f}, max {payload['latency_ms']['max']:.1f}. Delay in control steps: "
          + ", ".join(f"d={d}: {s:.1%}" for d, s in payload["delay_steps_share"].items())
          + " (a d = 5 reply is a spike beyond the planned 4: held through, counted).", "",
          "![latency histogram](pipeline.png)", "",
          "| actor | training episodes | training success (with exploration) | spikes | residual step p99 (ms) |",
          "|---|---:|---:|---:|---:|"]
    md += [f"| {k} | {v['episodes']} | {v['success']:.2f} | {v['spikes']} | {v['residual_p99_ms']:.2f} |"
           for k, v in train.items()]
    md += ["", "Residual step p99 here is with 4 processes sharing 2 cores (`arli bench runtime` measures it on a "
           "quiet machine).", "", f"Machine: {machine_info()}", ""]
    summary = {k: payload[k] for k in ("inprocess_success", "pipeline_success", "within_noise")}
    return publish(cfg.report_dir, "pipeline", payload, md, slice(4, 10), summary if cfg.json else None)
