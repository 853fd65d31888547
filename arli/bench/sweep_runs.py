"""Finished ``arli finetune`` runs as residual-RL cells of ``arli bench latency-sweep``
(``'runs=[<dir>, ...]'``), so a sweep whose runs do not fit one sitting (the issue's 200k
budget: about 100 minutes per batch of six runs on 2 cores) grows from runs made a batch at a
time and committed with their ``config.yaml``, ``summary.json`` and ``eval_test.json``.

A run is taken only where it is one of the sweep's cells as the sweep would have run it: the
same task, chunking, budget, regime, test episodes and base (``base_digest``, and the base
alone's outcomes on every test episode where the sweep has that cell), its training seed among
the sweep's, and every residual setting equal to the cell's (``cell_spec``), where only the tune
curve's spacing (``run.eval_every``) may differ. Anything else is refused with the setting that
differs, so a report never pools a cell from another recipe or base."""

from __future__ import annotations

from dataclasses import asdict

from arli.bench.latency_sweep import RL_VARIANTS, cell_spec, variant_delays
from arli.bench.runs import control_of, load
from arli.config import ConfigError, LatencySweepConfig
from arli.runs import load_run_config
from sim_envs import task_name

# settings of a run that change nothing a cell reports but where the curve is sampled
FREE = ("eval_every",)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _differences(got: dict, want: dict) -> list[str]:
    a, b = _flat(got), _flat(want)
    return [f"{k}={a.get(k)!r} (the sweep's cell: {b.get(k)!r})" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


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
    delay = saved.delay_steps
    if delay is None or delay not in variant_delays(variant, cfg):
        raise ConfigError(f"{where} ran at delay_steps={delay}; the sweep runs {variant} at "
                          f"{variant_delays(variant, cfg)} (fixed delays only)")
    seed = saved.run.seed
    if seed not in cfg.seeds:
        raise ConfigError(f"{where} is training seed {seed}, not one of the sweep's seeds {list(cfg.seeds)}")
    env = {**asdict(saved.env), "name": task_name(saved.env.name)}
    checks = [("env", env, cfg_dict["env"]), ("chunking", asdict(saved.chunking), cfg_dict["chunking"]),
              ("pretrain.policy.chunk_size", saved.pretrain.policy.chunk_size, cfg_dict["chunk_size"]),
              ("test episodes", ev["split"], {"split": "test", "seed_base": cfg_dict["run"]["test_seed"],
                                              "episodes": cfg_dict["eval_episodes"]})]
    for name, got, want in checks:
        if got != want:
            raise ConfigError(f"{where} has {name} {got}, the sweep {want}")
    if saved.run.env_steps != cfg_dict["budget"]:
        raise ConfigError(f"{where} ran {saved.run.env_steps} env steps; the sweep's budget is {cfg_dict['budget']}")
    want = asdict(cell_spec(cfg_dict, variant, seed))
    got = asdict(saved.run)
    for key in FREE:
        got.pop(key), want.pop(key)
    diff = _differences(got, want)
    if diff:
        raise ConfigError(f"{where} is not the sweep's {variant}@{delay} cell: run.{'; run.'.join(diff)}. Pass "
                          "the run's settings to the sweep as overrides, or leave the run out")
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
        raise ConfigError(f"{where} saved no base_digest: add the base's cell (variant "
                          f"{cfg.chunking.strategy}'s base) at d = {delay} to the sweep to check its base")
    out = ev["outcomes"]
    return {"variant": variant, "delay_steps": delay, "seed": seed, "budget": saved.run.env_steps,
            "success": float(ev["success"]["final"]), "outcomes": [int(x) for x in out["final"]],
            "start_success": float(ev["success"]["start"]), "start_outcomes": [int(x) for x in out["start"]],
            "trained_outcomes": [int(x) for x in out["trained"]], "end_guard": summary.get("end_guard"),
            "steps_to_80": summary.get("steps_to_80"), "curve": summary.get("history"), "run_dir": run_dir}


def run_rows(cfg: LatencySweepConfig, cfg_dict: dict, base_outcomes: dict[int, list[int]]) -> dict[tuple, dict]:
    """(variant, delay, seed) -> row for every run of ``cfg.runs``; two runs for one cell are refused."""
    rows: dict[tuple, dict] = {}
    for run_dir in cfg.runs:
        row = run_row(run_dir, cfg, cfg_dict, base_outcomes)
        key = (row["variant"], row["delay_steps"], row["seed"])
        if key in rows:
            raise ConfigError(f"runs: {rows[key]['run_dir']} and {run_dir} are both the {key[0]}@{key[1]} cell of "
                              f"seed {key[2]}; pass one")
        rows[key] = row
    return rows
