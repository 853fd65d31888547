"""``arli bench latency-sweep``: the method's claims, measured.

Success (mean ± std over seeds, ``eval_episodes`` per seed) of the base policy (sync, async
naive, async rtc) and of residual RL with each state variant of DESIGN.md §2 at every delay,
the zero-delay references (``standard_d0``, ``stepwise_d0``), two controls at d = 4 on the
same anchor data (``bc_control``: the same learner with the critic's influence off;
``anchor_only``: the anchor-pretrained start, no online step) and environment steps to 80%.
Every variant uses the same evaluation code, seeds, episode count, regime and step budget.
Cells run in worker processes and are cached as they finish (``cache``), so an interrupted
sweep resumes where it stopped. A cached cell stays valid while its settings and the
checkpoint's content are the same and every repository source file the cell actually ran
(recorded per row) is unchanged: editing the transport or the Franka driver keeps a
sweep's cells, editing the learner invalidates them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace

import numpy as np
from tqdm import tqdm

from arli.bench.common import machine_info, print_last_line_json, success_plot, write_report
from arli.pretrain import ensure_base_policy
from arli.config import SWEEP_VARIANTS, LatencySweepConfig
from arli.stats import success_ci

BASE_VARIANTS = {"base_sync": "sync", "base_naive": "naive", "base_rtc": "rtc"}
# sweep variant -> (state variant, fixed delay or None = every delay of the sweep)
RL_VARIANTS = {"arli": ("arli", None), "arli_no_committed": ("arli_no_committed", None),
               "arli_no_midobs": ("arli_no_midobs", None), "standard": ("standard", None),
               "standard_d0": ("standard", 0), "stepwise_d0": ("stepwise", 0),
               "bc_control": ("arli", 4), "anchor_only": ("arli", 4)}
IDEAL = "standard_d0"


def run_cell(cfg_dict: dict, variant: str, delay: int, seed: int) -> dict:
    """One (variant, delay, seed) cell; runs in a worker process."""
    import torch  # noqa: PLC0415

    from arli.chunking import ChunkingConfig  # noqa: PLC0415
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.latency import FixedLatency  # noqa: PLC0415
    from arli.policies.load import load_base_policy  # noqa: PLC0415
    from arli.rl.config import InterventionSpec, LearnerConfig, RunSpec  # noqa: PLC0415
    from arli.rollout import evaluate_policy  # noqa: PLC0415
    from sim_envs import make_env, task_name  # noqa: PLC0415
    from sim_envs.experts import EXPERTS  # noqa: PLC0415

    torch.set_num_threads(cfg_dict["threads_per_worker"])
    name = task_name(cfg_dict["env"]["name"])
    dt = cfg_dict["env"]["dt"]
    env = make_env(name, dt=dt)
    base = load_base_policy(cfg_dict["checkpoint"], env.unwrapped.instruction, name,
                            cfg_dict["chunk_size"])
    latency = FixedLatency(delay * dt)
    episodes = cfg_dict["eval_episodes"]
    cell = {"variant": variant, "delay_steps": delay, "seed": seed}
    chunking = ChunkingConfig(**cfg_dict["chunking"])
    test_seed = cfg_dict["run"]["test_seed"]  # every training seed on the same test episodes: paired cells
    if variant in BASE_VARIANTS:
        out = evaluate_policy(env, base, chunking, latency, episodes, test_seed, strategy=BASE_VARIANTS[variant])
        return {**cell, "success": out["success"], "outcomes": out["outcomes"],
                "steps_to_80": 0 if out["success"] >= 0.8 else None, "sources": loaded_sources()}
    run = dict(cfg_dict["run"])
    spec = RunSpec(**{**run, "learner": LearnerConfig(**run.pop("learner")),
                      "intervention": InterventionSpec(**run.pop("intervention"))})
    spec = replace(spec, variant=RL_VARIANTS[variant][0], seed=seed, regime=cfg_dict["regime"],
                   env_steps=cfg_dict["budget"], eval_every=max(1, cfg_dict["budget"] // 4))
    if variant == "bc_control":  # the same learner, the critic steers nothing
        spec = replace(spec, learner=replace(spec.learner, q_weight=0.0))
    model = getattr(base, "model", None)
    ft = Finetuner(spec, env, base, EXPERTS[name], latency,
                   None if model is None else model.state_mean.numpy(),
                   None if model is None else model.state_std.numpy(), chunking)
    ft.prepare()
    if variant != "anchor_only":
        ft.train(progress=False)
    final = ft.evaluate(episodes, seed=test_seed)
    reached = next((h["env_steps"] for h in ft.history if h["success"] >= 0.8), None)
    return {**cell, "success": final["success"], "outcomes": final["outcomes"], "steps_to_80": reached,
            "curve": ft.history, "sources": loaded_sources()}


def plan(cfg: LatencySweepConfig) -> list[tuple[str, int, int]]:
    """All (variant, delay, seed) cells, the headline delay (4) and the ideal reference
    first, so an interrupted sweep still answers the main question."""
    cells = []
    for seed in cfg.seeds:
        for variant in cfg.variants:
            if variant == IDEAL and _ideal_is_standard_d0(cfg):
                continue  # the same runs as `standard` at d = 0: not computed twice
            cells += [(variant, d, seed) for d in variant_delays(variant, cfg)]
    order = {4: 0, 0: 1}
    return sorted(cells, key=lambda c: (order.get(c[1], 2), c[1], c[2]))


def variant_delays(variant: str, cfg: LatencySweepConfig) -> list[int]:
    fixed = RL_VARIANTS.get(variant, (None, None))[1]
    return list(cfg.delay_steps) if fixed is None else [fixed]


def _ideal_is_standard_d0(cfg: LatencySweepConfig) -> bool:
    return "standard" in cfg.variants and 0 in cfg.delay_steps


def fingerprint(cfg_dict: dict, variant: str) -> str:
    """Hash of every setting a cell's result depends on: a changed learner recipe, base
    checkpoint, budget or evaluation invalidates the cached cells it affects (and only those:
    base-policy cells ignore the residual learner's settings). The code a cell ran is
    checked file by file (``sources``), not here."""
    keys = {"env": cfg_dict["env"], "checkpoint": cfg_dict["checkpoint_digest"], "cell": cfg_dict["cell_code"],
            "eval_episodes": cfg_dict["eval_episodes"], "chunk_size": cfg_dict["chunk_size"],
            "chunking": cfg_dict["chunking"]}
    if variant not in BASE_VARIANTS:
        keys.update(run=cfg_dict["run"], budget=cfg_dict["budget"], regime=cfg_dict["regime"])
    return hashlib.sha1(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]


def load_cache(path: str, cfg_dict: dict) -> dict[tuple, dict]:
    """Cached cells whose settings match and every source file they ran is unchanged."""
    done = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if (row.get("fingerprint") == fingerprint(cfg_dict, row["variant"])
                        and sources_unchanged(row.get("sources"))):
                    done[(row["variant"], row["delay_steps"], row["seed"])] = row
    return done


def aggregate(rows: list[dict], cfg: LatencySweepConfig) -> list[dict]:
    if IDEAL in cfg.variants and _ideal_is_standard_d0(cfg):
        rows = [r for r in rows if r["variant"] != IDEAL]
        rows += [{**r, "variant": IDEAL} for r in rows if r["variant"] == "standard" and r["delay_steps"] == 0]
    out = []
    for variant in cfg.variants:
        for d in variant_delays(variant, cfg):
            group = [r for r in rows if r["variant"] == variant and r["delay_steps"] == d]
            if not group:
                continue
            succ = np.array([r["success"] for r in group])
            reached = [r["steps_to_80"] for r in group]
            paired = all("outcomes" in r for r in group) and len({len(r["outcomes"]) for r in group}) == 1
            out.append({
                "variant": variant, "delay_steps": d, "success_mean": round(float(succ.mean()), 4),
                "success_std": round(float(succ.std()), 4), "seeds": len(group),
                # 95% bootstrap interval over training seeds and the shared test episodes
                "ci95": [round(x, 4) for x in success_ci([r["outcomes"] for r in group])] if paired else None,
                # every seed must reach 80%; the slowest seed decides
                "steps_to_80": None if any(x is None for x in reached) else int(max(reached)),
            })
    return out


def verdicts(cells: list[dict]) -> list[dict]:
    """The paper's expected results (issue 8), each computed from the cell means."""
    by = {(c["variant"], c["delay_steps"]): c["success_mean"] for c in cells}
    arli = by.get(("arli", 4))
    rules = [
        ("arli@4 >= 0.90", [("arli", 4)], lambda: arli >= 0.9),
        ("arli@4 >= standard@0 - 0.05", [("arli", 4), (IDEAL, 0)], lambda: arli >= by[(IDEAL, 0)] - 0.05),
        ("standard@4 <= arli@4 - 0.20", [("arli", 4), ("standard", 4)], lambda: by[("standard", 4)] <= arli - 0.2),
        ("arli_no_committed@4 < arli@4", [("arli", 4), ("arli_no_committed", 4)],
         lambda: by[("arli_no_committed", 4)] < arli),
        ("arli_no_midobs@4 < arli@4", [("arli", 4), ("arli_no_midobs", 4)], lambda: by[("arli_no_midobs", 4)] < arli),
        ("arli@4 >= bc_control@4 + 0.10", [("arli", 4), ("bc_control", 4)], lambda: arli >= by[("bc_control", 4)] + 0.1),
        ("arli@4 > anchor_only@4", [("arli", 4), ("anchor_only", 4)], lambda: arli > by[("anchor_only", 4)]),
    ]
    out = []
    for text, needs, check in rules:
        values = {f"{v}@{d}": by.get((v, d)) for v, d in needs}
        held = None if None in values.values() else bool(check())
        out.append({"claim": text, "holds": held, "values": values})
    return out


def verdict_markdown(checks: list[dict], budget: int) -> str:
    lines = []
    for c in checks:
        status = {True: "holds", False: "does NOT hold", None: "not evaluated"}[c["holds"]]
        values = ", ".join(f"{k} = {v:.2f}" if v is not None else f"{k} missing" for k, v in c["values"].items())
        lines.append(f"* `{c['claim']}`: **{status}** ({values})")
    return f"Expected results (from the paper), at budget {budget} env steps per run:\n\n" + "\n".join(lines) + "\n"


def plot(cells: list[dict], path: str, title: str) -> None:
    """Success vs delay per variant; with one or two delays (a d = 4 sweep and its zero-delay
    references) a bar per (variant, delay) says more than lines with one point."""
    delays = sorted({c["delay_steps"] for c in cells})
    if len(delays) <= 2:
        with success_plot(path, title, "", "success rate (mean ± std over seeds)", figsize=(8, 4.5),
                          legend_size=8) as ax:
            for d in delays:
                pts = [(i, c["success_mean"], c["success_std"]) for i, c in enumerate(cells) if c["delay_steps"] == d]
                x, y, e = zip(*pts)
                ax.bar(x, y, yerr=e, capsize=3, label=f"d = {d}")
            ax.set_xticks(range(len(cells)), [c["variant"] for c in cells], rotation=40, ha="right", fontsize=8)
        return
    with success_plot(path, title, "delay_steps d (dt = 50 ms)", "success rate (mean ± std over seeds)",
                      figsize=(7, 4.5), legend_size=8) as ax:
        for variant in dict.fromkeys(c["variant"] for c in cells):
            pts = sorted((c["delay_steps"], c["success_mean"], c["success_std"]) for c in cells
                         if c["variant"] == variant)
            if len(pts) == 1:  # a zero-delay reference or a d = 4 control: one marker
                ax.errorbar([pts[0][0]], [pts[0][1]], yerr=[pts[0][2]], marker="s", ls="none", capsize=3,
                            label=variant)
                continue
            x, y, e = zip(*pts)
            ax.errorbar(x, y, yerr=e, marker="o", ls="--" if variant.startswith("base") else "-",
                        capsize=3, label=variant)


def checkpoint_digest(path: str) -> str:
    """Content hash of a checkpoint directory (not its path: a re-trained base invalidates)."""
    h = hashlib.sha1()
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            h.update(name.encode())
            with open(os.path.join(root, name), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:12]


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE_PACKAGES = ("arli/", "sim_envs/", "robot_drivers/")
# cannot change a cell's result: the CLI, reports, and the command schemas (``arli/config.py``:
# the values it gives reach a cell only through the settings the fingerprint hashes)
REPORT_ONLY_SOURCES = ("arli/cli.py", "arli/commands/", "arli/bench/", "arli/config.py")


def _file_digest(rel: str) -> str | None:
    try:
        with open(os.path.join(REPO, rel), "rb") as fh:
            return hashlib.sha1(fh.read()).hexdigest()[:16]
    except OSError:
        return None


_FIRST_SEEN: dict[str, str | None] = {}  # per process: a module's digest when it was first seen loaded


def loaded_sources() -> dict[str, str | None]:
    """{repo-relative path: content digest} of every repository module this process has
    imported (minus the CLI and report code): after a cell ran, exactly the code its result
    can depend on (a worker's earlier cells can only add files, never hide one). A file's
    digest is the one it had when first seen in this process (``init_worker`` sees the
    cell's modules before any cell runs), so an edit made while a sweep runs cannot be
    credited to cells that ran the code from before it."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not os.path.abspath(path).startswith(REPO + os.sep):
            continue
        rel = os.path.relpath(os.path.abspath(path), REPO).replace(os.sep, "/")
        if rel.startswith(CODE_PACKAGES) and not rel.startswith(REPORT_ONLY_SOURCES) and rel not in _FIRST_SEEN:
            _FIRST_SEEN[rel] = _file_digest(rel)
    return dict(sorted(_FIRST_SEEN.items()))


def init_worker() -> None:
    """Pool initializer: import what cells run and note the files' digests right away."""
    import arli.finetune  # noqa: F401, PLC0415
    import arli.rollout  # noqa: F401, PLC0415
    import sim_envs.experts  # noqa: F401, PLC0415

    loaded_sources()


def sources_unchanged(sources: dict[str, str] | None) -> bool:
    """True when every file a cached cell ran still has the content it had (a row without
    the list, from an older sweep, is stale)."""
    return bool(sources) and all(_file_digest(rel) == digest for rel, digest in sources.items()
                                 if not rel.startswith(REPORT_ONLY_SOURCES))


def cell_settings(cfg: LatencySweepConfig) -> dict:
    """What a worker needs to run a cell (plain data: it crosses the process boundary)."""
    return {"env": asdict(cfg.env), "checkpoint": cfg.checkpoint, "eval_episodes": cfg.eval_episodes,
            "checkpoint_digest": checkpoint_digest(cfg.checkpoint),
            "cell_code": hashlib.sha1(inspect.getsource(run_cell).encode()).hexdigest()[:12],
            "regime": cfg.run.regime,
            "budget": cfg.budget, "run": asdict(cfg.run), "chunking": asdict(cfg.chunking),
            "chunk_size": cfg.pretrain.policy.chunk_size,
            "threads_per_worker": max(1, (os.cpu_count() or 2) // cfg.workers)}


def main(cfg: LatencySweepConfig) -> int:
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    cfg_dict = cell_settings(cfg)
    os.makedirs(os.path.dirname(cfg.cache) or ".", exist_ok=True)
    done = load_cache(cfg.cache, cfg_dict)
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
                tqdm.write(f"{row['variant']:>18} d={row['delay_steps']} seed={row['seed']}: "
                           f"success {row['success']:.2f}")
    missing = [c for c in plan(cfg) if c not in done]
    cells = aggregate([done[c] for c in plan(cfg) if c in done], cfg)
    checks = verdicts(cells)
    payload = {"env": cfg.env.name, "regime": cfg.run.regime, "budget": cfg.budget, "cells": cells,
               "verdicts": checks}
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(cells, os.path.join(cfg.report_dir, "latency_sweep.png"),
         f"{cfg.env.name}: success vs delay (budget {cfg.budget} steps, {len(cfg.seeds)} seeds)")
    md = markdown(cells, cfg) + (f"\nNot run yet ({len(missing)} cells): {missing}\n" if missing else "")
    write_report(cfg.report_dir, "latency_sweep", {**payload, "missing": missing}, md)
    print(md)
    print_last_line_json(payload)
    return 0


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
    if list(cfg.variants) != list(SWEEP_VARIANTS):
        out.append(f"'variants=[{','.join(cfg.variants)}]'")
    return out


def markdown(cells: list[dict], cfg: LatencySweepConfig) -> str:
    delays = sorted({*cfg.delay_steps, *(c["delay_steps"] for c in cells)})  # the d = 0 references too
    head = "| variant | " + " | ".join(f"d = {d}" for d in delays) + " | steps to 80% (d = 4; references: d = 0) |\n"
    head += "|---|" + "---:|" * (len(delays) + 1) + "\n"
    by = {(c["variant"], c["delay_steps"]): c for c in cells}
    rows = []
    for variant in cfg.variants:
        vals = []
        for d in delays:
            c = by.get((variant, d))
            partial = f" ({c['seeds']} seeds)" if c and c["seeds"] < len(cfg.seeds) else ""
            vals.append(f"{c['success_mean']:.2f} ± {c['success_std']:.2f}{partial}" if c else "—")
        s80 = by.get((variant, 4), by.get((variant, 0)))
        reached = "—" if s80 is None else ("not reached" if s80["steps_to_80"] is None else s80["steps_to_80"])
        rows.append(f"| {variant} | " + " | ".join(vals) + f" | {reached} |")
    command = (f"arli bench latency-sweep env={cfg.env.name} budget={cfg.budget} "
               f"'seeds={list(cfg.seeds)}' 'delay_steps={list(cfg.delay_steps)}' eval_episodes={cfg.eval_episodes}"
               + "".join(f" {o}" for o in non_default_settings(cfg)))
    return (
        f"# Latency sweep — `{cfg.env.name}`\n\n"
        f"Command: `{command}`\n\n"
        f"Budget: {cfg.budget} environment steps per RL run; {len(cfg.seeds)} seeds "
        f"({cfg.seeds}); {cfg.eval_episodes} evaluation episodes per seed and cell (the same "
        f"seeds for every variant); base policy `{cfg.checkpoint}` (content digest "
        f"`{checkpoint_digest(cfg.checkpoint)}`: a base re-trained on another machine differs), async `{cfg.chunking.strategy}` "
        "switching for the residual variants. `standard_d0` is the idealised reference (zero "
        "delay; the same runs as `standard` at d = 0), shown in the d = 0 column. `—`: cell not "
        "run. Steps to 80%: the evaluated env step at which every seed reached 80%.\n\n" + head + "\n".join(rows) + "\n\n![latency sweep](latency_sweep.png)\n\n"
        + verdict_markdown(verdicts(cells), cfg.budget) + f"\nMachine: {machine_info()}\n"
    )
