"""``arli bench runs 'runs=[<dir>, ...]' name=<report>``: finetune runs of one setting on several
training seeds, pooled on their shared test episodes: the base alone, the anchored start and
the finetuned residual with 95% two-level bootstrap intervals (training seeds x episodes) and
the paired gains with verdicts -> ``reports/<name>.{json,md}``; with the runs' learning curves
(tune episodes) ``reports/<name>.png`` and the curve's mean at each quarter of the budget.

``'reference=[<dir>, ...]'``: runs of another setting (the control), one per run in the same
order of training seeds, on the same test episodes: the start and the final of the setting
against the reference's, paired by training seed and episode."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np

from arli.bench.common import (
    machine_info, print_last_line_json, protocol, protocol_markdown, success_plot, write_report,
)
from arli.config import BenchRunsConfig, ConfigError
from arli.stats import gain_ci, success_ci, verdict

POLICIES = ("base", "start", "final")


def load(run_dir: str) -> tuple[dict, dict]:
    """(eval_test.json, summary.json) of one run; a clear error when it has none."""
    if not os.path.isdir(run_dir):
        raise ConfigError(f"runs: {run_dir} does not exist; pass `arli finetune` output directories of finished runs")
    paths = [os.path.join(run_dir, n) for n in ("eval_test.json", "summary.json")]
    for path in paths:
        if not os.path.exists(path):
            raise ConfigError(f"runs: {run_dir} has no {os.path.basename(path)}; pass `arli finetune` output "
                              "directories of finished runs")
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            out.append(json.load(fh))
    return out[0], out[1]


def saved_run(run_dir: str):
    """The ``run`` settings a run saved in its config.yaml (None for a run without one)."""
    from omegaconf import OmegaConf  # noqa: PLC0415

    path = os.path.join(run_dir, "config.yaml")
    return OmegaConf.load(path).run if os.path.exists(path) else None


def reference_settings(runs: list[str], reference: list[str]) -> list[list[str]]:
    """Per training seed, the Hydra overrides that turn the reference run's saved settings into
    the run's (``arli bench tune``'s rule: no ``run.seed``, curve cadence or output paths), so a
    report says what was compared; [] where a run or its reference saved no config.yaml."""
    from omegaconf import OmegaConf  # noqa: PLC0415

    from arli.bench.tune import shown_overrides  # noqa: PLC0415

    def saved(d: str) -> dict | None:
        path = os.path.join(d, "config.yaml")
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True) if os.path.exists(path) else None

    out = []
    for run, ref in zip(runs, reference):
        mine, theirs = saved(run), saved(ref)
        out.append([] if mine is None or theirs is None else shown_overrides(theirs, mine, pooled=True))
    return out


def training_seed(run_dir: str) -> int | None:
    """The training seed a run saved in its config.yaml (None for a run without one)."""
    run = saved_run(run_dir)
    return None if run is None else int(run.seed)


def _seed_label(run_dir: str) -> str:
    seed = training_seed(run_dir)
    return f"seed {seed}" if seed is not None else os.path.basename(os.path.normpath(run_dir))


def demonstrations(run_dir: str) -> str | None:
    """Which demonstrator made a run's anchor data (``run.demonstrations``; a run saved before
    the key existed ran with the expert's own; None for a run without config.yaml)."""
    run = saved_run(run_dir)
    return None if run is None else str(run.get("demonstrations", "expert"))


def control_of(run_dir: str) -> str | None:
    """Which named control a run's learner is (the sweep's: ``uniform_control`` AWR with every
    weight 1, ``bc_control`` the critic's influence off), or None for the method's own learner."""
    run = saved_run(run_dir)
    learner = {} if run is None else run.get("learner", {})
    if learner.get("awr_weights") == "uniform":
        return "uniform_control"
    if learner.get("q_weight") == 0:
        return "bc_control"
    return None


def curves(summaries: tuple) -> list[np.ndarray] | None:
    """Each run's learning curve on its tune episodes, ``(points, 2)`` = (env steps, success);
    None when a run saved no curve."""
    out = []
    for s in summaries:
        history = s.get("history") or []
        if not history:
            return None
        out.append(np.array([(h["env_steps"], h["success"]) for h in history], float))
    return out


def budget_marks(runs_curves: list[np.ndarray]) -> list[dict]:
    """The tune curve at each quarter of the shortest run's budget: per run the evaluated point
    nearest the mark, and their mean. Each point is one evaluation on the tune episodes."""
    last = min(float(c[-1, 0]) for c in runs_curves)
    marks = []
    for q in (0.25, 0.5, 0.75, 1.0):
        mark = q * last
        per_run = [c[int(np.argmin(np.abs(c[:, 0] - mark)))] for c in runs_curves]
        marks.append({"mark": int(round(mark)), "env_steps": [int(p[0]) for p in per_run],
                      "per_seed": [float(p[1]) for p in per_run], "mean": float(np.mean([p[1] for p in per_run]))})
    return marks


def plot(path: str, name: str, runs: list[str], runs_curves: list[np.ndarray], cells: dict, split: dict,
         curve_eval: dict | None) -> None:
    """Each run's tune curve, their mean on the first run's grid, and the pooled test numbers of
    the start (at 0) and the deployed final (at the end) with their 95% intervals."""
    episodes = f"{curve_eval['episodes']} " if curve_eval else ""
    end = max(float(c[-1, 0]) for c in runs_curves)
    with success_plot(path, f"{name}: learning curves ({episodes}tune episodes per point)",
                      "online env steps", legend_size=7) as ax:
        for d, c in zip(runs, runs_curves):
            ax.plot(c[:, 0], c[:, 1], lw=0.8, alpha=0.55, label=_seed_label(d))
        # the mean only where every run has a curve: past a run's end np.interp would repeat its last point
        grid = np.unique(np.minimum(runs_curves[0][:, 0], min(float(c[-1, 0]) for c in runs_curves)))
        ax.plot(grid, np.mean([np.interp(grid, c[:, 0], c[:, 1]) for c in runs_curves], 0), color="black",
                lw=2, label="mean over seeds")
        for p, x, color in (("start", 0.0, "tab:gray"), ("final", end, "tab:red")):
            c = cells[p]
            ax.errorbar([x], [c["success"]], yerr=[[c["success"] - c["ci95"][0]], [c["ci95"][1] - c["success"]]],
                        fmt="s", color=color, capsize=4,
                        label=f"{'anchored start' if p == 'start' else 'after RL'} ({split['episodes']} test eps)")


def base_of(runs, summaries: tuple, field: str) -> dict[str, str | None]:
    """Each run's base (``summary.json`` ``base_digest``; None for runs saved before the key
    existed). Runs that recorded different bases are refused."""
    digests = {d: s.get("base_digest") for d, s in zip(runs, summaries)}
    if len({v for v in digests.values() if v is not None}) > 1:
        raise ConfigError(f"{field}: the runs finetuned different bases (base_digest: "
                          f"{', '.join(f'{d}: {v}' for d, v in digests.items())}); pool and pair runs of one base")
    return digests


def base_label(digests: dict[str, str | None]) -> str:
    """The report's words for the runs' base, naming the runs that did not record it."""
    known = {v for v in digests.values() if v is not None}
    missing = [d for d, v in digests.items() if v is None]
    if not known:
        return "base digest not recorded by these runs"
    return f"base `{known.pop()}`" + (f" (not recorded by {', '.join(missing)})" if missing else "")


def paired_reference(cfg: BenchRunsConfig, evals: tuple, summaries: tuple) -> dict:
    """The setting's start and final against the reference runs' (``cfg.reference``), paired
    by training seed and test episode; {} without a reference."""
    if not cfg.reference:
        return {}
    if len(cfg.reference) != len(cfg.runs):
        raise ConfigError(f"reference: one reference run per run (the same training seeds, in order), got "
                          f"{len(cfg.reference)} for {len(cfg.runs)} runs")
    ref_evals, ref_summaries = zip(*(load(d) for d in cfg.reference))
    base_of(list(cfg.runs) + list(cfg.reference), summaries + ref_summaries, "reference")
    for run, ref, e, r, s, rs in zip(cfg.runs, cfg.reference, evals, ref_evals, summaries, ref_summaries):
        if json.dumps(e["split"], sort_keys=True) != json.dumps(r["split"], sort_keys=True):
            raise ConfigError(f"reference: {ref} was evaluated on {r['split']}, {run} on {e['split']}; pair runs "
                              "on the same test episodes")
        if training_seed(run) is None or training_seed(run) != training_seed(ref):
            raise ConfigError(f"reference: {ref} is training seed {training_seed(ref)}, {run} is "
                              f"{training_seed(run)}; list the reference runs in the order of the runs' seeds")
        for k in ("env", "delay_steps", "regime"):
            if s[k] != rs[k]:
                raise ConfigError(f"reference: {ref} has {k}={rs[k]!r}, {run} has {s[k]!r}")
        # the base alone is deterministic on one base, seed range, delay and execution: other
        # outcomes mean another base (also for runs saved before base_digest) or another setting
        base, ref_base = ([bool(x) for x in o["outcomes"]["base"]] for o in (e, r))
        if base != ref_base:
            raise ConfigError(f"reference: the base alone succeeded on other test episodes in {ref} than in {run} "
                              f"({sum(a != b for a, b in zip(base, ref_base))} of {len(base)} differ): they "
                              "finetuned different bases, or the base acted otherwise (another machine, chunking "
                              "strategy, latency model or thread count); pair runs of one base and setting made "
                              "on one machine")
    out = {}
    for p in ("start", "final"):
        mine = np.array([e["outcomes"][p] for e in evals], float)
        ref = np.array([e["outcomes"][p] for e in ref_evals], float)
        ci = gain_ci(mine, ref)
        out[f"{p}-reference_{p}"] = {"mean": float(mine.mean() - ref.mean()), "ci95": list(ci),
                                     "reference": float(ref.mean()), "reference_per_seed":
                                     [float(x) for x in ref.mean(1)], "verdict": verdict(ci)}
    if cfg.margin is not None:  # the deployed residual's lead over the control, judged by its interval
        final = out["final-reference_final"]
        final["margin"] = {"threshold": cfg.margin, "verdict": verdict(final["ci95"], cfg.margin)}
    return out


def settings_line(per_seed: list[list[str]]) -> str:
    """What the runs changed against their reference, as Markdown (one line)."""
    kinds = {tuple(o) for o in per_seed}
    if kinds == {()}:
        return "The runs' saved settings match the reference's (training seed aside), or were not saved."
    if len(kinds) == 1:
        return "The runs' settings against the reference's: " + ", ".join(f"`{o}`" for o in per_seed[0]) + "."
    return "The runs' settings against the reference's, per training seed: " + "; ".join(
        ", ".join(f"`{o}`" for o in ov) or "none" for ov in per_seed) + "."


def main(cfg: BenchRunsConfig) -> int:
    if not cfg.runs:
        raise ConfigError("runs: expected at least one `arli finetune` run directory, e.g. "
                          "'runs=[outputs/finetune_peg_insert_arli_d8_<time>,...]'")
    evals, summaries = zip(*(load(d) for d in cfg.runs))
    demos = {demonstrations(d) for d in cfg.runs}
    if len(demos) > 1:
        raise ConfigError(f"runs: their anchor data come from different demonstrators "
                          f"({', '.join(f'{d}: {demonstrations(d)}' for d in cfg.runs)}); pool runs of one "
                          "setting, and compare settings with reference=[...]")
    (demo,) = demos
    controls = {control_of(d) for d in cfg.runs}
    if len(controls) > 1:
        learners = ", ".join(f"{d}: {control_of(d) or s['variant']}" for d, s in zip(cfg.runs, summaries))
        raise ConfigError(f"runs: they mix learners ({learners}); pool runs of one setting, and compare a control "
                          "with reference=[...]")
    (control,) = controls
    seeds = {d: training_seed(d) for d in cfg.runs}
    repeated = sorted(x for x, n in Counter(seeds.values()).items() if x is not None and n > 1)
    if repeated:  # two runs of one seed are one training seed's draw twice, not two seeds
        raise ConfigError(f"runs: training seed{'s' * (len(repeated) > 1)} {repeated} appear more than once "
                          f"({', '.join(f'{d}: seed {x}' for d, x in seeds.items() if x in repeated)}); "
                          "pool one run per training seed")
    splits = {json.dumps(e["split"], sort_keys=True) for e in evals}
    if len(splits) != 1 or evals[0]["split"]["split"] != "test":
        raise ConfigError(f"runs: the runs must share one test split to be pooled, got {sorted(splits)}")
    keys = ("env", "variant", "regime", "delay_steps")
    settings = {json.dumps({k: s[k] for k in keys}) for s in summaries}
    if len(settings) != 1:
        raise ConfigError(f"runs: the runs differ in {keys}: {sorted(settings)}")
    budgets = {d: saved_run(d) for d in cfg.runs}
    budgets = {d: None if r is None or r.get("env_steps") is None else int(r.env_steps) for d, r in budgets.items()}
    if len({b for b in budgets.values() if b is not None}) > 1:
        raise ConfigError(f"runs: the runs have different budgets (run.env_steps: "
                          f"{', '.join(f'{d}: {b}' for d, b in budgets.items())}); pool runs of one setting")
    bases = base_of(cfg.runs, summaries, "runs")
    curve_splits = {json.dumps(s.get("curve_eval"), sort_keys=True) for s in summaries}
    if len(curve_splits) != 1:
        raise ConfigError(f"runs: their learning curves ran on different tune episodes ({sorted(curve_splits)}); "
                          "pool runs of one setting")
    # the residual RL trained, where the end guard may have deployed the start instead (runs
    # made before the guard existed have no such outcomes: their final is what RL trained)
    policies = POLICIES + (("trained",) if all("trained" in e["outcomes"] for e in evals) else ())
    outcomes = {p: np.array([e["outcomes"][p] for e in evals], float) for p in policies}
    cells = {p: {"success": float(outcomes[p].mean()), "ci95": list(success_ci(outcomes[p])),
                 "per_seed": [float(x) for x in outcomes[p].mean(1)]} for p in policies}
    gains = {}
    pairs = (("final", "start"), ("final", "base"), ("start", "base"))
    for a, b in pairs + ((("trained", "start"), ("final", "trained")) if "trained" in policies else ()):
        ci = gain_ci(outcomes[a], outcomes[b])
        gains[f"{a}-{b}"] = {"mean": cells[a]["success"] - cells[b]["success"], "ci95": list(ci),
                             "verdict": verdict(ci)}
    reference = paired_reference(cfg, evals, summaries)
    # met only when the interval's lower end is above the target (the sweep's rule)
    target = None if cfg.target is None else {"success": cfg.target,
                                              "verdict": verdict(cells["final"]["ci95"], cfg.target)}
    s0 = summaries[0]
    runs_curves = curves(summaries)
    marks = budget_marks(runs_curves) if runs_curves else []
    payload = {**{k: s0[k] for k in keys}, "control": control, "env_steps": [s["env_steps"] for s in summaries],
               "eval": evals[0]["split"], "runs": list(cfg.runs), "seeds": len(cfg.runs),
               "cells": cells,
               "protocol": protocol(evals[0]["split"]["episodes"], len(cfg.runs)),  # one run per seed (refused above)
               "demonstrations": demo, "base_digests": list(bases.values()),
               "target": target, "gains": gains, "reference_runs": list(cfg.reference), "reference": reference,
               "reference_settings": reference_settings(list(cfg.runs), list(cfg.reference)) if cfg.reference else [],
               "end_guard": [s.get("end_guard") for s in summaries], "curve_eval": s0.get("curve_eval"),
               "curve_at_budget": marks,
               "wall_s": [s["wall_s"] for s in summaries], "machine": machine_info()}
    md = [f"# {cfg.name}: `{s0['variant']}`{f' ({control})' if control else ''} on `{s0['env']}`, d = {s0['delay_steps']}, {len(cfg.runs)} training seeds",
          "", f"`arli bench runs 'runs=[{', '.join(cfg.runs)}]' "
          + (f"'reference=[{', '.join(cfg.reference)}]' " if cfg.reference else "")
          + (f"target={cfg.target:g} " if cfg.target is not None else "")
          + (f"margin={cfg.margin:g} " if cfg.margin is not None else "")
          + f"name={cfg.name}` — each run's base alone, anchored "
          f"start and finetuned residual on the same {evals[0]['split']['episodes']} test episodes (seeds "
          f"{evals[0]['split']['seed_base']}..); 95% two-level bootstrap over training seeds and episodes; anchor "
          f"data from `run.demonstrations={demo or 'unknown (no config.yaml)'}`; {base_label(bases)}.", "",
          *([protocol_markdown(payload["protocol"]).strip(), ""] if not payload["protocol"]["met"] else []),
          "| policy | success | 95% CI | per seed |", "|---|---:|---:|---|"]
    labels = {"base": "base alone", "start": "anchored start (0 online steps)", "final": "after RL (deployed)",
              "trained": "after RL, as trained (before the end guard)"}
    for p in policies:
        c = cells[p]
        label = labels[p]
        md.append(f"| {label} | {c['success']:.3f} | {c['ci95'][0]:.3f}–{c['ci95'][1]:.3f} | "
                  f"{' / '.join(f'{x:.3f}' for x in c['per_seed'])} |")
    if target:
        md += ["", f"Target: after RL ≥ {cfg.target:g}, judged by its interval: **{target['verdict']}** "
               f"({cells['final']['ci95'][0]:.3f}–{cells['final']['ci95'][1]:.3f})."]
    md += ["", "| gain | mean | 95% CI | verdict vs 0 |", "|---|---:|---:|---|"]
    for k, g in gains.items():
        md.append(f"| {k} | {g['mean']:+.3f} | {g['ci95'][0]:+.3f} – {g['ci95'][1]:+.3f} | {g['verdict']} |")
    guards = [g for g in payload["end_guard"] if g]
    if guards:
        md += ["", "End guard (each run's tune episodes, start against trained; a trained residual below its "
               "start is dropped and the start deployed): " + "; ".join(
                   f"{_seed_label(d)}: {g['start']:.2f} vs {g['trained']:.2f} on {g['episodes']}"
                   + (" -> start deployed" if g["reverted"] else " -> trained kept")
                   for d, g in zip(cfg.runs, payload["end_guard"]) if g) + "."]
    if reference:
        ref_control = {control_of(d) for d in cfg.reference}
        md += ["", f"Against the reference runs `[{', '.join(cfg.reference)}]`"
               + (f" ({', '.join(sorted(c for c in ref_control if c))})" if any(ref_control) else "")
               + " (the same training seeds and test "
               "episodes, paired). " + settings_line(payload["reference_settings"]), "",
               "| difference | reference | mean | 95% CI | verdict vs 0 |",
               "|---|---:|---:|---:|---|"]
        for k, g in reference.items():
            md.append(f"| {k} | {g['reference']:.3f} ({' / '.join(f'{x:.3f}' for x in g['reference_per_seed'])}) | "
                      f"{g['mean']:+.3f} | {g['ci95'][0]:+.3f} – {g['ci95'][1]:+.3f} | {g['verdict']} |")
        if cfg.margin is not None:
            g = reference["final-reference_final"]
            md += ["", f"Margin: after RL above the reference's after RL {cfg.margin:+g}, judged by the paired interval "
                   "(met when its lower end is above): "
                   f"**{g['margin']['verdict']}** ({g['ci95'][0]:+.3f} – {g['ci95'][1]:+.3f})."]
    if marks:
        md += ["", f"Learning curve on the tune episodes ({(s0.get('curve_eval') or {}).get('episodes', '?')} per "
               "point; the point nearest each quarter of the budget; for reading the budget, not for reporting):",
               "", "| env steps | mean | per seed (its point's env steps) |", "|---:|---:|---|"]
        for m in marks:
            md.append(f"| {m['mark']} | {m['mean']:.3f} | "
                      f"{' / '.join(f'{x:.2f} ({n})' for x, n in zip(m['per_seed'], m['env_steps']))} |")
        os.makedirs(cfg.report_dir, exist_ok=True)
        plot(os.path.join(cfg.report_dir, f"{cfg.name}.png"), cfg.name, list(cfg.runs), runs_curves, cells,
             evals[0]["split"], s0.get("curve_eval"))
        md += ["", f"![learning curves]({cfg.name}.png)"]
    write_report(cfg.report_dir, cfg.name, payload, "\n".join(md) + "\n")
    if not marks and os.path.exists(stale := os.path.join(cfg.report_dir, f"{cfg.name}.png")):
        os.remove(stale)  # an earlier report's curves are not these runs'
    print("\n".join(md))
    print_last_line_json({"cells": cells, "gains": gains, "reference": reference})
    return 0
