"""Finished ``arli finetune`` runs as residual-RL cells of ``arli bench latency-sweep``
(``'runs=[<dir>, ...]'``), so a sweep whose runs do not fit one sitting (the issue's 200k
budget: about 100 minutes per batch of six runs on 2 cores) grows from runs made a batch at a
time and committed with their ``config.yaml``, ``summary.json`` and ``eval_test.json``.

A run is taken only as one of the sweep's cells: the same task, chunking, budget, regime, test
episodes and base (``base_digest``, and the base alone's outcomes on every test episode where the
sweep has that cell), its training seed among the sweep's, not resumed, and every residual
setting equal to the cell's (``cell_spec``) but the tune curve's spacing and the run's own
test-episode count (``FREE``: the test episodes are checked as evaluated). Its summary must
agree with its config. Where the run recorded them (runs saved since the summary has
``sources`` and ``torch_threads``), the code it ran must be the code here and its torch threads
the sweep's ``threads``; a run without them is taken and the report says which cells rest on
code it cannot check. Anything else is refused with what differs."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from arli.bench.latency_sweep import RL_VARIANTS, base_variant, cell_spec, variant_delays
from arli.bench.provenance import REPORT_ONLY_SOURCES, sources_unchanged
from arli.bench.runs import control_of, load
from arli.bench.tune import flatten
from arli.config import ConfigError, LatencySweepConfig
from arli.runs import load_run_config
from sim_envs import task_name

# run settings that change no number a cell reports: where the tune curve is sampled (the
# curve's points are re-read at the sweep's marks) and how many test episodes the run meant to
# evaluate (what it evaluated is checked against the sweep's episodes)
FREE = ("eval_every", "test_episodes")


def differences(got: dict, want: dict, prefix: str) -> list[str]:
    """``prefix.key=<run's> (the sweep's: <want>)`` for every flattened key that differs."""
    a, b = flatten(got), flatten(want)
    return [f"{prefix}{k}={a.get(k)!r} (the sweep's: {b.get(k)!r})" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def steps_to_80(history: list[dict], budget: int) -> int | None:
    """The sweep's "steps to 80%" from a run's tune curve: the curve read at the sweep's
    evaluation points (each quarter of the budget; the run's point nearest each, the step-0
    point left out), the first at or above 0.8."""
    points = [(h["env_steps"], h["success"]) for h in history or [] if h["env_steps"] > 0]
    if not points:
        return None
    steps = np.array([p[0] for p in points], float)
    for q in (1, 2, 3, 4):
        at, success = points[int(np.argmin(np.abs(steps - q * budget / 4)))]
        if success >= 0.8:
            return int(at)
    return None


def run_row(run_dir: str, cfg: LatencySweepConfig, cfg_dict: dict, base_outcomes: dict[int, list[int]]) -> dict:
    """One run as a sweep row (the keys ``run_cell`` writes, plus ``run_dir``).
    ``base_outcomes``: delay -> the sweep's base-alone outcomes in the residual's loop, where
    it has them. Raises ``ConfigError`` naming the first thing that makes the run another cell."""
    saved = load_run_config(run_dir)
    ev, summary = load(run_dir)
    where = f"runs: {run_dir}"
    variant = control_of(run_dir) or saved.run.variant  # a named control by its learner, else its state
    if variant not in RL_VARIANTS or variant not in cfg.variants:
        raise ConfigError(f"{where} is a `{variant}` run; this sweep's residual-RL variants are "
                          f"{[v for v in cfg.variants if v in RL_VARIANTS]}")
    delay, seed = saved.delay_steps, saved.run.seed
    if delay is None or delay not in variant_delays(variant, cfg):
        raise ConfigError(f"{where} ran at delay_steps={delay}; the sweep runs {variant} at "
                          f"{variant_delays(variant, cfg)} (fixed delays only)")
    if seed not in cfg.seeds:
        raise ConfigError(f"{where} is training seed {seed}, not one of the sweep's seeds {list(cfg.seeds)}")
    if saved.resume:
        raise ConfigError(f"{where} resumed from {saved.resume}: its start is not this run's; pass runs made "
                          "from the beginning")
    if saved.run.env_steps != cfg_dict["budget"]:
        raise ConfigError(f"{where} ran {saved.run.env_steps} env steps; the sweep's budget is {cfg_dict['budget']}")
    split = {"split": "test", "seed_base": cfg_dict["run"]["test_seed"], "episodes": cfg_dict["eval_episodes"]}
    if ev["split"] != split:
        raise ConfigError(f"{where} has test episodes {ev['split']}, the sweep {split}")
    diff = differences({**asdict(saved.env), "name": task_name(saved.env.name)}, cfg_dict["env"], "env.")
    diff += differences(asdict(saved.chunking), cfg_dict["chunking"], "chunking.")
    if saved.pretrain.policy.chunk_size != cfg_dict["chunk_size"]:
        diff.append(f"pretrain.policy.chunk_size={saved.pretrain.policy.chunk_size} (the sweep's: "
                    f"{cfg_dict['chunk_size']})")
    got, want = asdict(saved.run), asdict(cell_spec(cfg_dict, variant, seed))
    for key in FREE:
        got.pop(key), want.pop(key)
    diff += differences(got, want, "run.")
    if diff:
        raise ConfigError(f"{where} is not the sweep's {variant}@{delay} cell: {'; '.join(diff)}. Pass the run's "
                          "settings to the sweep as overrides, or leave the run out")
    # the summary is the same run's (a rerun into the same output_dir rewrites all three files)
    claims = {"env": (summary.get("env"), task_name(saved.env.name)), "variant": (summary.get("variant"),
              saved.run.variant), "regime": (summary.get("regime"), saved.run.regime),
              "strategy": (summary.get("strategy"), saved.chunking.strategy),
              "delay_steps": (summary.get("delay_steps"), delay), "eval": (summary.get("eval"), ev["split"])}
    wrong = [f"{k}={a!r} (config.yaml / eval_test.json: {b!r})" for k, (a, b) in claims.items() if a != b]
    if summary.get("env_steps", 0) < saved.run.env_steps:
        wrong.append(f"env_steps={summary.get('env_steps')!r} (config.yaml: {saved.run.env_steps})")
    if wrong:
        raise ConfigError(f"{where}: summary.json is not this config's finished run ({'; '.join(wrong)}); rerun it")
    digest = summary.get("base_digest")
    if digest is not None and digest != cfg_dict["checkpoint_digest"]:
        raise ConfigError(f"{where} finetuned base {digest}; the sweep's is {cfg_dict['checkpoint_digest']}")
    base = [int(x) for x in ev["outcomes"]["base"]]
    if delay in base_outcomes and base != list(base_outcomes[delay]):
        differ = sum(a != b for a, b in zip(base, base_outcomes[delay]))
        raise ConfigError(f"{where}: the base alone succeeded on other test episodes there than in the sweep's "
                          f"base cell at d = {delay} ({differ} of {len(base)} differ): another base, machine or "
                          "thread count")
    if digest is None and delay not in base_outcomes:
        raise ConfigError(f"{where} saved no base_digest: add `{base_variant(cfg.chunking.strategy)}` at "
                          f"d = {delay} to the sweep's variants to check its base")
    sources, threads = summary.get("sources"), summary.get("torch_threads")
    if sources is not None and not sources_unchanged(sources):
        changed = sorted(k for k, v in sources.items() if not k.startswith(REPORT_ONLY_SOURCES)
                         and not sources_unchanged({k: v}))
        raise ConfigError(f"{where} ran other code than is here ({', '.join(changed[:5])} changed): rerun it")
    if threads is not None and threads != cfg_dict["threads_per_worker"]:
        raise ConfigError(f"{where} ran {threads} torch threads, the sweep's cells {cfg_dict['threads_per_worker']} "
                          "(`threads`)")
    out = ev["outcomes"]
    missing = [k for k in ("start", "trained", "final") if k not in out]
    if missing:
        raise ConfigError(f"{where}: eval_test.json has no {missing} outcomes (a run saved before they were "
                          "written, or without an anchored start); rerun it")
    return {"variant": variant, "delay_steps": delay, "seed": seed, "budget": saved.run.env_steps,
            "success": float(ev["success"]["final"]), "outcomes": [int(x) for x in out["final"]],
            "start_success": float(ev["success"]["start"]), "start_outcomes": [int(x) for x in out["start"]],
            "trained_outcomes": [int(x) for x in out["trained"]], "end_guard": summary.get("end_guard"),
            "steps_to_80": steps_to_80(summary.get("history"), saved.run.env_steps),
            "curve": summary.get("history"), "sources": sources, "torch_threads": threads, "run_dir": run_dir}


def run_rows(cfg: LatencySweepConfig, cfg_dict: dict, done: dict[tuple, dict]) -> dict[tuple, dict]:
    """(variant, delay, seed) -> row for every run of ``cfg.runs``, each run's base alone checked
    against the sweep's base cell at its delay where ``done`` (the sweep's rows) has one; two
    runs for one cell are refused."""
    base = base_variant(cfg.chunking.strategy)
    base_outcomes: dict[int, list[int]] = {}
    for (variant, delay, _), row in sorted(done.items(), key=lambda kv: str(kv[0])):
        if variant == base:
            base_outcomes.setdefault(delay, row["outcomes"])
    rows: dict[tuple, dict] = {}
    for run_dir in cfg.runs:
        row = run_row(run_dir, cfg, cfg_dict, base_outcomes)
        key = (row["variant"], row["delay_steps"], row["seed"])
        if key in rows:
            raise ConfigError(f"runs: {rows[key]['run_dir']} and {run_dir} are both the {key[0]}@{key[1]} cell of "
                              f"seed {key[2]}; pass one")
        rows[key] = row
    return rows
