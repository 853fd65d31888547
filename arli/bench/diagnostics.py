"""``arli bench diagnostics 'runs=[<dir or glob>, ...]' name=<report>``: what finished finetune
runs recorded about their learner and their time, read from each run's ``summary.json`` and
``config.yaml`` (nothing is rerun): per run the learner's last statistics (``keys``, e.g. the AWR
weights' effective sample size), env steps/s, updates/s, wall time and where it went; per group
of runs (``group_by``: task, variant, learner, delay, budget, base) the spread of each key over
its runs -> ``reports/<name>.{json,md,png}``.

A run's wall time is its own speed only when it had the machine to itself: runs that shared the
machine record the slower time they ran at (the report shows each run's torch threads; how
many runs shared the machine is not recorded)."""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from arli.bench.common import figure, machine_info, print_last_line_json, write_report
from arli.bench.runs import control_of, saved_run
from arli.config import BenchDiagnosticsConfig, ConfigError

SPEED_KEYS = ("env_steps_per_s", "updates_per_s", "wall_s")
QUANTILES = (("min", 0.0), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("max", 1.0))


def expand(entries: list[str]) -> list[str]:
    """Run directories named by ``entries`` (a directory, or a glob pattern matching directories
    or their ``summary.json``; ``**`` recurses), sorted, each once. An entry that names no
    finished run is refused, naming it."""
    found: list[str] = []
    for entry in entries:
        if glob.has_magic(entry):
            matches = [os.path.dirname(p) if os.path.basename(p) == "summary.json" else p
                       for p in glob.glob(entry, recursive=True)]
            matches = [m for m in matches if os.path.isfile(os.path.join(m, "summary.json"))]
            if not matches:
                raise ConfigError(f"runs: the pattern {entry!r} matches no run directory (a directory with a "
                                  "summary.json, as `arli finetune` writes)")
            found += matches
        elif os.path.isfile(os.path.join(entry, "summary.json")):
            found.append(entry)
        else:
            raise ConfigError(f"runs: {entry} has no summary.json; pass `arli finetune` output directories of "
                              "finished runs, or a glob pattern such as 'reports/**/summary.json'")
    return sorted({os.path.normpath(d) for d in found})


def budget(run_dir: str, summary: dict) -> int:
    """The run's budget of online env steps (``run.env_steps``; the steps it took when its
    config.yaml is missing: a run stops at the end of the episode that crosses its budget)."""
    run = saved_run(run_dir)
    return int(run.env_steps) if run is not None and run.get("env_steps") is not None else int(summary["env_steps"])


def learner_label(run_dir: str) -> str:
    """The run's learner: its named control (``bc_control``, ``uniform_control``), ``default``
    when every learner setting it saved has today's default value, else the settings that differ
    (Hydra overrides; keys a run saved before they existed are taken as their default)."""
    control = control_of(run_dir)
    if control:
        return control
    run = saved_run(run_dir)
    if run is None:
        return "unknown (no config.yaml)"
    from omegaconf import OmegaConf  # noqa: PLC0415

    from arli.bench.tune import settings_diff  # noqa: PLC0415
    from arli.rl.config import LearnerConfig  # noqa: PLC0415

    default = {"learner": OmegaConf.to_container(OmegaConf.structured(LearnerConfig()))}
    saved = run.get("learner")
    mine = {"learner": OmegaConf.to_container(saved, resolve=True) if saved is not None else {}}
    changed = [o.removeprefix("learner.") for o in settings_diff(default, mine, "learner") if not o.startswith("~")]
    return " ".join(changed) or "default"


def run_row(run_dir: str, keys: list[str]) -> dict:
    """One run's record: its setting, its learner statistics for ``keys`` (None where the run
    did not record one) and its speed and time shares."""
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
        s = json.load(fh)
    run = saved_run(run_dir)
    diag = s.get("learner_diagnostics") or {}
    times = s.get("train_time_s") or {}
    total = sum(times.values())
    return {"run": run_dir, "env": s.get("env"), "variant": s.get("variant"),
            "learner": learner_label(run_dir), "delay_steps": s.get("delay_steps"),
            "budget": budget(run_dir, s), "base": s.get("base_digest"),
            "seed": None if run is None else int(run.seed), "final": s.get("finetuned_success"),
            "diagnostics": {k: (None if diag.get(k) is None else float(diag[k])) for k in keys},
            **{k: s.get(k) for k in SPEED_KEYS}, "torch_threads": s.get("torch_threads"),
            "time_share": {k: v / total for k, v in times.items()} if total > 0 else {}}


def spread(values: list[float]) -> dict:
    """n and the quantiles of ``values`` (linear interpolation); only n when there are none."""
    if not values:
        return {"n": 0}
    v = np.asarray(values, float)
    return {"n": int(v.size), **{name: float(np.quantile(v, q)) for name, q in QUANTILES}}


def group_label(group: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in group.items())


def groups(rows: list[dict], cfg: BenchDiagnosticsConfig) -> list[dict]:
    """Rows grouped by ``cfg.group_by`` (in order of first appearance after sorting by the
    group's values), with each key's and each speed's spread over the group's runs."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(tuple(r[k] for k in cfg.group_by), []).append(r)
    out = []
    for values in sorted(by, key=lambda t: tuple(str(x) for x in t)):
        members = by[values]
        out.append({"group": dict(zip(cfg.group_by, values)), "runs": [r["run"] for r in members],
                    "diagnostics": {k: spread([r["diagnostics"][k] for r in members
                                               if r["diagnostics"][k] is not None]) for k in cfg.keys},
                    **{k: spread([float(r[k]) for r in members if r[k] is not None]) for k in SPEED_KEYS}})
    return out


def command(cfg: BenchDiagnosticsConfig) -> str:
    return (f"arli bench diagnostics 'runs=[{', '.join(cfg.runs)}]' 'keys=[{', '.join(cfg.keys)}]' "
            f"'group_by=[{', '.join(cfg.group_by)}]' name={cfg.name}")


def _num(x, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def markdown(cfg: BenchDiagnosticsConfig, rows: list[dict], grouped: list[dict]) -> list[str]:
    md = [f"# {cfg.name}: learner diagnostics and speed of {len(rows)} finetune runs", "",
          f"`{command(cfg)}` — read from each run's `summary.json` (the learner's statistics at the end of "
          "training) and `config.yaml`; nothing rerun. A wall time is a speed only for a run that had the machine "
          "to itself (how many runs shared it is not recorded).", ""]
    for k in cfg.keys:
        md += [f"## `{k}` per group", "", "| group | runs | recorded | min | p25 | median | p75 | max |",
               "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for g in grouped:
            s = g["diagnostics"][k]
            md.append(f"| {group_label(g['group'])} | {len(g['runs'])} | {s['n']} | "
                      + " | ".join(_num(s.get(q), ".3g") for q, _ in QUANTILES) + " |")
        md.append("")
    md += ["## Speed per group (median over the group's runs)", "",
           "| group | runs | env steps/s | updates/s | wall (min) |", "|---|---:|---:|---:|---:|"]
    for g in grouped:
        md.append(f"| {group_label(g['group'])} | {len(g['runs'])} | {_num(g['env_steps_per_s'].get('median'), '.1f')} | "
                  f"{_num(g['updates_per_s'].get('median'), '.1f')} | "
                  f"{_num(None if g['wall_s']['n'] == 0 else g['wall_s']['median'] / 60, '.1f')} |")
    parts = sorted({p for r in rows for p in r["time_share"]})
    md += ["", "## Runs", "", "| run | task | variant | learner | d | seed | budget | base | "
           + " | ".join(f"`{k}`" for k in cfg.keys) + " | final (test) | env steps/s | updates/s | wall (min) | "
           "threads | " + " | ".join(f"{p} %" for p in parts) + " |",
           "|---|---|---|---|---:|---:|---:|---|" + "---:|" * (len(cfg.keys) + 5 + len(parts))]
    for r in rows:
        md.append(f"| {r['run']} | {r['env']} | {r['variant']} | {r['learner']} | {r['delay_steps']} | "
                  f"{_num(r['seed'], 'd')} | {r['budget']} | {r['base'] or '—'} | "
                  + " | ".join(_num(r["diagnostics"][k], ".3g") for k in cfg.keys)
                  + f" | {_num(r['final'])} | {_num(r['env_steps_per_s'], '.1f')} | {_num(r['updates_per_s'], '.1f')} | "
                  f"{_num(None if r['wall_s'] is None else r['wall_s'] / 60, '.1f')} | {_num(r['torch_threads'], 'd')} | "
                  + " | ".join(_num(None if p not in r["time_share"] else 100 * r["time_share"][p], '.0f')
                               for p in parts) + " |")
    return md


def plot(path: str, cfg: BenchDiagnosticsConfig, grouped: list[dict], rows: list[dict]) -> None:
    """Per group: each run's value of the first key (points) and where the runs' time went
    (mean share per part, stacked)."""
    key = cfg.keys[0]
    by_run = {r["run"]: r for r in rows}
    labels = [group_label(g["group"]) for g in grouped]
    with figure(path, figsize=(12, 0.5 * len(grouped) + 2.5), ncols=2) as (ax_key, ax_time):
        for i, g in enumerate(grouped):
            vals = [by_run[d]["diagnostics"][key] for d in g["runs"] if by_run[d]["diagnostics"][key] is not None]
            ax_key.plot(vals, [i] * len(vals), "o", alpha=0.6, color="tab:blue")
            if vals:
                ax_key.plot([np.median(vals)], [i], "|", ms=18, color="black")
        ax_key.set_yticks(range(len(grouped)), labels, fontsize=7)
        ax_key.set_xlabel(f"{key} (each run; bar: median)")
        ax_key.grid(alpha=0.3)
        parts = sorted({p for r in rows for p in r["time_share"]})
        left = np.zeros(len(grouped))
        for p in parts:
            share = np.array([np.mean([by_run[d]["time_share"].get(p, 0.0) for d in g["runs"]]) for g in grouped])
            ax_time.barh(range(len(grouped)), share, left=left, label=p)
            left += share
        ax_time.set_yticks(range(len(grouped)), [""] * len(grouped))
        ax_time.set_xlabel("share of training time (mean over runs)")
        ax_time.legend(fontsize=7, loc="lower right")


def main(cfg: BenchDiagnosticsConfig) -> int:
    if not cfg.runs:
        raise ConfigError("runs: no runs given; pass 'runs=[<run dir>,...]' or a glob such as "
                          "'runs=[reports/**/summary.json]'")
    rows = [run_row(d, list(cfg.keys)) for d in expand(list(cfg.runs))]
    grouped = groups(rows, cfg)
    payload = {"command": command(cfg), "keys": list(cfg.keys), "group_by": list(cfg.group_by),
               "groups": grouped, "runs": rows, "machine": machine_info()}
    md = markdown(cfg, rows, grouped)
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(os.path.join(cfg.report_dir, f"{cfg.name}.png"), cfg, grouped, rows)
    md += ["", f"![diagnostics]({cfg.name}.png)"]
    write_report(cfg.report_dir, cfg.name, payload, "\n".join(md) + "\n")
    print("\n".join(md[: md.index("## Runs")]))
    print_last_line_json({"groups": [{"group": g["group"], "diagnostics": g["diagnostics"]} for g in grouped]})
    return 0
