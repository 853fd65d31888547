"""``arli bench tune 'runs=[<reference dir>,<dir>,...]' name=<report>``: choose a setting on the
tune seeds, by code. Every finetune run (the first is the reference, e.g. the current default)
is loaded as ``arli eval`` loads it and its trained residual (not a start its end guard
deployed) evaluated on the same ``episodes`` tune episodes (seeds ``run.tune_seed ..``, never
the test seeds), the base alone once on them. Runs whose settings differ only in ``run.seed``
(and in ``NOT_A_SETTING``) are one setting on several training seeds (where any setting has
several, every setting on the reference's seeds, paired by seed); per setting: the settings
that differ from the reference (as Hydra overrides), its tune success with a
95% two-level bootstrap interval (training seeds, episodes) and the paired gains vs the
reference and vs the base. The choice: the highest tune success among the settings whose
paired gain over the reference has a 95% interval above 0 (``margin``); none -> the reference is
kept. ``margin=-0.05 prefer=cost``: the cheapest (learner-update time) of the reference and the
settings no more than 0.05 worse, by the same interval — a cheaper learner that is as good;
``prefer=dip``: of the same, the one whose tune curve dips least below its start while it learns.
-> ``<report_dir>/<name>.{json,md,png}``. With ``outcomes_from=[<report>.json,...]`` the runs'
outcomes come from the committed one-seed reports that judged them (``reported_outcomes``), so
runs judged seed by seed pool into one choice; a run in none of them is evaluated.

These are tune numbers, for choosing: the chosen setting's numbers to report come from its
test seeds (``arli finetune`` / ``arli bench runs``), which no choice saw."""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable

import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from arli.bench.common import machine_info, print_last_line_json, run_configs, success_plot, write_report
from arli.config import BenchTuneConfig, ConfigError, FinetuneConfig
from arli.rl.config import TRAIN_SEED_BLOCKS, disjoint, outside_training
from arli.stats import gain_ci, success_ci, verdict

# what every compared run must share: the task, the delay, how chunks execute and the base
# (one base alone, evaluated once, is every run's baseline) and where the tune seeds start
MATCHED = ("env", "delay_steps", "latency", "chunking", "checkpoint", "run.tune_seed")

# evaluate(run_dir, run_cfg, seed_base, episodes, with_base) -> {"final": [bool] * episodes,
# "base": [bool] * episodes or None, "env_steps", "env", "delay_steps", "split"}
Evaluate = Callable[[str, FinetuneConfig, int, int, bool], dict]


# -- the settings of a run ----------------------------------------------------------------
def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config (dicts) -> ``{"a.b.c": value}``; lists and empty dicts are values."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_dict(cfg: FinetuneConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def hydra_value(value: Any) -> str:
    """A value as a Hydra override writes it (``true``, ``null``, ``[a,b]``, quoted strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = text and not set(text) & set(" ,[]{}()=:'\"\\$") and text.lower() not in ("true", "false", "null")
    try:
        float(text)
        plain = False  # a string that reads as a number
    except ValueError:
        pass
    return text if plain else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


AWR_ONLY = ("awr_advantage", "awr_weights", "awr_temperature", "awr_max_weight")  # inert under dpg / select


def settings_diff(reference: dict[str, Any], run: dict[str, Any], section: str = "run") -> list[str]:
    """The ``key=value`` Hydra overrides that turn the reference's ``section`` into the run's
    (both flattened): changed keys, ``+key=value`` for keys only the run has, ``~key`` for
    keys only the reference has."""
    ref = flatten(reference.get(section) or {}, f"{section}.")
    other = flatten(run.get(section) or {}, f"{section}.")
    if other.get(f"{section}.learner.actor_update") != "awr":  # awr's own settings do nothing here
        for name in AWR_ONLY:
            ref.pop(f"{section}.learner.{name}", None)
            other.pop(f"{section}.learner.{name}", None)
    out = []
    for key, value in other.items():
        if key not in ref:
            out.append(f"+{key}={hydra_value(value)}")
        elif ref[key] != value:
            out.append(f"{key}={hydra_value(value)}")
    out += [f"~{key}" for key in ref if key not in other]
    return out


def _matched(key: str, compare_latency: bool) -> bool:
    if key.startswith("latency.") or key == "latency":
        return compare_latency
    return any(key == p or key.startswith(p + ".") for p in MATCHED)


def check_comparable(dirs: list[str], configs: list[dict[str, Any]]) -> None:
    """Refuse runs that are not evaluated alike: another task, delay, chunk execution, base or
    tune seeds than the reference (the first); the field is named with the value to pass."""
    ref = flatten(configs[0])
    for run_dir, cfg in zip(dirs[1:], configs[1:]):
        flat = flatten(cfg)
        # the latency model decides the delay only where delay_steps is null
        compare_latency = ref.get("delay_steps") is None or flat.get("delay_steps") is None
        for key in [k for k in ref if _matched(k, compare_latency)] + [k for k in flat if k not in ref]:
            if _matched(key, compare_latency) and ref.get(key) != flat.get(key):
                raise ConfigError(
                    f"runs: {run_dir} differs from the reference {dirs[0]} in {key} ({hydra_value(flat.get(key))} vs "
                    f"the reference's {hydra_value(ref.get(key))}); every run is evaluated on the reference's tune "
                    f"episodes against one base alone: pass runs with {key}={hydra_value(ref.get(key))}")


# -- loading ------------------------------------------------------------------------------
def labels_of(dirs: list[str]) -> list[str]:
    """Each run's directory basename (its parent too where two basenames are the same)."""
    if len({os.path.realpath(d) for d in dirs}) != len(dirs):
        raise ConfigError(f"runs: a run is given twice in {dirs}; pass each run directory once")
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    if len(set(names)) != len(names):
        names = [os.path.join(*os.path.normpath(os.path.abspath(d)).split(os.sep)[-2:]) for d in dirs]
    if len(set(names)) != len(names):
        raise ConfigError(f"runs: two runs have the same label in {dirs}; pass directories with distinct names")
    return names


def load_runs(dirs: list[str], need_checkpoint: bool = True) -> tuple[list[FinetuneConfig], list[dict]]:
    """Each run's saved config and summary.json; refuses an unfinished run (no summary.json
    yet) and, where it is to be evaluated (``need_checkpoint``), one without a checkpoint."""
    configs, summaries = run_configs(dirs), []
    for run_dir in dirs:
        if need_checkpoint and not os.path.exists(os.path.join(run_dir, "checkpoint", "trainer_state.pt")):
            raise ConfigError(f"runs: {run_dir} has no checkpoint (checkpoint/trainer_state.pt); pass `arli "
                              "finetune` output directories of finished runs")
        path = os.path.join(run_dir, "summary.json")
        if not os.path.exists(path):
            raise ConfigError(f"runs: {run_dir} has no summary.json (a run not finished, or stopped); pass "
                              "`arli finetune` output directories of finished runs")
        with open(path, encoding="utf-8") as fh:
            summaries.append(json.load(fh))
    return configs, summaries


def check_tune_seeds(dirs: list[str], configs: list[FinetuneConfig], seed_base: int, episodes: int) -> None:
    """The seeds asked for are tune seeds of every run: outside its test seeds and the
    training episodes' seeds (checked before anything is loaded or evaluated)."""
    asked = range(seed_base, seed_base + episodes)
    for run_dir, cfg in zip(dirs, configs):
        test = cfg.run.test_range()
        if not disjoint(asked, test):
            raise ConfigError(f"episodes: {episodes} episodes from run.tune_seed={seed_base} reach the test seeds "
                              f"[{test.start}, {test.stop}) of {run_dir}; choices are made on tune seeds only: "
                              f"pass episodes<={test.start - seed_base}" if test.start > seed_base else
                              f"episodes: the tune seeds of {run_dir} from {seed_base} overlap its test seeds")
        if not outside_training(asked):
            blocks = " and ".join(f"[{b.start}, {b.stop})" for b in TRAIN_SEED_BLOCKS)
            raise ConfigError(f"episodes: {episodes} episodes from run.tune_seed={seed_base} reach the training "
                              f"episodes' seeds {blocks}; pass fewer episodes")


def evaluate_run(run_dir: str, run_cfg: FinetuneConfig, seed_base: int, episodes: int, with_base: bool,
                 with_final: bool = True) -> dict:
    """One run loaded as ``arli eval`` loads it, but with its trained residual also where its end
    guard deployed the start (the guard chose on these same tune episodes; the deployed residual
    would carry that choice into this one), and, ``with_base``, the base alone, on ``episodes``
    episodes from ``seed_base``, which must be its tune seeds (``with_final=False``: the base alone only)."""
    from arli.runs import make_finetuner, split_of  # noqa: PLC0415

    ft, name, delay = make_finetuner(run_cfg)
    ft.load(os.path.join(run_dir, "checkpoint"))
    split = split_of(run_cfg.run, seed_base, episodes, ft.train_ranges())
    if split != "tune":  # never a choice on the test seeds (or on the training episodes)
        raise ConfigError(f"episodes: seeds {seed_base}..{seed_base + episodes - 1} are {split} seeds of {run_dir}, "
                          "not tune seeds; pass fewer episodes")
    final = ft.evaluate(episodes, seed_base)["outcomes"] if with_final else None
    base = ft.evaluate(episodes, seed_base, residual=False)["outcomes"] if with_base else None
    out = {"final": final, "base": base, "env_steps": ft.env_steps, "env": name, "delay_steps": delay,
           "split": split, "awr": awr_spread(ft) if with_final else None}
    close = getattr(ft.env, "close", None)
    if close is not None:
        close()
    return out


def _evaluate_in_worker(run_dir: str, run_cfg: FinetuneConfig, seed_base: int, episodes: int, with_base: bool,
                        with_final: bool) -> dict:
    """``evaluate_run`` in a worker process, on one torch thread (a run's count while it trained)."""
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    return evaluate_run(run_dir, run_cfg, seed_base, episodes, with_base, with_final)


def evaluation_mode(workers: int) -> str:
    """How a report's outcomes were computed, which is what can change them (a torch thread count
    changes float sums): one thread per worker process for any ``workers`` > 1, else in this
    process at torch's default threads (as every report written before ``workers`` existed)."""
    return "one torch thread per worker process" if workers > 1 else "in-process, torch's default threads"


class ParallelEvaluate:
    """An ``Evaluate`` for ``workers=N``: ``start`` submits the runs that will be evaluated, each
    run's trained residual and (as its own job, beside the first run) the base alone, to N worker
    processes at once; a call answers from them. One torch thread per process, where the
    in-process evaluation (``workers=1``) uses torch's default: float sums, so an outcome, can
    differ between the two, so a report records its ``workers`` and ``reported_outcomes`` pools and
    evaluates across one ``evaluation_mode`` only."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.jobs: dict[tuple[str, bool], Future] = {}

    def start(self, runs: list[tuple[str, FinetuneConfig]], seed_base: int, episodes: int) -> None:
        runs = [(d, c) for d, c in runs if os.path.exists(os.path.join(d, "checkpoint", "trainer_state.pt"))]
        if not runs:  # every run read from a report (one without a checkpoint is refused where it is asked for)
            return
        self.pool = ProcessPoolExecutor(min(self.workers, len(runs) + 1))
        first_dir, first_cfg = runs[0]
        self.jobs[(first_dir, True)] = self.pool.submit(_evaluate_in_worker, first_dir, first_cfg, seed_base,
                                                         episodes, True, False)
        for run_dir, run_cfg in runs:
            self.jobs[(run_dir, False)] = self.pool.submit(_evaluate_in_worker, run_dir, run_cfg, seed_base,
                                                            episodes, False, True)

    def __call__(self, run_dir: str, run_cfg: FinetuneConfig, seed_base: int, episodes: int, with_base: bool) -> dict:
        if (run_dir, False) not in self.jobs or (with_base and (run_dir, True) not in self.jobs):
            raise RuntimeError(f"ParallelEvaluate: {run_dir} (base alone: {with_base}) was not started")
        out = self.jobs[(run_dir, False)].result()
        return {**out, "base": self.jobs[(run_dir, True)].result()["base"] if with_base else None}

    def close(self, abort: bool = False) -> None:
        """Shuts the workers down; ``abort`` (an error was raised) stops the running evaluations
        first, so the error is shown now, not after every evaluation has finished."""
        if self.pool is None:
            return
        if abort:  # the executor has no public way to stop a running job
            for proc in list((self.pool._processes or {}).values()):
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)


def reported_outcomes(paths: list[str], seed_base: int, episodes: int, fallback: Evaluate | None = None,
                      workers: int = 1) -> Evaluate:
    """An ``Evaluate`` that reads each run's tune outcomes from committed single-seed ``arli bench
    tune`` reports instead of evaluating, so runs judged in separate reports pool as one setting's
    seeds. A run's row is the one labelled with its directory's basename, and must be that run:
    the same env steps, wall time and training seed as its summary.json and config, the same task
    and delay. Every report must be on these episodes with the same base-alone outcomes (one base,
    on one machine); a run in two reports, with the same outcomes in both. A run in none of them
    is evaluated by ``fallback`` where it has a checkpoint, the base alone with the first such
    run: it must succeed on the same episodes as in the reports (the same base, acting alike
    here), which then are every run's baseline, so a new setting joins settings judged before;
    and the reports must have evaluated as ``workers`` does here (``evaluation_mode``), which the
    base alone's outcomes need not show."""
    rows: dict[str, tuple[dict, dict, str]] = {}
    base: list[int] | None = None
    first_mode = evaluation_mode(1)
    base_checked: list[bool] = []  # the base alone evaluated here once, beside the first evaluated run
    first = ""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                report = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"outcomes_from: cannot read {path} ({exc})") from None
        try:
            ev, report_base, report_rows = report["eval"], report["base"]["outcomes"], report["runs"]
            labels = [row["label"] for row in report_rows]
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"outcomes_from: {path} is not an `arli bench tune` report JSON (no {exc})") from None
        if (ev.get("seed_base"), ev.get("episodes")) != (seed_base, episodes):
            raise ConfigError(f"outcomes_from: {path} holds {ev.get('episodes')} episodes from seed "
                              f"{ev.get('seed_base')}, asked {episodes} from {seed_base}; pass "
                              f"episodes={ev.get('episodes')} and runs with run.tune_seed={ev.get('seed_base')}")
        made_with = evaluation_mode(report.get("workers", 1))  # reports before the field: in-process
        if base is None:
            base, first, first_mode = report_base, path, made_with
        elif made_with != first_mode:
            raise ConfigError(f"outcomes_from: {path} was evaluated {made_with}, {first} {first_mode} (outcomes "
                              "can differ with the thread count); pool reports made with workers=1 only, or with "
                              "workers > 1 only")
        elif report_base != base:
            raise ConfigError(f"outcomes_from: the base alone's outcomes in {path} differ from those in {first} "
                              "(another base, or the same base on another machine); pool reports of one base only")
        for label, row in zip(labels, report_rows):
            if "outcomes" not in row:
                raise ConfigError(f"outcomes_from: {path}'s row {label} pools several training seeds; "
                                  "pass reports with one run per row")
            seen = rows.setdefault(label, (row, report, path))
            if seen[0]["outcomes"] != row["outcomes"]:
                raise ConfigError(f"outcomes_from: {label} has other outcomes in {path} than in {seen[2]}")

    def evaluate(run_dir: str, run_cfg: FinetuneConfig, seed_base: int, episodes: int, with_base: bool) -> dict:
        label = os.path.basename(os.path.normpath(run_dir))
        if label not in rows:
            if fallback is None or not os.path.exists(os.path.join(run_dir, "checkpoint", "trainer_state.pt")):
                raise ConfigError(f"runs: {run_dir} has no row in outcomes_from (their runs: {', '.join(sorted(rows))})"
                                  " and no checkpoint to evaluate it (checkpoint/trainer_state.pt); pass the report "
                                  "that judged it, or the run's full output directory")
            if evaluation_mode(workers) != first_mode:
                fix = "workers=1" if first_mode == evaluation_mode(1) else "workers > 1"
                raise ConfigError(f"workers: {run_dir} would be evaluated {evaluation_mode(workers)}, the reports in "
                                  f"outcomes_from were evaluated {first_mode}; pass {fix}")
            out = fallback(run_dir, run_cfg, seed_base, episodes, not base_checked)
            if not base_checked:
                here = [int(x) for x in out["base"]]
                if here != list(base):
                    differ = sum(a != b for a, b in zip(here, base))
                    raise ConfigError(f"outcomes_from: the base alone succeeds on other episodes here than in {first} "
                                      f"({differ} of {len(base)} differ: another base, machine or code); evaluate "
                                      "every run here instead (no outcomes_from)")
                base_checked.append(True)
            return {**out, "base": base if with_base else None, "evaluated": True}
        from sim_envs.registry import task_name  # noqa: PLC0415

        row, report, path = rows[label]
        with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
            summary = json.load(fh)
        mine = {"env steps": summary.get("env_steps"), "wall s": summary.get("wall_s"), "seeds": [run_cfg.run.seed],
                "task": task_name(run_cfg.env.name), "delay_steps": run_cfg.delay_steps}
        theirs = {"env steps": row.get("env_steps"), "wall s": row.get("wall_s"), "seeds": row.get("seeds"),
                  "task": report.get("env"), "delay_steps": report.get("delay_steps")}
        differ = [f"{k} {theirs[k]} there, {mine[k]} here" for k in mine
                  if None not in (mine[k], theirs[k]) and mine[k] != theirs[k]]
        if differ:
            raise ConfigError(f"outcomes_from: the row {label} of {path} is not the run {run_dir} "
                              f"({'; '.join(differ)}); pass the report that judged {run_dir}")
        return {"final": row["outcomes"], "base": base if with_base else None, "env_steps": row.get("env_steps"),
                "env": report["env"], "delay_steps": report["delay_steps"], "split": report["eval"].get("split"),
                "awr": row.get("awr")}

    evaluate.labels = frozenset(rows)  # the runs it reads rather than evaluates
    return evaluate


def awr_spread(ft) -> dict | None:
    """How much the run's critic steers its actor at the end (``ResidualLearner.measure_awr``
    on its online replay); None when its actor update is not AWR with a Q-based advantage."""
    c = ft.learner.cfg
    if c.actor_update != "awr" or c.awr_weights != "advantage" or c.q_weight == 0 or c.awr_advantage == "td" \
            or len(ft.trainer.online) == 0:
        return None
    return {k: round(v, 6) for k, v in ft.learner.measure_awr(ft.trainer.online).items()}


# -- the numbers and the choice -----------------------------------------------------------
def _gain(after: np.ndarray, before: np.ndarray) -> dict:
    ci = gain_ci(after, before)
    return {"mean": float(np.mean(after - before)), "ci95": list(ci), "verdict": verdict(ci)}


def run_rows(labels: list[str], overrides: list[list[str]], finals: list, base, env_steps: list[int],
             wall_s: list, awr: list | None = None, seeds: list[list[int]] | None = None,
             learner_s: list | None = None) -> list[dict]:
    """Per setting: its tune success with a 95% interval and the paired gains vs the reference
    (the first) and vs the base alone, all on the same episodes. ``finals[i]``: (S, N) outcomes
    of setting i on its S training seeds in seed order (or (N,) for one run), S the same for every setting;
    the other lists hold one entry per setting (``wall_s``, ``learner_s``: the runs' mean wall and
    learner-update seconds; ``awr``: per run)."""
    base = np.asarray(base, float)[None]
    outcomes = [np.atleast_2d(np.asarray(f, float)) for f in finals]
    if len({x.shape for x in outcomes}) > 1:
        raise ValueError(f"every setting needs the same (seeds, episodes), got {[x.shape for x in outcomes]}")
    seeds = seeds or [[None]] * len(labels)
    rows = []
    for label, over, x, steps, wall, spread, s, learn in zip(labels, overrides, outcomes, env_steps, wall_s,
                                                              awr or [None] * len(labels), seeds,
                                                              learner_s or [None] * len(labels)):
        rows.append({"label": label, "overrides": over, "env_steps": steps, "wall_s": wall, "learner_s": learn,
                     "awr": spread,
                     "seeds": s, "success": float(x.mean()), "ci95": list(success_ci(x)),
                     "per_seed": [float(v) for v in x.mean(1)],
                     "gain_vs_reference": _gain(x, outcomes[0]), "gain_vs_base": _gain(x, base),
                     # every episode's outcome (0 / 1): a list for one training seed, else per seed a string
                     **({"outcomes": [int(v) for v in x[0]]} if len(x) == 1 else
                        {"outcomes_by_seed": {str(sd): "".join(str(int(v)) for v in r) for sd, r in zip(s, x)}})})
    return rows


# what two runs of one setting on two training seeds may differ in: where they write, and what
# only evaluates them (the checkpoint is saved before the test episodes; `bench latency-sweep`
# frees the same keys)
NOT_A_SETTING = ("run.seed", "output_dir", "resume", "videos", "video_size", "run.eval_every", "run.test_episodes",
                 "run.test_seed")


def setting_key(config: dict[str, Any]) -> dict[str, Any]:
    """The flattened keys of a run's config that make its setting, with the rules by which
    ``check_comparable`` and ``settings_diff`` compare runs: not ``NOT_A_SETTING``, not how the
    base was pretrained (``checkpoint`` names it), not the latency model where ``delay_steps``
    fixes the delay, not AWR's own settings where the actor update is not AWR."""
    flat = flatten(config)
    awr = flat.get("run.learner.actor_update") == "awr"
    return {k: v for k, v in flat.items()
            if k not in NOT_A_SETTING and not k.startswith("pretrain.")
            and not ((k == "latency" or k.startswith("latency.")) and flat.get("delay_steps") is not None)
            and not (not awr and k in {f"run.learner.{n}" for n in AWR_ONLY})}


def shown_overrides(reference: dict[str, Any], run: dict[str, Any], pooled: bool) -> list[str]:
    """``settings_diff`` without the keys that are no setting (``run.seed`` kept for a setting
    on one seed: which seed it ran is then part of the comparison)."""
    free = tuple(k for k in NOT_A_SETTING if not (k == "run.seed" and not pooled))
    return [o for o in settings_diff(reference, run) if o.lstrip("+~").split("=", 1)[0] not in free]


def settings_of(dirs: list[str], labels: list[str], dicts: list[dict]) -> list[list[int]]:
    """Runs grouped by setting (``setting_key``): runs that differ only in ``run.seed`` and in
    ``NOT_A_SETTING`` are one setting on several training seeds, in the order each setting first
    appears (the reference's first), each group's runs in seed order. Refuses two runs of one
    setting on one seed, a single setting (nothing to choose), and, with more than one seed per
    setting, settings on other training seeds than the reference's (gains are paired by seed)."""
    groups: dict[tuple, list[int]] = {}
    for i, d in enumerate(dicts):
        key = tuple(sorted((k, repr(v)) for k, v in setting_key(d).items()))
        groups.setdefault(key, []).append(i)
    out = []
    for members in groups.values():
        by_seed: dict[int, int] = {}
        for i in members:
            seed = dicts[i]["run"]["seed"]
            if seed in by_seed:
                raise ConfigError(f"runs: {dirs[by_seed[seed]]} and {dirs[i]} are one setting on one training seed "
                                  f"(run.seed={seed}); pass each (setting, seed) once")
            by_seed[seed] = i
        out.append([by_seed[s] for s in sorted(by_seed)])
    seeds = [[dicts[i]["run"]["seed"] for i in g] for g in out]
    if len(out) == 1:
        raise ConfigError(f"runs: every run is one setting (the reference's, on training seeds {seeds[0]}); pass "
                          "runs of another setting to compare with it")
    if any(len(g) > 1 for g in out) and any(s != seeds[0] for s in seeds):
        listed = "; ".join(f"{labels[g[0]]}: seeds {s}"
                           + (f" ({' '.join(shown_overrides(dicts[out[0][0]], dicts[g[0]], True)) or 'same settings'})"
                              if k else " (the reference)") for k, (g, s) in enumerate(zip(out, seeds)))
        raise ConfigError(f"runs: every setting needs the reference's training seeds (gains are paired by seed), "
                          f"got {listed}; pass each setting on the same seeds")
    return out


def _against(pick: dict, ref: dict, episodes: int) -> str:
    g = pick["gain_vs_reference"]
    return (f"tune success {pick['success']:.3f} vs the reference {ref['label']}'s {ref['success']:.3f}, paired gain "
            f"{g['mean']:+.3f} with 95% CI [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] on {episodes} tune episodes")


# prefer -> (the row's field, +1 when higher is better / -1 when lower, the pick's quality, where the
# field comes from, its format)
PREFERENCES = {
    "cost": ("learner_s", -1, "the least mean learner-update time",
             "each run's learner-update time (summary.json train_time_s.learner_updates)", "{:.0f} s"),
    "dip": ("curve_dip", 1, "the shallowest worst dip of the tune curve below its start",
            "each run's tune curve past its start (summary.json history)", "{:+.2f}"),
}


def curve_dip(summary: dict) -> float | None:
    """The lowest tune success of a run's learning curve after its start minus the start (<= 0 when
    it dips; None without a point past the start): how far it collapses while it learns."""
    points = [h["success"] for h in summary.get("history") or []]
    return None if len(points) < 2 else float(min(points[1:]) - points[0])


def choose(rows: list[dict], episodes: int, margin: float = 0.0, prefer: str = "success") -> dict:
    """The choice among the settings whose paired gain over the reference (the first row) has a
    95% interval with lower bound > ``margin``: ``prefer="success"``, the highest tune success
    (ties: the larger lower bound, then the earlier one), none -> the reference is kept;
    ``prefer="cost"``, the least learner-update time (``learner_s``) among those and the reference
    itself (ties: the higher tune success); ``prefer="dip"``, among the same, the shallowest worst
    dip of a run's tune curve below its start (``curve_dip``: the collapse while it learns; ties:
    the higher tune success). A negative margin asks for no more than ``-margin``
    worse than the reference (non-inferiority), e.g. to take a cheaper learner that is as good."""
    ref = rows[0]
    bound = "above 0" if margin == 0 else f"above {margin:+g}"
    better = [r for r in rows[1:] if r["gain_vs_reference"]["ci95"][0] > margin]
    if prefer in PREFERENCES:
        key, sign, best, source, fmt = PREFERENCES[prefer]
        pool = [ref, *better]
        missing = [r["label"] for r in pool if r.get(key) is None]
        if missing:
            raise ConfigError(f"prefer: {prefer} needs {source}, missing for {', '.join(missing)}; pass prefer=success")
        pick = max(pool, key=lambda r: (sign * r[key], r["success"]))
        listed = "; ".join(f"{r['label']} {fmt.format(r[key])}" for r in pool)
        head = (f"{best} ({listed}) of the "
                f"{len(pool)} settings that are the reference or whose paired gain over it has a 95% CI lower end "
                f"{bound} on {episodes} tune episodes")
        if pick is ref:
            return {"chosen": ref["label"], "why": f"the reference {ref['label']} has {head}; it is kept"}
        return {"chosen": pick["label"],
                "why": (f"{pick['label']} ({' '.join(pick['overrides']) or 'the same settings'}) has {head}; "
                        + _against(pick, ref, episodes))}
    if better:
        pick = max(better, key=lambda r: (r["success"], r["gain_vs_reference"]["ci95"][0]))
        return {"chosen": pick["label"],
                "why": (f"{pick['label']} ({' '.join(pick['overrides']) or 'the same settings'}): "
                        + _against(pick, ref, episodes) + f"; the highest tune success of the {len(better)} of "
                        f"{len(rows) - 1} settings whose gain over the reference is resolved {bound}")}
    if len(rows) == 1:
        return {"chosen": ref["label"], "why": "only the reference was given; it is kept"}
    best = max(rows[1:], key=lambda r: r["gain_vs_reference"]["mean"])
    g = best["gain_vs_reference"]
    return {"chosen": ref["label"],
            "why": (f"no setting's paired gain over the reference {ref['label']} has a 95% CI {bound} on {episodes} "
                    f"tune episodes (the largest: {best['label']} {g['mean']:+.3f}, CI [{g['ci95'][0]:+.3f}, "
                    f"{g['ci95'][1]:+.3f}], {g['verdict']}); the reference is kept")}


# -- the command --------------------------------------------------------------------------
def command_line(cfg: BenchTuneConfig) -> str:
    extra = "" if cfg.report_dir == "reports" else f" report_dir={cfg.report_dir}"
    if cfg.margin != 0 or cfg.prefer != "success":
        extra = f" margin={cfg.margin:g} prefer={cfg.prefer}{extra}"
    if cfg.outcomes_from:
        extra = f" 'outcomes_from=[{','.join(cfg.outcomes_from)}]'{extra}"
    if cfg.workers != 1:
        extra = f" workers={cfg.workers}{extra}"
    return f"arli bench tune 'runs=[{','.join(cfg.runs)}]' name={cfg.name} episodes={cfg.episodes}{extra}"


def markdown(cfg: BenchTuneConfig, payload: dict) -> list[str]:
    ev, base, rows, chosen = payload["eval"], payload["base"], payload["runs"], payload["chosen"]
    evaluated = [n for r in rows for n in r.get("evaluated", [])]
    mean = " (mean)" if len(rows[0]["seeds"]) > 1 else ""
    md = [f"# {cfg.name}: {len(rows)} settings on `{payload['env']}`, d = {payload['delay_steps']}, tune seeds",
          "", f"`{command_line(cfg)}`", "",
          f"Each run's trained residual (also where its end guard deployed the start) and the base alone on the "
          f"same {ev['episodes']} **tune** episodes (seeds "
          f"{ev['seed_base']}..{ev['seed_base'] + ev['episodes'] - 1}); "
          + (f"each setting on {len(rows[0]['seeds'])} training seeds (runs that differ only in `run.seed`), 95% "
             "two-level bootstrap intervals over training seeds and episodes, gains paired on seeds (in seed order) "
             "and episodes." if len(rows[0]["seeds"]) > 1 else
             "one run per setting, 95% bootstrap intervals over episodes (not over training seeds), gains paired on "
             "the episodes.")
          + f" The reference is `{rows[0]['label']}`."
          + (" Each run's outcomes (and the base alone's) are read from the committed reports "
             + ", ".join(f"`{p}`" for p in cfg.outcomes_from) + ", not evaluated again"
             + ("" if not evaluated else "; runs in none of them were evaluated here against that base alone: "
                + ", ".join(f"`{n}`" for n in evaluated)) + "." if cfg.outcomes_from else ""),
          "",
          f"| setting | settings vs reference | env steps | wall s{mean} | learner s{mean} | tune success | 95% CI "
          "| gain vs reference | 95% CI | verdict | gain vs base | 95% CI | verdict |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
          f"| base alone | — | — | — | — | {base['success']:.3f} | {base['ci95'][0]:.3f}–{base['ci95'][1]:.3f} "
          "| | | | | | |"]
    for i, r in enumerate(rows):
        gr, gb = r["gain_vs_reference"], r["gain_vs_base"]
        settings = "(reference)" if i == 0 else " ".join(f"`{o}`" for o in r["overrides"]) or "(same settings)"
        mark = " **(chosen)**" if r["label"] == chosen["chosen"] else ""
        if len(r["seeds"]) > 1:  # the setting's runs and their seeds, each run's tune success
            mark += " (" + ", ".join(f"`{n}` seed {sd}: {x:.3f}" for n, sd, x in zip(r["runs"], r["seeds"],
                                                                                   r["per_seed"])) + ")"
        wall, learn = ("—" if r.get(k) is None else f"{r[k]:.0f}" for k in ("wall_s", "learner_s"))
        md.append(f"| `{r['label']}`{mark} | {settings} | {r['env_steps']} | {wall} | {learn} | {r['success']:.3f} | "
                  f"{r['ci95'][0]:.3f}–{r['ci95'][1]:.3f} | "
                  + ("— | — | — | " if i == 0 else
                     f"{gr['mean']:+.3f} | {gr['ci95'][0]:+.3f} – {gr['ci95'][1]:+.3f} | {gr['verdict']} | ")
                  + f"{gb['mean']:+.3f} | {gb['ci95'][0]:+.3f} – {gb['ci95'][1]:+.3f} | {gb['verdict']} |")
    measured = [(label, a) for r in rows for label, a in (r.get("awr_by_run") or {r["label"]: r.get("awr")}).items()
                if a]
    if measured:
        md += ["", "What each critic steers at the end (AWR weights on 2,048 rows of the run's online replay, "
               "`ResidualLearner.measure_awr`): the weights' effective sample size as a share of the rows (1 = "
               "uniform, the critic steers nothing), the advantage's spread across rows against the heads' "
               "disagreement about it (SNR < 1: the weights follow critic noise more than action quality).", "",
               "| run | weight ESS | weights at the clip | advantage std | median \\|A\\| | heads' std of A | SNR |",
               "|---|---:|---:|---:|---:|---:|---:|"]
        for label, a in measured:
            md.append(f"| `{label}` | {a['awr_weight_ess']:.3f} | {a['awr_weight_clipped']:.3f} | "
                      f"{a['advantage_std']:.4f} | {a['advantage_abs_p50']:.4f} | "
                      f"{a.get('advantage_head_std', float('nan')):.4f} | {a.get('advantage_snr', float('nan')):.2f} |")
    if any(r.get("curve_dip") is not None for r in rows):
        md += ["", "Tune curves while learning (each run's `summary.json` history, its curve episodes per point): "
               "the lowest point after the start minus the start, per run (curve points), and the setting's worst.",
               "", "| setting | worst dip | per run |", "|---|---:|---|"]
        for r in rows:
            worst = "—" if r.get("curve_dip") is None else f"{r['curve_dip']:+.2f}"
            per = ", ".join(f"`{n}` {'—' if d is None else f'{d:+.2f}'} ({r['curve_points'][n]})"
                            for n, d in r["curve_dips"].items())
            md.append(f"| `{r['label']}` | {worst} | {per} |")
    md += ["", f"**Chosen: `{chosen['chosen']}`.** {chosen['why']}.", "",
           "The rule, in code (`arli.bench.tune.choose`): "
           + (f"the least mean learner-update time among the reference and the settings whose paired gain over "
              f"the reference has a 95% CI lower bound > {cfg.margin:+g}. " if cfg.prefer == "cost" else
              f"the shallowest worst tune-curve dip below the start among the reference and the settings whose "
              f"paired gain over the reference has a 95% CI lower bound > {cfg.margin:+g}. " if cfg.prefer == "dip"
              else
              f"the highest tune success among the settings whose paired gain over the reference has a 95% CI "
              f"lower bound > {cfg.margin:g}; none -> the reference is kept. ")
           + "Each interval is per comparison (no correction for the number of settings).", "",
           "*These are tune seeds: numbers for choosing, not for reporting.* The chosen setting's numbers come "
           "from its test seeds (`summary.json` / `eval_test.json` of its runs, `arli bench runs` over training "
           "seeds), which no choice saw.", "", f"![tune success]({cfg.name}.png)", ""]
    return md


def plot(path: str, payload: dict) -> None:
    rows, base, chosen = payload["runs"], payload["base"], payload["chosen"]["chosen"]
    with success_plot(path, f"{payload['env']}, d = {payload['delay_steps']}: tune success "
                      f"({payload['eval']['episodes']} episodes)\nchosen: {chosen}", "setting",
                      figsize=(max(5.0, 1.2 * len(rows) + 2), 4.2)) as ax:
        seen = set()
        for i, r in enumerate(rows):
            kind = ("reference (kept)" if r["label"] == chosen else "reference") if i == 0 else \
                ("chosen" if r["label"] == chosen else "other settings")
            color = {"reference": "tab:gray", "reference (kept)": "tab:orange", "chosen": "tab:orange",
                     "other settings": "tab:blue"}[kind]
            err = [[r["success"] - r["ci95"][0]], [r["ci95"][1] - r["success"]]]
            ax.bar(i, r["success"], yerr=err, capsize=4, color=color, label=None if kind in seen else kind)
            seen.add(kind)
            if len(r.get("per_seed", [])) > 1:  # each training seed's run
                ax.scatter([i] * len(r["per_seed"]), r["per_seed"], s=14, color="black", zorder=3,
                           label=None if "seed" in seen else "one training seed")
                seen.add("seed")
        ax.axhline(base["success"], color="black", linestyle="--", label="base alone")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["label"] for r in rows], rotation=25, ha="right", fontsize=8)


def evaluate_all(dirs: list[str], configs: list[FinetuneConfig], summaries: list[dict], labels: list[str],
                 seed_base: int, episodes: int, evaluate: Evaluate) -> list[dict]:
    """Each run's outcomes on the tune episodes (the base alone's with the first), checked to be
    tune seeds, of the reference's delay and at the run's finished env steps."""
    results: list[dict] = []
    for i, (run_dir, run_cfg) in enumerate(tqdm(list(zip(dirs, configs)), desc="runs", unit="run")):
        res = evaluate(run_dir, run_cfg, seed_base, episodes, i == 0)
        if res["split"] != "tune":
            raise ConfigError(f"episodes: {run_dir} was evaluated on {res['split']} seeds; choices use tune seeds")
        if results and res["delay_steps"] != results[0]["delay_steps"]:
            raise ConfigError(f"runs: {run_dir} plans d = {res['delay_steps']} control steps, the reference "
                              f"d = {results[0]['delay_steps']}; pass runs with the reference's delay_steps")
        summary_steps = summaries[i].get("env_steps")
        if summary_steps is not None and res.get("env_steps") is not None and res["env_steps"] != summary_steps:
            raise ConfigError(f"runs: {run_dir}'s checkpoint is at {res['env_steps']} env steps, its summary.json "
                              f"at {summary_steps} (a resumed run not finished?); pass finished runs")
        results.append(res)
        tqdm.write(f"{labels[i]}: tune success {np.mean(res['final']):.3f} on {episodes} episodes")
    return results


def main(cfg: BenchTuneConfig, evaluate: Evaluate = evaluate_run) -> int:
    if len(cfg.runs) < 2:
        raise ConfigError(f"runs: expected two or more `arli finetune` output directories, the reference first, "
                          f"got {list(cfg.runs)!r}")
    dirs = list(cfg.runs)
    labels = labels_of(dirs)
    if cfg.outcomes_from and len({os.path.basename(os.path.normpath(d)) for d in dirs}) != len(dirs):
        raise ConfigError(f"runs: with outcomes_from a run's row is found by its directory's basename; two runs "
                          f"share one in {dirs}: pass directories with distinct names")
    configs, summaries = load_runs(dirs, need_checkpoint=not cfg.outcomes_from)
    dicts = [config_dict(c) for c in configs]
    check_comparable(dirs, dicts)
    seed_base, episodes = configs[0].run.tune_seed, cfg.episodes
    check_tune_seeds(dirs, configs, seed_base, episodes)
    groups = settings_of(dirs, labels, dicts)
    parallel = ParallelEvaluate(cfg.workers) if cfg.workers > 1 else None
    if parallel is not None:
        evaluate = parallel
    if cfg.outcomes_from:
        evaluate = reported_outcomes(list(cfg.outcomes_from), seed_base, episodes, fallback=evaluate,
                                     workers=cfg.workers)
    try:
        if parallel is not None:  # every run not read from a report, the base alone beside the first of them
            reported = getattr(evaluate, "labels", frozenset())
            parallel.start([(d, c) for d, c in zip(dirs, configs) if os.path.basename(os.path.normpath(d))
                            not in reported], seed_base, episodes)
        results = evaluate_all(dirs, configs, summaries, labels, seed_base, episodes, evaluate)
    except BaseException:
        if parallel is not None:
            parallel.close(abort=True)
        raise
    if parallel is not None:
        parallel.close()
    steps = [r.get("env_steps", s.get("env_steps")) for r, s in zip(results, summaries)]
    walls = [s.get("wall_s") for s in summaries]
    learner = [(s.get("train_time_s") or {}).get("learner_updates") for s in summaries]

    def mean_of(values: list, g: list[int]) -> float | None:
        return None if any(values[i] is None for i in g) else float(np.mean([values[i] for i in g]))

    rows = run_rows([labels[g[0]] for g in groups],
                    [shown_overrides(dicts[groups[0][0]], dicts[g[0]], len(g) > 1) for g in groups],
                    [[results[i]["final"] for i in g] for g in groups], results[0]["base"],
                    [steps[g[0]] for g in groups],
                    [mean_of(walls, g) for g in groups],
                    [results[g[0]].get("awr") if len(g) == 1 else None for g in groups],
                    [[dicts[i]["run"]["seed"] for i in g] for g in groups], [mean_of(learner, g) for g in groups])
    for row, g in zip(rows, groups):
        row["runs"] = [labels[i] for i in g]
        dips = [curve_dip(summaries[i]) for i in g]
        row["curve_dips"] = {labels[i]: d for i, d in zip(g, dips)}
        row["curve_points"] = {labels[i]: len(summaries[i].get("history") or []) for i in g}
        row["curve_dip"] = None if any(d is None for d in dips) else min(dips)
        if any(results[i].get("evaluated") for i in g):  # beside outcomes_from: these runs were evaluated here
            row["evaluated"] = [labels[i] for i in g if results[i].get("evaluated")]
        row["awr_by_run"] = {labels[i]: results[i].get("awr") for i in g}
    base = np.asarray(results[0]["base"], float)[None]
    payload = {"env": results[0]["env"], "delay_steps": results[0]["delay_steps"], "reference": rows[0]["label"],
               "command": command_line(cfg), "eval": {"split": "tune", "seed_base": seed_base, "episodes": episodes},
               "base": {"success": float(base.mean()), "ci95": list(success_ci(base)),
                        "outcomes": [int(v) for v in base[0]]},
               "runs": rows, "chosen": choose(rows, episodes, cfg.margin, cfg.prefer),
               "rule": {"margin": cfg.margin, "prefer": cfg.prefer}, "workers": cfg.workers,
               "machine": machine_info(),
               **({"outcomes_from": list(cfg.outcomes_from)} if cfg.outcomes_from else {})}
    md = markdown(cfg, payload)
    write_report(cfg.report_dir, cfg.name, payload, "\n".join(md))
    plot(os.path.join(cfg.report_dir, f"{cfg.name}.png"), payload)
    print("\n".join(md[:-2]))
    print_last_line_json({"chosen": payload["chosen"], "eval": payload["eval"],
                          "runs": [{k: r[k] for k in ("label", "success", "ci95", "gain_vs_reference")} for r in rows]})
    return 0
