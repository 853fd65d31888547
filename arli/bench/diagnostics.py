"""``arli bench diagnostics 'runs=[<dir or glob>, ...]' name=<report>``: what finished finetune
runs recorded about their learner and their time, read from each run's ``summary.json`` and
``config.yaml`` (nothing is rerun): per run the learner's last statistics (``keys``, e.g. the AWR
weights' effective sample size), env steps/s, updates/s, wall time and the shares of its
training time; per group of runs (``group_by``: ``env``, ``variant``, ``learner``,
``delay_steps``, ``budget``, ``base``) the spread of each key over its runs ->
``reports/<name>.{json,md,png}``. ``curves=true``: also each run's tune curve, the critic's mean
Q on the evaluated steps against their discounted Monte-Carlo return at each point (how far the
critic is off about what the policy does, along training) and value gating's choices there.

A run's wall time is its own speed only when it had the machine to itself: runs that shared the
machine record the slower time they ran at (the report shows each run's torch threads and the
machine's 15-minute load average at the run's end, where the run recorded it)."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict

import numpy as np

from arli.bench.common import figure, machine_info, print_last_line_json, write_report
from arli.bench.runs import control_of, saved_run
from arli.bench.tune import flatten, hydra_value
from arli.config import BenchDiagnosticsConfig, ConfigError

SPEED_KEYS = ("env_steps_per_s", "updates_per_s", "wall_s")
QUANTILES = (("min", 0.0), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("max", 1.0))
# the settings that make each control (``arli.bench.latency_sweep.control_settings``: its own, and
# the critic's influence on the acting and the update off)
CONTROL_KEYS = {"uniform_control": ("awr_weights", "actor_update", "gate_candidates"),
                "bc_control": ("q_weight", "actor_update", "gate_candidates")}


def _run_dir(path: str) -> str | None:
    """The run directory ``path`` names (itself, or the directory of its summary.json), or None
    when it is not a finished run."""
    if os.path.basename(path) == "summary.json":
        path = os.path.dirname(path) or "."
    return path if os.path.isfile(os.path.join(path, "summary.json")) else None


def expand(entries: list[str]) -> list[str]:
    """Run directories named by ``entries`` (a directory or its ``summary.json``, or a glob
    pattern matching either; ``**`` recurses), sorted, each run once however it was spelled.
    An entry that names no finished run is refused, naming it."""
    found: dict[str, str] = {}
    for entry in entries:
        if glob.has_magic(entry):
            matches = [d for d in map(_run_dir, glob.glob(entry, recursive=True)) if d]
            if not matches:
                raise ConfigError(f"runs: the pattern {entry!r} matches no run directory (a directory with a "
                                  "summary.json, as `arli finetune` writes)")
        elif (run := _run_dir(entry)) is not None:
            matches = [run]
        else:
            raise ConfigError(f"runs: {entry} has no summary.json; pass `arli finetune` output directories of "
                              "finished runs, or a glob pattern such as 'reports/**/summary.json'")
        for d in matches:
            found.setdefault(os.path.realpath(d), os.path.normpath(d))
    return sorted(found.values())


def learner_label(run_dir: str) -> str:
    """The run's learner: ``default`` when it ran with today's default learner settings, else
    the settings that differ (Hydra values), led by the named control it is (``bc_control``,
    ``uniform_control``). A key a run saved before it existed counts as what such runs ran with
    (``arli.runs.BEFORE_THEY_EXISTED``), not as today's default."""
    from arli.rl.config import LearnerConfig  # noqa: PLC0415
    from arli.runs import load_run_config  # noqa: PLC0415

    if not os.path.exists(os.path.join(run_dir, "config.yaml")):
        return "unknown (no config.yaml)"
    try:
        learner = load_run_config(run_dir).run.learner
    except ConfigError:
        return "unknown (its config.yaml does not fit this ARLI)"
    default, mine = flatten(asdict(LearnerConfig())), flatten(asdict(learner))
    control = control_of(run_dir)
    changed = [f"{k}={hydra_value(v)}" for k, v in mine.items()
               if default.get(k) != v and k not in CONTROL_KEYS.get(control or "", ())]
    return " ".join(([control] if control else []) + changed) or "default"


def _load_summary(run_dir: str) -> dict:
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path, encoding="utf-8") as fh:
            summary = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"runs: {path} is not readable JSON ({exc}); pass finished `arli finetune` runs") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"runs: {path} holds no summary object; pass finished `arli finetune` runs")
    return summary


def run_row(run_dir: str, s: dict, keys: list[str]) -> dict:
    """One run's record: every field of ``arli.config.DIAGNOSTICS_GROUP_FIELDS``, its learner statistics
    for ``keys`` (None where the run did not record one), its speed and the shares of its
    training time (``train_time_s``; empty when not recorded), from its summary ``s``."""
    run = saved_run(run_dir)
    diag = s.get("learner_diagnostics") or {}
    times = {k: float(v) for k, v in (s.get("train_time_s") or {}).items()}
    total = sum(times.values())
    return {"run": run_dir, "env": s.get("env"), "variant": s.get("variant"), "learner": learner_label(run_dir),
            "delay_steps": s.get("delay_steps"), "base": s.get("base_digest"),
            "budget": None if run is None or run.get("env_steps") is None else int(run.env_steps),
            "seed": None if run is None else int(run.seed), "final": s.get("finetuned_success"),
            "diagnostics": {k: (None if diag.get(k) is None else float(diag[k])) for k in keys},
            **{k: s.get(k) for k in SPEED_KEYS}, "torch_threads": s.get("torch_threads"),
            # the machine's 15-minute load at the run's end (runs before it was recorded: None)
            "load_15m": ((s.get("machine") or {}).get("load_avg") or [None] * 3)[2],
            "time_share": {k: v / total for k, v in times.items()} if total > 0 else {}}


def curve(s: dict) -> list[dict]:
    """A run's tune curve from its summary ``s``: per point env steps, updates, success, the
    critic's mean Q on the evaluated steps (``q_eval``), their discounted return (``return_eval``),
    ``bias`` = q_eval - return_eval, and the gate's choices (None where the run did not record them)."""
    out = []
    for h in s.get("history") or []:
        q, g = h.get("q_eval"), h.get("return_eval")
        ok = q is not None and g is not None and np.isfinite(q) and np.isfinite(g)
        out.append({"env_steps": h.get("env_steps"), "updates": h.get("updates"), "success": h.get("success"),
                    "q_eval": q if ok else None, "return_eval": g if ok else None,
                    "bias": q - g if ok else None, "gate_picks": h.get("gate_picks")})
    return out


def curve_markdown(rows: list[dict]) -> list[str]:
    """Per run, its tune curve: success, the critic's Q against the return, the gate's choices."""
    md = ["## The critic against the return along each run's tune curve", "",
          "At each curve point (the tune episodes the run evaluated there): success, the critic's mean Q(s_t, a_t) "
          "over the evaluated steps against the discounted Monte-Carlo return from each step (bias = Q − return: "
          "above 0 the critic values what the policy does above what it gets), and where the run counted them, the "
          "share of gated steps on which value gating chose π(s) / the base / a perturbation.", ""]
    for r in rows:
        md += [f"**{r['run']}** ({r['variant']}, d = {_num(r['delay_steps'], 'd')}, seed {_num(r['seed'], 'd')}, "
               f"{r['learner']})", "", "| env steps | updates | success | Q | return | bias | gate π / base / perturbed |",
               "|---:|---:|---:|---:|---:|---:|---|"]
        for p in r["curve"]:
            picks = p["gate_picks"]
            total = sum(picks.values()) if picks else 0
            gate = " / ".join(f"{v / total:.2f}" for v in picks.values()) if total else "—"
            md.append(f"| {_num(p['env_steps'], 'd')} | {_num(p['updates'], 'd')} | {_num(p['success'], '.2f')} | "
                      f"{_num(p['q_eval'])} | {_num(p['return_eval'])} | {_num(p['bias'], '+.3f')} | {gate} |")
        md.append("")
    return md


def plot_curves(path: str, rows: list[dict]) -> None:
    """Per run, success and the critic's bias (Q - return on the evaluated steps) against env steps."""
    with figure(path, figsize=(11, 4), ncols=2) as (ax_s, ax_b):
        for i, r in enumerate(rows):
            pts = r["curve"]
            style = {"color": f"C{i % 10}", "ls": ("-", "--", ":")[i // 10 % 3], "marker": "o", "ms": 3}
            ax_s.plot([p["env_steps"] for p in pts], [p["success"] for p in pts], **style,
                      label=f"{os.path.basename(r['run'])} (d={r['delay_steps']})")
            biased = [p for p in pts if p["bias"] is not None]
            ax_b.plot([p["env_steps"] for p in biased], [p["bias"] for p in biased], **style)
        ax_s.set_ylabel("success (tune episodes)")
        ax_s.set_ylim(-0.02, 1.02)
        ax_b.axhline(0.0, color="black", lw=0.8)
        ax_b.set_ylabel("critic bias: mean Q - discounted return")
        for ax in (ax_s, ax_b):
            ax.set_xlabel("env steps")
            ax.grid(alpha=0.3)
        if len(rows) <= 20:
            ax_s.legend(fontsize=6)


def spread(values: list[float]) -> dict:
    """n and the quantiles of ``values`` (linear interpolation); only n when there are none."""
    if not values:
        return {"n": 0}
    v = np.asarray(values, float)
    return {"n": int(v.size), **{name: float(np.quantile(v, q)) for name, q in QUANTILES}}


def _order(values: tuple) -> tuple:
    """Sort key of a group: numbers by value, then text, then missing values."""
    return tuple((0, x, "") if isinstance(x, (int, float)) else (2, 0, "") if x is None else (1, 0, str(x))
                 for x in values)


def groups(rows: list[dict], group_by: list[str], keys: list[str]) -> list[dict]:
    """Rows grouped by ``group_by`` (sorted: numbers by value), each numbered ``G1``.. in that
    order, with each key's and each speed's spread over the group's runs."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(tuple(r[k] for k in group_by), []).append(r)
    out = []
    for i, values in enumerate(sorted(by, key=_order), 1):
        members = by[values]
        out.append({"id": f"G{i}", "group": dict(zip(group_by, values)), "runs": [r["run"] for r in members],
                    "diagnostics": {k: spread([r["diagnostics"][k] for r in members
                                               if r["diagnostics"][k] is not None]) for k in keys},
                    **{k: spread([float(r[k]) for r in members if r[k] is not None]) for k in SPEED_KEYS},
                    "time_share": {p: spread([r["time_share"][p] for r in members if p in r["time_share"]])
                                   for p in sorted({p for r in members for p in r["time_share"]})}})
    return out


def group_label(group: dict) -> str:
    """A group's fields as ``field=value`` pairs."""
    return ", ".join(f"{k}={v}" for k, v in group.items())


def command(cfg: BenchDiagnosticsConfig) -> str:
    """The command line that writes this report."""
    return (f"arli bench diagnostics 'runs=[{', '.join(cfg.runs)}]' 'keys=[{', '.join(cfg.keys)}]' "
            f"'group_by=[{', '.join(cfg.group_by)}]' {'curves=true ' if cfg.curves else ''}name={cfg.name}")


def _num(x: float | int | None, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def markdown(cfg: BenchDiagnosticsConfig, rows: list[dict], grouped: list[dict]) -> list[str]:
    """The report: each key's spread per group, each group's median speed, then every run."""
    md = [f"# {cfg.name}: learner diagnostics and speed of {len(rows)} finetune runs", "",
          f"`{command(cfg)}` — read from each run's `summary.json` (the learner's statistics at the end of "
          "training) and `config.yaml`; nothing rerun. `learner`: `default` (today's default learner settings), "
          "a named control, or the settings that differ from today's default. A wall time is a speed only for a "
          "run that had the machine to itself: `load (15 min)` is the machine's load average at the run's end (`—` for "
          "runs that did not record it: how many runs shared the machine is then unknown).", ""]
    for k in cfg.keys:
        md += [f"## `{k}` per group", "", "| | group | runs | recorded | min | p25 | median | p75 | max |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for g in grouped:
            s = g["diagnostics"][k]
            md.append(f"| {g['id']} | {group_label(g['group'])} | {len(g['runs'])} | {s['n']} | "
                      + " | ".join(_num(s.get(q), ".3g") for q, _ in QUANTILES) + " |")
        md.append("")
    parts = sorted({p for r in rows for p in r["time_share"]})
    md += ["## Speed per group (median over the group's runs that recorded it; time columns: shares of "
           "training time, %)", "", "| | group | runs | env steps/s | updates/s | wall (min) | "
           + " | ".join(parts) + " |", "|---|---|---:|---:|---:|---:|" + "---:|" * len(parts)]
    for g in grouped:
        wall = None if g["wall_s"]["n"] == 0 else g["wall_s"]["median"] / 60
        shares = [None if p not in g["time_share"] else 100 * g["time_share"][p]["median"] for p in parts]
        md.append(f"| {g['id']} | {group_label(g['group'])} | {len(g['runs'])} | "
                  f"{_num(g['env_steps_per_s'].get('median'), '.1f')} | "
                  f"{_num(g['updates_per_s'].get('median'), '.1f')} | {_num(wall, '.1f')} | "
                  + " | ".join(_num(x, ".0f") for x in shares) + " |")
    md += ["", "## Runs", "", "Time columns: shares of the run's training time (`train_time_s`), in %.", "",
           "| run | task | variant | learner | d | seed | budget | base | "
           + " | ".join(f"`{k}`" for k in cfg.keys) + " | final (test) | env steps/s | updates/s | wall (min) | "
           "threads | load (15 min) | " + " | ".join(parts) + " |",
           "|---|---|---|---|---:|---:|---:|---|" + "---:|" * (len(cfg.keys) + 6 + len(parts))]
    for r in rows:
        wall = None if r["wall_s"] is None else r["wall_s"] / 60
        shares = [None if p not in r["time_share"] else 100 * r["time_share"][p] for p in parts]
        md.append(f"| {r['run']} | {r['env']} | {r['variant']} | {r['learner']} | {_num(r['delay_steps'], 'd')} | "
                  f"{_num(r['seed'], 'd')} | {_num(r['budget'], 'd')} | {r['base'] or '—'} | "
                  + " | ".join(_num(r["diagnostics"][k], ".3g") for k in cfg.keys)
                  + f" | {_num(r['final'])} | {_num(r['env_steps_per_s'], '.1f')} | "
                  f"{_num(r['updates_per_s'], '.1f')} | {_num(wall, '.1f')} | {_num(r['torch_threads'], 'd')} | "
                  f"{_num(r['load_15m'], '.1f')} | "
                  + " | ".join(_num(x, ".0f") for x in shares) + " |")
    return md


def plot(path: str, key: str, grouped: list[dict], rows: list[dict]) -> None:
    """Per group (G1 on top, as in the Markdown): each run's value of ``key`` with the median,
    and where the runs' training time went (mean share per part over the runs that recorded it)."""
    by_run = {r["run"]: r for r in rows}
    labels = [f"{g['id']} ({len(g['runs'])})" for g in grouped]
    with figure(path, figsize=(11, 0.3 * len(grouped) + 2), ncols=2) as (ax_key, ax_time):
        for i, g in enumerate(grouped):
            vals = [by_run[d]["diagnostics"][key] for d in g["runs"] if by_run[d]["diagnostics"][key] is not None]
            if vals:
                ax_key.plot(vals, [i] * len(vals), "o", alpha=0.5, color="tab:blue")
                ax_key.plot([np.median(vals)], [i], "|", ms=14, mew=2, color="black")
            else:
                ax_key.text(0.02, i, "not recorded", transform=ax_key.get_yaxis_transform(), va="center",
                            fontsize=7, color="gray")
        ax_key.set_yticks(range(len(grouped)), labels, fontsize=7)
        ax_key.set_xlabel(f"{key}: each run (dots), median (bar)")
        ax_key.grid(alpha=0.3)
        parts = sorted({p for r in rows for p in r["time_share"]})
        left = np.zeros(len(grouped))
        for p in parts:
            share = np.array([np.mean(s) if (s := [by_run[d]["time_share"][p] for d in g["runs"]
                                                    if by_run[d]["time_share"]]) else 0.0 for g in grouped])
            ax_time.barh(range(len(grouped)), share, left=left, label=p)
            left += share
        ax_time.set_yticks(range(len(grouped)), labels, fontsize=7)
        ax_time.set_xlabel("share of training time (mean over the group's runs)")
        ax_time.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        for ax in (ax_key, ax_time):
            ax.set_ylim(len(grouped) - 0.5, -0.5)  # G1 on top


def main(cfg: BenchDiagnosticsConfig) -> int:
    if not cfg.runs:
        raise ConfigError("runs: no runs given; pass 'runs=[<run dir>,...]' or a glob such as "
                          "'runs=[reports/**/summary.json]'")
    keys = list(cfg.keys)
    summaries = {d: _load_summary(d) for d in expand(list(cfg.runs))}
    rows = [run_row(d, s, keys) for d, s in summaries.items()]
    if cfg.curves:
        for r in rows:
            r["curve"] = curve(summaries[r["run"]])
    unknown = [k for k in keys if all(r["diagnostics"][k] is None for r in rows)]
    if unknown:
        recorded = sorted({k for s in summaries.values() for k in (s.get("learner_diagnostics") or {})})
        raise ConfigError(f"keys: {unknown} recorded by none of the {len(rows)} runs; they record: {recorded}")
    grouped = groups(rows, list(cfg.group_by), keys)
    payload = {"command": command(cfg), "keys": keys, "group_by": list(cfg.group_by),
               "groups": grouped, "runs": rows, "machine": machine_info()}
    md = markdown(cfg, rows, grouped)
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(os.path.join(cfg.report_dir, f"{cfg.name}.png"), keys[0], grouped, rows)
    md += ["", f"![{keys[0]} per group and where training time went]({cfg.name}.png)"]
    if cfg.curves:
        plot_curves(os.path.join(cfg.report_dir, f"{cfg.name}_curves.png"), rows)
        md += ["", *curve_markdown(rows), f"![success and the critic's bias along each run]({cfg.name}_curves.png)"]
    write_report(cfg.report_dir, cfg.name, payload, "\n".join(md) + "\n")
    print("\n".join(md[: md.index("## Runs")]))
    print_last_line_json({"groups": [{"id": g["id"], "group": g["group"], "diagnostics": g["diagnostics"]}
                                     for g in grouped]})
    return 0

