"""``arli bench latency-sweep``: the method's claims, measured.

Success of the base policy (sync, async naive, async rtc) and of residual RL with each state
variant of DESIGN.md §2 at every delay, each RL cell next to its anchored start (the
anchor-pretrained residual before any online step, on the same test episodes), two
controls at every delay > 0 on the same anchor data (``bc_control``: the same learner with
the critic's influence off; ``uniform_control``: AWR with every row weighted 1, the
anchor rows fading as in the learner, so the critic steers nothing), and the residual's ceiling (``ceiling``: the projected expert of
``arli bench ceiling`` through the same scheduler and default bound, no learning). Every
cell is evaluated on the same test episodes (seeds ``run.test_seed ..``); success is given
with a two-level bootstrap interval over training seeds x episodes, gains as paired
intervals (``arli.stats``), and the issue's expected results as verdicts computed from them
(``arli.bench.claims``; at a later look on more training seeds, ``looks``, at a wider level).

Cells run in worker processes and are cached as they finish (``cache``), so an interrupted
sweep resumes where it stopped. A cached cell stays valid while its settings, its torch
thread count and the checkpoint's content (``policy_digest``) are the same and every
repository source file the cell actually ran (recorded per row) is unchanged: editing the
transport or the Franka driver keeps a sweep's cells, editing the learner invalidates them.
The report's rows are also written to ``<report_dir>/<name>/cells.jsonl`` (merged with the
rows already there) and read back as a cache, so a sweep too long for one sitting grows
across fresh clones of the same code, as long as ``arli pretrain`` (pinned ``threads``)
reproduces the base's digest there and cells run with the same ``threads``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace

# first: the snapshot of every code file (``provenance``) before this module imports the code
# cells run; forked workers inherit the modules imported here and the snapshot with them
from arli.bench.provenance import (  # noqa: E402, I001
    _AT_START, CHANGED_WHILE_RUNNING, REPORT_ONLY_SOURCES, _code_files, _file_digest, loaded_sources,
    sources_unchanged)

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from arli.bench.claims import IDEAL, verdict_level, verdict_markdown, verdicts  # noqa: E402
from arli.bench.common import (  # noqa: E402
    machine_info, print_last_line_json, protocol, protocol_markdown, rounded, rounded_interval, success_plot,
    write_report,
)
from arli.config import DEFAULT_SWEEP_VARIANTS, LatencySweepConfig  # noqa: E402
from arli.policies.load import policy_digest  # noqa: E402
from arli.pretrain import ensure_base_policy  # noqa: E402
from arli.stats import gain_ci, success_ci  # noqa: E402

BASE_VARIANTS = {"base_sync": "sync", "base_naive": "naive", "base_rtc": "rtc"}
ALL, POSITIVE = "all", "positive"  # every delay of the sweep / every delay of the sweep > 0
# sweep variant -> (state variant, its delays: ALL, POSITIVE or one fixed delay)
RL_VARIANTS = {"arli": ("arli", ALL), "arli_no_committed": ("arli_no_committed", ALL),
               "arli_no_midobs": ("arli_no_midobs", ALL), "standard": ("standard", ALL),
               "standard_d0": ("standard", 0), "stepwise_d0": ("stepwise", 0),
               "bc_control": ("arli", POSITIVE), "uniform_control": ("arli", POSITIVE),
               "anchor_only": ("arli", POSITIVE)}
CEILING = "ceiling"  # the projected expert at the default bound, no gripper authority: one cell per delay
# 2: every RL row carries its anchored start (start_success, start_outcomes); rows without it
# are recomputed
CELL_FORMAT = 2


def cell_spec(cfg_dict: dict, variant: str, seed: int):
    """The ``RunSpec`` of one residual-RL cell: the sweep's run settings with the variant's
    state, this training seed, the sweep's regime and budget, and the controls' learner."""
    from arli.rl.config import InterventionSpec, LearnerConfig, RunSpec  # noqa: PLC0415

    run = dict(cfg_dict["run"])
    spec = RunSpec(**{**run, "learner": LearnerConfig(**run.pop("learner")),
                      "intervention": InterventionSpec(**run.pop("intervention"))})
    spec = replace(spec, variant=RL_VARIANTS[variant][0], seed=seed, regime=cfg_dict["regime"],
                   env_steps=cfg_dict["budget"], eval_every=max(1, cfg_dict["budget"] // 4))
    if variant in CONTROL_SETTINGS:
        spec = replace(spec, learner=replace(spec.learner, **control_settings(variant, spec.learner.actor_update)))
    return spec


# the controls' learners: the critic steers nothing, neither the actor's update nor, by value gating,
# the executed action (the max-Q backup stays: it shapes only the critic, which then steers nothing)
CONTROL_SETTINGS = {"bc_control": {"q_weight": 0.0},  # BC on the anchor rows
                    "uniform_control": {"actor_update": "awr", "awr_weights": "uniform"}}  # every row weighted 1


def control_settings(variant: str, actor_update: str) -> dict:
    """The learner settings that make ``variant`` (a control) of a learner with this actor
    update: the control's own, no gating, and AWR where the update is select (select takes
    its candidates from gating; with q_weight 0 both are the same BC on the anchor rows)."""
    return {"gate_candidates": 0, **({"actor_update": "awr"} if actor_update == "select" else {}),
            **CONTROL_SETTINGS[variant]}


def ceiling_settings(cfg_dict: dict) -> dict:
    """``arli.bench.ceiling``'s settings for the sweep's task, base and test episodes."""
    return {**cfg_dict, "episodes": cfg_dict["eval_episodes"], "test_seed": cfg_dict["run"]["test_seed"]}


def run_cell(cfg_dict: dict, variant: str, delay: int, seed: int | None) -> dict:
    """One (variant, delay, seed) cell; runs in a worker process. ``seed`` is None for the
    ceiling (no training seed: one cell per delay)."""
    import torch  # noqa: PLC0415

    from arli.bench import ceiling  # noqa: PLC0415
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.rollout import evaluate_policy  # noqa: PLC0415

    cell = {"variant": variant, "delay_steps": delay, "seed": seed}
    settings = ceiling_settings(cfg_dict)
    if variant == CEILING:  # arli bench ceiling's cell: the default bound, the residual's own grip entry
        out = ceiling.run_cell(settings, delay, cfg_dict["run"]["learner"]["residual_scale"], False)
        return {**cell, "success": out["success"], "outcomes": out["outcomes"], "scale": out["scale"],
                "grip_authority": out["grip_authority"], "steps_to_80": None, "sources": loaded_sources()}
    torch.set_num_threads(cfg_dict["threads_per_worker"])
    env, base, expert, latency, chunking = ceiling._setup(settings, delay)  # the ceiling's task, base and delay
    episodes, test_seed = settings["episodes"], settings["test_seed"]  # every cell on the same test episodes
    if variant in BASE_VARIANTS:
        out = evaluate_policy(env, base, chunking, latency, episodes, test_seed, strategy=BASE_VARIANTS[variant])
        return {**cell, "success": out["success"], "outcomes": [int(x) for x in out["outcomes"]],
                "steps_to_80": 0 if out["success"] >= 0.8 else None, "sources": loaded_sources()}
    spec = cell_spec(cfg_dict, variant, seed)
    model = getattr(base, "model", None)
    ft = Finetuner(spec, env, base, expert, latency,
                   None if model is None else model.state_mean.numpy(),
                   None if model is None else model.state_std.numpy(), chunking)
    ft.prepare()
    start = ft.evaluate(episodes, seed=test_seed)  # the anchored start: 0 online steps
    if variant == "anchor_only":
        final = start
    else:
        ft.train(progress=False)
        final = ft.evaluate(episodes, seed=test_seed)
    guard = ft.guard_end() if spec.end_guard and variant != "anchor_only" else None
    trained = final
    if guard and guard["reverted"]:  # the start is deployed: its weights on the same seeds, its outcomes
        final = start
    reached = next((h["env_steps"] for h in ft.history if h["success"] >= 0.8), None)
    return {**cell, "success": final["success"], "outcomes": [int(x) for x in final["outcomes"]],
            "start_success": start["success"], "start_outcomes": [int(x) for x in start["outcomes"]],
            "trained_outcomes": [int(x) for x in trained["outcomes"]], "end_guard": guard,
            "steps_to_80": reached, "curve": ft.history, "sources": loaded_sources()}


def seedless(variant: str) -> bool:
    """A cell that depends on no training seed (the base alone, the ceiling): one per delay."""
    return variant == CEILING or variant in BASE_VARIANTS


def base_variant(strategy: str) -> str | None:
    """The base alone in the loop the residual runs in (``chunking.strategy``)."""
    return next((v for v, s in BASE_VARIANTS.items() if s == strategy), None)


def plan(cfg: LatencySweepConfig) -> list[tuple[str, int, int | None]]:
    """All (variant, delay, seed) cells, the headline delay (4) and the ideal reference
    first, so an interrupted sweep still answers the main question; the base alone and the
    ceiling have one cell per delay (seed None): neither depends on a training seed."""
    cells = []
    for seed in cfg.seeds:
        for variant in cfg.variants:
            if seedless(variant) or (variant == IDEAL and _ideal_is_standard_d0(cfg)):
                continue  # the ideal: the same runs as `standard` at d = 0, not computed twice
            cells += [(variant, d, seed) for d in variant_delays(variant, cfg)]
    cells += [(v, d, None) for v in cfg.variants if seedless(v) for d in variant_delays(v, cfg)]
    order = {4: 0, 0: 1}
    return sorted(cells, key=lambda c: (order.get(c[1], 2), c[1], -1 if c[2] is None else c[2]))


def variant_delays(variant: str, cfg: LatencySweepConfig) -> list[int]:
    which = RL_VARIANTS.get(variant, (None, ALL))[1]
    if which == ALL:
        return list(cfg.delay_steps)
    if which == POSITIVE:
        return [d for d in cfg.delay_steps if d > 0]
    return [which]


def _ideal_is_standard_d0(cfg: LatencySweepConfig) -> bool:
    return "standard" in cfg.variants and 0 in cfg.delay_steps


def fingerprint(cfg_dict: dict, variant: str) -> str:
    """Hash of every setting a cell's result depends on: a changed learner recipe, base
    checkpoint, budget or evaluation invalidates the cached cells it affects (and only those:
    base-policy cells ignore the residual learner's settings, the ceiling reads its bound
    only). The code a cell ran is checked file by file (``sources``), not here."""
    keys = {"env": cfg_dict["env"], "checkpoint": cfg_dict["checkpoint_digest"], "cell": cfg_dict["cell_code"],
            "eval_episodes": cfg_dict["eval_episodes"], "test_seed": cfg_dict["run"]["test_seed"],
            "chunk_size": cfg_dict["chunk_size"], "chunking": cfg_dict["chunking"], "format": CELL_FORMAT}
    if variant == CEILING:  # one torch thread always (``ceiling.run_cell``)
        keys.update(scale=cfg_dict["run"]["learner"]["residual_scale"])
    else:  # torch's float sums, so a policy's outputs and a run's result, follow the thread count
        keys.update(threads=cfg_dict["threads_per_worker"])
    if variant not in BASE_VARIANTS and variant != CEILING:
        keys.update(run=cfg_dict["run"], budget=cfg_dict["budget"], regime=cfg_dict["regime"])
    return hashlib.sha1(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]


def row_complete(row: dict) -> bool:
    """A cached row the report can use: per-episode outcomes, and for residual-RL cells the
    anchored start's (rows from older sweeps lack it: they are recomputed)."""
    if "outcomes" not in row:
        return False
    return row["variant"] not in RL_VARIANTS or ("start_outcomes" in row and "start_success" in row)


def load_cache(paths: list[str], cfg_dict: dict) -> dict[tuple, dict]:
    """Cached cells, from every file of ``paths`` (the run cache, then the report's committed
    cells), whose settings match, whose row is complete and every source file they ran is
    unchanged; where several files hold a valid row for a cell, the first file's first row
    wins (rerunning a cell means deleting it from both files). A base-alone row of a sweep
    that ran the base once per training seed serves as the base's one cell (``seedless``)."""
    if isinstance(paths, str):
        raise TypeError("load_cache: paths is a list of files, not one path")
    done = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if seedless(row["variant"]):
                    row = {**row, "seed": None}
                key = (row["variant"], row["delay_steps"], row["seed"])
                if (row.get("fingerprint") == fingerprint(cfg_dict, row["variant"])
                        and row_complete(row) and sources_unchanged(row.get("sources"))):
                    if key not in done:
                        done[key] = row
                    elif seedless(key[0]):  # copies of one measurement must agree
                        once_per_delay([done[key], row])
    return done


def committed_cells(cfg: LatencySweepConfig) -> str:
    """Where a report keeps the rows it was built from (committed with it): a sweep rerun on a
    fresh clone whose base has the same digest runs only the cells these lack."""
    return os.path.join(cfg.report_dir, cfg.name, "cells.jsonl")


def write_cells(path: str, rows: list[dict]) -> None:
    """The report's rows, then every row already in the file for another cell or other
    settings: a rerun with fewer variants, or under settings its rows do not match, never
    loses committed cells (``load_cache`` picks the valid ones)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def key(row: dict) -> tuple:  # a base-alone row under any training seed is the base's one cell
        return row["variant"], row["delay_steps"], None if seedless(row["variant"]) else row["seed"], \
            row.get("fingerprint")

    ours = {key(r) for r in rows}
    kept = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            kept = [row for row in map(json.loads, fh) if key(row) not in ours]
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, sort_keys=True) + "\n" for row in [*rows, *kept])
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # a crash mid-write keeps the previous file


# -- aggregation --------------------------------------------------------------------------
def _bits(outcomes) -> str:
    """Per-episode outcomes as a string of 0 / 1, episode i of the test seeds at index i."""
    return "".join("1" if x else "0" for x in outcomes)


def _code_digest(sources: dict | None) -> str | None:
    """Digest of the code files a cell's result can depend on (report-only files left out, as
    the cache check leaves them out)."""
    code = {k: v for k, v in (sources or {}).items() if not k.startswith(REPORT_ONLY_SOURCES)}
    return hashlib.sha1(json.dumps(code, sort_keys=True).encode()).hexdigest()[:12] if code else None


def once_per_delay(rows: list[dict]) -> list[dict]:
    """``rows`` with one row (seed None) per seedless cell (the base alone, the ceiling): rows of
    the same base at one delay under several training seeds (older sweeps ran it per seed) are
    copies of one measurement, not seeds. Raises where they disagree."""
    out, first = [], {}
    for r in rows:
        if not seedless(r["variant"]):
            out.append(r)
            continue
        key = (r["variant"], r["delay_steps"])
        if key not in first:
            first[key] = {**r, "seed": None}
            out.append(first[key])
        elif list(first[key]["outcomes"]) != list(r["outcomes"]):
            raise ValueError(f"{key[0]}@{key[1]}: two rows with other test outcomes (seeds {first[key].get('seed')!r}, "
                             f"{r['seed']!r}); the cell depends on no training seed, so one ran other code, threads "
                             "or base: delete the stale row from the cells file")
    return out


def aggregate(rows: list[dict], cfg: LatencySweepConfig) -> list[dict]:
    """One cell per (variant, delay) with rows: success over its seeds with the two-level
    bootstrap interval; for residual-RL cells the anchored start and the paired gain
    (final - start on the same seeds and episodes). A base-alone cell has one row and no
    seeds (``seeds`` []): it is complete, and its outcomes stand for every seed in the paired
    verdicts. Keys starting with ``_`` (per-seed outcomes, for the paired verdicts) are not
    written to the report."""
    rows = once_per_delay(rows)
    if IDEAL in cfg.variants and _ideal_is_standard_d0(cfg):
        rows = [r for r in rows if r["variant"] != IDEAL]
        rows += [{**r, "variant": IDEAL} for r in rows if r["variant"] == "standard" and r["delay_steps"] == 0]
    # the base alone in the residual's loop, per delay: a start with exactly its outcomes on every
    # test episode is, as far as the outcomes tell, the base (what the start guard leaves when it
    # drops an anchored start worse on the tune episodes; the rows do not record its decision)
    base = base_variant(cfg.chunking.strategy)
    base_rows = {r["delay_steps"]: list(r["outcomes"]) for r in rows if r["variant"] == base}
    out = []
    for variant in cfg.variants:
        if variant == CEILING:
            continue
        for d in variant_delays(variant, cfg):
            group = sorted((r for r in rows if r["variant"] == variant and r["delay_steps"] == d),
                           key=lambda r: r["seed"])
            if not group:
                continue
            finals = np.array([r["outcomes"] for r in group], float)  # (seeds, episodes)
            reached = [r["steps_to_80"] for r in group]
            cell = {
                "variant": variant, "delay_steps": d, "seeds": [r["seed"] for r in group if r["seed"] is not None],
                # every training seed of the sweep (the base alone: its one row): only complete cells
                # enter a verdict
                "complete": seedless(variant) or {r["seed"] for r in group} == set(cfg.seeds),
                "success_mean": rounded(finals.mean()),
                # 95% two-level bootstrap interval over training seeds and the shared test episodes
                "ci95": rounded_interval(success_ci(finals)),
                "start_mean": None, "gain_ci95": None,
                "success_std": rounded(finals.mean(1).std()), "per_seed": [rounded(x) for x in finals.mean(1)],
                # every seed must reach 80%; the slowest seed decides
                "steps_to_80": None if any(x is None for x in reached) else int(max(reached)),
                "_outcomes": {r["seed"]: r["outcomes"] for r in group},
            }
            # what was run, per training seed: every test episode's outcome, and the digest of
            # the code files the cell ran (cells that ran the same code share it)
            cell.update(outcomes_by_seed={"all" if r["seed"] is None else str(r["seed"]): _bits(r["outcomes"])
                                          for r in group},
                        code_digests=sorted({_code_digest(r.get("sources")) for r in group}, key=str))
            if any("run_dir" in r for r in group):  # from `arli finetune` runs (``runs``): where each is
                cell["runs_by_seed"] = {str(r["seed"]): r["run_dir"] for r in group if "run_dir" in r}
                # runs saved before summaries recorded their code and threads: neither is checked
                cell["runs_unrecorded_seeds"] = [r["seed"] for r in group if "run_dir" in r and not r.get("sources")]
            if variant in RL_VARIANTS:
                starts = np.array([r["start_outcomes"] for r in group], float)
                # the end guard dropped the trained residual there: the final is the start
                dropped = [r for r in group if (r.get("end_guard") or {}).get("reverted")]
                cell.update(start_mean=rounded(starts.mean()), gain_ci95=rounded_interval(gain_ci(finals, starts)),
                            gain_mean=rounded(finals.mean() - starts.mean()), start_ci95=rounded_interval(success_ci(starts)),
                            start_per_seed=[rounded(x) for x in starts.mean(1)],
                            start_outcomes_by_seed={str(r["seed"]): _bits(r["start_outcomes"]) for r in group},
                            start_is_base_seeds=[r["seed"] for r in group
                                                 if base_rows.get(d) == list(r["start_outcomes"])],
                            start_deployed_seeds=[r["seed"] for r in dropped],
                            # what the dropped residual itself got on the test episodes
                            trained_per_seed={str(r["seed"]): rounded(np.mean(r["trained_outcomes"]))
                                              for r in dropped if "trained_outcomes" in r},
                            trained_outcomes_by_seed={str(r["seed"]): _bits(r["trained_outcomes"])
                                                      for r in dropped if "trained_outcomes" in r},
                            _start_outcomes={r["seed"]: r["start_outcomes"] for r in group})
            out.append(cell)
    return out


def ceiling_cells(rows: list[dict]) -> list[dict]:
    """The ceiling per delay: the projected expert's success with its interval."""
    out = []
    for r in sorted((r for r in rows if r["variant"] == CEILING), key=lambda r: r["delay_steps"]):
        out.append({"delay_steps": r["delay_steps"], "success": rounded(r["success"]),
                    "ci95": rounded_interval(success_ci(r["outcomes"])), "scale": r["scale"],
                    "grip_authority": r["grip_authority"]})
    return out


def public(cells: list[dict]) -> list[dict]:
    """The cells as the report writes them (no per-episode outcomes)."""
    return [{k: v for k, v in c.items() if not k.startswith("_")} for c in cells]


def plot(cells: list[dict], ceiling: list[dict], path: str, title: str) -> None:
    """Success vs delay per variant with 95% interval error bars (variants side by side at
    each delay), each training seed's success as a small dot beside its cell; the ceiling as a
    dashed line."""
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    width = 0.6 / max(1, len(variants))
    with success_plot(path, title, "delay_steps d (dt = 50 ms)", "success rate (mean, 95% CI; dots: seeds)",
                      figsize=(8, 4.8), legend_size=7) as ax:
        for i, variant in enumerate(variants):
            own = sorted((c for c in cells if c["variant"] == variant), key=lambda c: c["delay_steps"])
            x = [c["delay_steps"] + (i - (len(variants) - 1) / 2) * width for c in own]
            y = [c["success_mean"] for c in own]
            err = np.array([[m - c["ci95"][0], c["ci95"][1] - m] if c["ci95"] else [0, 0] for c, m in zip(own, y)]).T
            bars = ax.errorbar(x, y, yerr=err, marker="o" if len(own) > 1 else "s", capsize=3,
                               ls=":" if variant.startswith("base") else ("-" if len(own) > 1 else "none"),
                               label=variant)
            for xi, c in zip(x, own):  # the spread over training seeds, which the interval folds in
                if c["seeds"]:
                    ax.scatter([xi + width / 4] * len(c["per_seed"]), c["per_seed"], s=9, alpha=0.6,
                               color=bars[0].get_color(), zorder=3)
        if ceiling:
            xs, ys = [c["delay_steps"] for c in ceiling], [c["success"] for c in ceiling]
            if len(xs) > 1:
                ax.plot(xs, ys, "k--", lw=1.5, label="ceiling (projected expert)")
            else:
                ax.axhline(ys[0], color="k", ls="--", lw=1.5, label=f"ceiling (projected expert, d = {xs[0]})")
        delays = sorted({c["delay_steps"] for c in cells} | {c["delay_steps"] for c in ceiling})
        if delays:
            ax.set_xticks(delays)


def init_worker() -> None:
    """Pool initializer: import what cells run and note the loaded files' digests right away
    (against the snapshot taken when this module was first imported: inherited by a forked
    worker, taken afresh by a spawned one)."""
    if not _AT_START:
        _AT_START.update({rel: _file_digest(rel) for rel in _code_files()})
    import arli.finetune  # noqa: F401, PLC0415
    import arli.rollout  # noqa: F401, PLC0415
    import sim_envs.experts  # noqa: F401, PLC0415

    loaded_sources()


def cell_code() -> str:
    """Digest of the code that defines a cell here and in ``arli.bench.ceiling`` (both are
    report-only paths for ``sources``, so their cell functions are hashed instead)."""
    from arli.bench import ceiling  # noqa: PLC0415

    parts = (run_cell, cell_spec, control_settings, ceiling_settings, ceiling.run_cell, ceiling._setup,
             ceiling.ProjectedExpert)
    source = "".join(inspect.getsource(p) for p in parts) + json.dumps(CONTROL_SETTINGS, sort_keys=True)
    return hashlib.sha1(source.encode()).hexdigest()[:12]


def cell_settings(cfg: LatencySweepConfig) -> dict:
    """What a worker needs to run a cell (plain data: it crosses the process boundary)."""
    from sim_envs.registry import task_name  # noqa: PLC0415

    return {"env": {**asdict(cfg.env), "name": task_name(cfg.env.name)}, "checkpoint": cfg.checkpoint,
            "eval_episodes": cfg.eval_episodes, "checkpoint_digest": base_digest(cfg),
            "cell_code": cell_code(), "regime": cfg.run.regime,
            "budget": cfg.budget, "run": asdict(cfg.run), "chunking": asdict(cfg.chunking),
            "chunk_size": cfg.pretrain.policy.chunk_size,
            "threads_per_worker": cfg.threads}


def base_digest(cfg: LatencySweepConfig) -> str:
    """The digest of the base the cells ran on: ``cfg.base_digest`` when a report is rebuilt
    from another machine's cells, else this checkpoint's."""
    return cfg.base_digest or policy_digest(cfg.checkpoint)


def report(rows: list[dict], cfg: LatencySweepConfig, missing: list) -> tuple[dict, str]:
    """(the JSON payload, the markdown) of the sweep's rows."""
    cells, ceiling = aggregate(rows, cfg), ceiling_cells(rows)
    checks = verdicts(cells, ceiling, list(cfg.delay_steps), base_variant(cfg.chunking.strategy), cfg.looks)
    payload = {"env": cfg.env.name, "regime": cfg.run.regime, "budget": cfg.budget,
               "demonstrations": cfg.run.demonstrations,
               "eval": {"split": "test", "seed_base": cfg.run.test_seed, "episodes": cfg.eval_episodes},
               "protocol": protocol(cfg.eval_episodes,
                                    None if all(seedless(v) for v in cfg.variants) else len(cfg.seeds)),
               "cells": public(cells), "ceiling": ceiling, "verdicts": checks,
               "verdict_level": verdict_level(cfg.looks), "looks": cfg.looks,
               "missing": [list(c) for c in missing], "runs": list(cfg.runs), "checkpoint": cfg.checkpoint,
               "checkpoint_digest": base_digest(cfg), "command": command(cfg),
               "machine": machine_info()}
    if cfg.base_digest:  # the cells ran where `arli pretrain` trains this base, not necessarily here
        payload["rebuilt_from_cells_of_base"] = cfg.base_digest
    md = markdown(payload, cfg) + (f"\nNot run yet ({len(missing)} cells): {missing}\n" if missing else "")
    return payload, md


def main(cfg: LatencySweepConfig) -> int:
    if not cfg.base_digest:  # rebuilding another machine's report needs no base here
        ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    cfg_dict = cell_settings(cfg)
    os.makedirs(os.path.dirname(cfg.cache) or ".", exist_ok=True)
    done = load_cache([cfg.cache, committed_cells(cfg)], cfg_dict)
    replaced = {}  # cached rows a named run takes the place of: kept with the committed cells
    if cfg.runs:
        from arli.bench.sweep_runs import run_rows  # noqa: PLC0415 - it builds on this module

        runs = run_rows(cfg, cfg_dict, done)
        replaced = {key: done[key] for key in runs if key in done}
        for key in sorted(replaced, key=str):
            print(f"latency sweep: {runs[key]['run_dir']} replaces the cached {key[0]}@{key[1]} row of seed {key[2]}")
        done.update(runs)
    todo = [] if cfg.report_only else [c for c in plan(cfg) if c not in done]
    print(f"latency sweep: {len(done)} cells cached, {len(todo)} to run (budget {cfg.budget} env steps)")
    if todo:
        with (ProcessPoolExecutor(cfg.workers, initializer=init_worker) as pool,
              open(cfg.cache, "a", encoding="utf-8") as cache):
            futures = {pool.submit(run_cell, cfg_dict, *c): c for c in todo}
            for fut in tqdm(as_completed(futures), total=len(futures), desc="sweep cells", unit="cell"):
                row = {**fut.result(), "budget": cfg.budget,
                       "fingerprint": fingerprint(cfg_dict, futures[fut][0])}
                done[futures[fut]] = row
                cache.write(json.dumps(row) + "\n")
                cache.flush()  # a crash loses at most the cells still running
                start = f" (start {row['start_success']:.2f})" if "start_success" in row else ""
                tqdm.write(f"{row['variant']:>18} d={row['delay_steps']} seed={row['seed']}: "
                           f"success {row['success']:.2f}{start}")
    if todo and cfg.runs:  # the runs' base alone, again: against the base cells run just now
        run_rows(cfg, cfg_dict, done)
    missing = [c for c in plan(cfg) if c not in done]
    rows = [done[c] for c in plan(cfg) if c in done]
    payload, md = report(rows, cfg, missing)
    # runs stay in their directories
    write_cells(committed_cells(cfg), [r for r in rows if "run_dir" not in r] + list(replaced.values()))
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(payload["cells"], payload["ceiling"], os.path.join(cfg.report_dir, f"{cfg.name}.png"),
         f"{cfg.env.name}: success vs delay (budget {cfg.budget} steps, {len(cfg.seeds)} seeds)")
    write_report(cfg.report_dir, cfg.name, payload, md)
    print(md)
    print_last_line_json(payload)
    return 0


def _digest_note(digest: str) -> str:
    if digest == "expert":
        return ""
    return (f" (digest of its weights and configs `{digest}`: a built-in base re-trained by `arli pretrain` at "
            "the same seed, demos and `threads` gets it again on the same machine)")


def non_default_settings(cfg: LatencySweepConfig) -> list[str]:
    """Overrides of the residual-learning settings and variant list, as Hydra arguments, so
    the command a report shows reproduces it."""
    from arli.chunking import ChunkingConfig  # noqa: PLC0415
    from arli.rl.config import RunSpec  # noqa: PLC0415

    def flat(d: dict, prefix: str) -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    now = {**flat(asdict(cfg.run), "run."), **flat(asdict(cfg.chunking), "chunking.")}
    default = {**flat(asdict(RunSpec()), "run."), **flat(asdict(ChunkingConfig()), "chunking.")}
    out = [f"checkpoint={cfg.checkpoint}"] if cfg.checkpoint != f"checkpoints/base_{cfg.env.name}" else []
    out += [f"{k}={v}" for k, v in now.items() if v != default[k]]
    if list(cfg.variants) != list(DEFAULT_SWEEP_VARIANTS):
        out.append(f"'variants=[{','.join(cfg.variants)}]'")
    return out


def command(cfg: LatencySweepConfig) -> str:
    """The command line that reproduces this report (its cells, and where it is written)."""
    where = ([f"name={cfg.name}"] if cfg.name != "latency_sweep" else []) + \
        ([f"report_dir={cfg.report_dir}"] if cfg.report_dir != "reports" else [])
    runs = [f"'runs=[{','.join(cfg.runs)}]'"] if cfg.runs else []
    where += [f"looks={cfg.looks}"] if cfg.looks != 1 else []
    return (f"arli bench latency-sweep env={cfg.env.name} budget={cfg.budget} "
            f"'seeds={list(cfg.seeds)}' 'delay_steps={list(cfg.delay_steps)}' eval_episodes={cfg.eval_episodes}"
            + "".join(f" {o}" for o in [*non_default_settings(cfg), *runs, *where]))


def _runs_markdown(cells: list[dict], report_dir: str) -> str:
    """Which cells came from `arli finetune` runs (``runs``), and where each seed's run is
    (linked from the report, which sits in ``report_dir``)."""
    lines = [f"* {c['variant']}@{c['delay_steps']}: "
             + ", ".join(f"seed {s} [`{d}`]({os.path.relpath(d, report_dir)})" for s, d in c["runs_by_seed"].items())
             + (f" (seeds {c['runs_unrecorded_seeds']}: code and torch threads not recorded, not checked)"
                if c.get("runs_unrecorded_seeds") else "")
             for c in cells if c.get("runs_by_seed")]
    if not lines:
        return ""
    return ("Cells from finished `arli finetune` runs (`runs=[...]`), each checked to be this sweep's cell: every "
            "setting but the curve's spacing, budget, test episodes, training seed, base (digest and the base "
            "alone's outcomes), and, where the run recorded them, its code and torch threads; steps to 80% read "
            "from the run's tune curve at the sweep's points:\n\n" + "\n".join(lines) + "\n\n")


def _ci(ci, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return "" if ci is None else f" [{f.format(ci[0])}, {f.format(ci[1])}]"


def markdown(p: dict, cfg: LatencySweepConfig) -> str:
    e = p["eval"]
    head = ("| variant | d | seeds | success [95% CI] | anchored start [95% CI] | gain over start [95% CI] | "
            "steps to 80% |\n|---|---:|---|---:|---:|---:|---:|\n")
    rows = []
    for c in sorted(p["cells"], key=lambda c: (cfg.variants.index(c["variant"]), c["delay_steps"])):
        partial = "" if c["complete"] else " (partial: no verdict uses it)"
        seeds = f"{c['seeds']}{partial}" if c["seeds"] else "— (once: no training seed)"
        start = "—" if c["start_mean"] is None else f"{c['start_mean']:.3f}{_ci(c.get('start_ci95'))}"
        if c.get("start_is_base_seeds"):
            start += f" (= the base's outcomes on seeds {c['start_is_base_seeds']})"
        gain = "—" if c["gain_ci95"] is None else f"{c['gain_mean']:+.3f}{_ci(c['gain_ci95'], True)}"
        if c.get("start_deployed_seeds"):
            trained = ", ".join(f"{v:.3f} (seed {k})" for k, v in (c.get("trained_per_seed") or {}).items())
            gain += (f" (end guard: the start deployed on seeds {c['start_deployed_seeds']}"
                     + (f"; the trained residual: {trained}" if trained else "") + ")")
        reached = "not reached" if c["steps_to_80"] is None else c["steps_to_80"]
        rows.append(f"| {c['variant']} | {c['delay_steps']} | {seeds} | "
                    f"{c['success_mean']:.3f}{_ci(c['ci95'])} | {start} | {gain} | {reached} |")
    for c in p["ceiling"]:
        rows.append(f"| **ceiling** (projected expert, bound {c['scale']}, no grip authority) | {c['delay_steps']} | "
                    f"— | {c['success']:.3f}{_ci(c['ci95'])} | — | — | — |")
    return (
        f"# Latency sweep — `{cfg.env.name}`\n\n"
        f"Command: `{p['command']}`\n\n" + protocol_markdown(p["protocol"])
        + (f"Rebuilt from the committed cells of base `{p['rebuilt_from_cells_of_base']}` (`report_only=true "
           f"base_digest={p['rebuilt_from_cells_of_base']}`): they ran on a machine whose `arli pretrain` trains "
           "that base; the machine below is where the report was rebuilt.\n\n"
           if p.get("rebuilt_from_cells_of_base") else "")
        + f"Budget: {cfg.budget} environment steps per RL run; training seeds {list(cfg.seeds)}; every cell on "
        f"the same {e['episodes']} test episodes (seeds {e['seed_base']}.., disjoint from the tune seeds every "
        f"choice of a setting saw); regime `{cfg.run.regime}`; base policy `{cfg.checkpoint}`{_digest_note(p['checkpoint_digest'])}, async `{cfg.chunking.strategy}` "
        f"switching for the residual variants, anchor data from `run.demonstrations={cfg.run.demonstrations}`. "
        "Success: mean over seeds x episodes with a 95% two-level "
        "bootstrap interval (training seeds, then episodes). Anchored start: the same run after anchor "
        "pretraining, before any online step (\"= the base's outcomes\": on those seeds the start's test "
        "outcomes are the base's on every episode, as when the start guard drops an anchored start below the "
        "base on the tune episodes and RL starts from the base; inferred from the outcomes); gain: "
        "final - start, paired on the same seeds and episodes (\"end guard\": on those seeds the trained "
        "residual was below its start on the guard's tune episodes and the start was deployed, `run.end_guard`; the "
        "trained one's success and test outcomes are in the cell, `trained_per_seed`, `trained_outcomes_by_seed`). "
        "`bc_control`: the same learner with the critic's influence off (BC on the anchor rows, fading with "
        "the learner's anchor weight, after which the actor stops moving); `uniform_control`: AWR with every "
        "row weighted 1, the anchor rows fading as in the learner. Ceiling: `arli bench ceiling`'s projected expert "
        f"through the same scheduler at the default bound (`run.learner.residual_scale`), no gripper authority. "
        "Steps to 80%: the evaluated env step at which every seed reached 80% (tune episodes).\n\n"
        + head + "\n".join(rows) + "\n\n" + _runs_markdown(p["cells"], cfg.report_dir)
        + f"![latency sweep]({cfg.name}.png)\n\n"
        + verdict_markdown(p["verdicts"], cfg.budget, p.get("looks", 1)) + f"\nMachine: {p['machine']}\n"
    )
