"""``arli bench drift``: where does the actor go when it follows the critic, before it acts?

From a finetune run's checkpoint (typically one saved at the end of the critic's warm-up,
before the actor has moved), the select update (the default learner's, PA-RL / EXPO-style:
regress onto the highest-Q of the gating candidates and the row's own action) runs
``updates`` actor steps on the run's replay with the critic frozen, once per learner setting:

* what the critic picks on the replay's rows (pi(s), the base, a perturbation, the data's
  action), how far the picks lie from pi(s) per row and on average over the batch (a
  *coherent* step: the direction the whole actor is pulled), and how much the critic's heads
  disagree against how much the candidates differ;
* how far the actor moved (mean |r - r0| over a fixed probe batch, and the mean shift per
  action entry);
* the actor alone (no value gating) before and after, on the same episodes, and the gated
  policy (the frozen critic choosing among the candidates at every step, as a run acts once
  its warm-up ends) before and after: what the gate does with this critic, apart from where
  the actor goes.

It separates "the critic's choices pull the actor somewhere that fails" from everything an
online run mixes in (new data, the critic learning, gating at acting time). Only the select
update is supported: the drift is measured through ``ResidualLearner._select_step`` itself.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from tqdm import tqdm

from arli.bench.common import figure, machine_info, publish
from arli.config import BenchDriftConfig, ConfigError

PROBE_ROWS = 2048  # the fixed batch the actor's movement is measured on
STAT_BATCHES = 4  # batches the critic's picks are summarised over
# learner settings the select step reads at each update (others are fixed when the networks and
# optimisers are built, or change what the actor is before the steps: refused)
# (no *_decay_updates: the steps here advance no update count, so no fade would start)
SETTINGS = ("start_weight", "gate_candidates", "gate_std", "gate_confidence", "anchor_weight", "anchor_ratio",
            "batch_size", "q_weight", "grad_clip")


def parse_setting(entry: str) -> dict:
    """``"start_weight=10,gate_std=0.05"`` -> {"start_weight": 10, "gate_std": 0.05}; "" -> {}.
    Keys from SETTINGS, numeric values; anything else is a ConfigError naming it."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in entry.split(","))):
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep:
            raise ConfigError(f"settings: expected key=value[,key=value], got {entry!r}")
        if key not in SETTINGS:
            raise ConfigError(f"settings: {key!r} in {entry!r} is not a learner setting this bench varies; "
                              f"expected one of {', '.join(SETTINGS)}")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                raise ConfigError(f"settings: {key}={value!r} in {entry!r}: expected a number") from None
    return out


def check_setting(base, entry: str):
    """The run's learner config with ``entry``'s overrides, validated; refused unless the
    select update runs (actor_update=select, q_weight > 0)."""
    cfg = dataclasses.replace(base, **parse_setting(entry))
    cfg.validate()
    if cfg.actor_update != "select" or cfg.q_weight <= 0:
        raise ConfigError("arli bench drift measures the select update (actor_update=select, q_weight > 0); "
                          f"{entry or 'the run'} has actor_update={cfg.actor_update}, q_weight={cfg.q_weight}")
    return cfg


def _load(run_dir: str, entry: str):
    """A fresh finetuner from the run's checkpoint, its learner's settings overridden by ``entry``."""
    from arli.runs import load_run_config, make_finetuner  # noqa: PLC0415

    cfg = load_run_config(run_dir)
    ft, _, _ = make_finetuner(cfg)
    ft.load(os.path.join(run_dir, "checkpoint"))
    ft.learner.cfg = check_setting(ft.learner.cfg, entry)
    return cfg, ft


def _batch(ft, rows: int, generator):
    from arli.rl.replay import mixed_batch  # noqa: PLC0415

    lc = ft.learner.cfg
    return ft.learner._to_device(mixed_batch(ft.online, ft.anchor, rows, lc.anchor_ratio, generator))


def pick_stats(ft, generator) -> dict:
    """The critic's select targets on STAT_BATCHES replay batches: shares of each kind of pick,
    the mean per-row distance of the pick from pi(s) and the norm of its batch mean (the
    coherent pull), both in residual units; the heads' std against the candidates' spread."""
    import torch  # noqa: PLC0415

    from arli.policies.residual import compose_action  # noqa: PLC0415

    learner, lc = ft.learner, ft.learner.cfg
    acc: dict[str, list[float]] = {k: [] for k in ("pi", "base", "perturbed", "data", "row_step", "coherent_step",
                                                   "head_std", "candidate_spread")}
    with torch.no_grad():
        for _ in range(STAT_BATCHES):
            b = _batch(ft, lc.batch_size, generator)
            r = learner.actor(b["state"])
            r_data = ((b["action"] - b["base"]) / lc.residual_scale).clamp(-1, 1)
            cands = torch.cat([learner.candidates(r, lc.gate_candidates, lc.gate_std, generator), r_data[None]])
            q = learner.critic.candidates(b["state"], compose_action(b["base"], cands, lc.residual_scale))  # (E, K, B)
            best = learner.choose(q)  # (B,)
            K = cands.shape[0]
            share = np.bincount(best.cpu().numpy(), minlength=K) / best.numel()
            acc["pi"].append(share[0])
            acc["base"].append(share[1])
            acc["perturbed"].append(share[2:K - 1].sum())
            acc["data"].append(share[K - 1])
            step = cands.gather(0, best.view(1, -1, 1).expand(1, -1, r.shape[1]))[0] - r
            acc["row_step"].append(step.norm(dim=1).mean().item())
            acc["coherent_step"].append(step.mean(0).norm().item())
            acc["head_std"].append(q.std(0).mean().item())
            qm = q.mean(0)
            acc["candidate_spread"].append((qm.max(0).values - qm.min(0).values).mean().item())
    return {k: float(np.mean(v)) for k, v in acc.items()}


def actor_alone(ft, episodes: int, seed_base: int) -> list[int]:
    """Success per episode of the actor's own r(s), value gating off (restored after)."""
    gating, ft.learner.gating = ft.learner.gating, False
    try:
        return [int(x) for x in ft.evaluate(episodes, seed_base)["outcomes"]]
    finally:
        ft.learner.gating = gating


def gated(ft, episodes: int, seed_base: int) -> list[int]:
    """Success per episode of the value-gated policy with the critic as it is now. A checkpoint
    inside the critic warm-up does not gate yet (``act`` waits for the warm-up): its update count
    is lifted to the warm-up's end while evaluating (restored after), so the gate acts with it."""
    learner = ft.learner
    updates, learner.updates = learner.updates, max(learner.updates, learner.cfg.critic_warmup_updates, 1)
    try:
        return [int(x) for x in ft.evaluate(episodes, seed_base)["outcomes"]]
    finally:
        learner.updates = updates


def measure(cfg: BenchDriftConfig, entry: str, seed_base: int, before: list[int] | None, bar) -> dict:
    """One setting: pick statistics, ``cfg.updates`` select steps with the critic frozen, the
    actor's movement and its success alone before (given, or measured) and after."""
    import torch  # noqa: PLC0415

    _, ft = _load(cfg.run, entry)
    learner = ft.learner
    generator = torch.Generator().manual_seed(cfg.seed)
    if before is None:
        before = actor_alone(ft, cfg.episodes, seed_base)
    gated_before = gated(ft, cfg.episodes, seed_base) if learner.gating else None
    picks = pick_stats(ft, generator)
    probe = _batch(ft, PROBE_ROWS, generator)["state"]
    with torch.no_grad():
        r0 = learner.actor(probe).clone()
    for _ in range(cfg.updates):
        learner._select_step(_batch(ft, learner.cfg.batch_size, generator), False)
        bar.update(1)
    with torch.no_grad():
        shift = learner.actor(probe) - r0
    after = actor_alone(ft, cfg.episodes, seed_base)
    gated_after = gated(ft, cfg.episodes, seed_base) if learner.gating else None
    return {"setting": entry or "(the run's)", "overrides": parse_setting(entry), "updates_at_start": learner.updates,
            "picks": picks, "moved": float(shift.abs().mean().item()),
            "mean_shift": [float(x) for x in shift.mean(0).cpu().numpy()],
            "before": before, "after": after, "gated_before": gated_before, "gated_after": gated_after}


def _mean(outcomes: list[int] | None) -> str:
    return "-" if outcomes is None else f"{np.mean(outcomes):.3f}"


def report_md(p: dict) -> list[str]:
    from arli.stats import success_ci  # noqa: PLC0415

    lines = [f"# Select-update drift: `{p['run']}`", "",
             f"`{p['command']}` — from the run's checkpoint ({p['rows'][0]['updates_at_start']} updates: the critic "
             f"as it was then, frozen), {p['updates']} actor steps of the select update per setting on the run's "
             f"replay; the actor alone (no value gating) on {p['episodes']} {p['split']} episodes (seeds "
             f"{p['seed_base']}..) before and after. Picks: the share of rows whose highest-Q candidate is pi(s), the "
             "base, a perturbation of pi(s) or the row's own action; steps in residual units (row: mean |pick - pi(s)|; "
             "coherent: |batch mean of pick - pi(s)|, the pull on the whole actor); head std vs the candidates' "
             "spread of mean-head Q. Gated: the frozen critic choosing among the candidates at every step (as a run "
             "acts after its warm-up), with the actor before and after the steps.", "",
             "| setting | picks pi / base / perturbed / data | row step | coherent step | head std / spread | "
             "moved mean abs r - r0 | actor alone before | after [95% CI] | gated before | gated after |",
             "|---|---|---:|---:|---|---:|---:|---|---:|---:|"]
    for r in p["rows"]:
        k = r["picks"]
        lo, hi = success_ci(np.array(r["after"], float))
        lines.append(f"| {r['setting']} | {k['pi']:.2f} / {k['base']:.2f} / {k['perturbed']:.2f} / {k['data']:.2f} | "
                     f"{k['row_step']:.3f} | {k['coherent_step']:.3f} | {k['head_std']:.3f} / "
                     f"{k['candidate_spread']:.3f} | {r['moved']:.3f} | {np.mean(r['before']):.3f} | "
                     f"{np.mean(r['after']):.3f} [{lo:.3f}, {hi:.3f}] | {_mean(r.get('gated_before'))} | "
                     f"{_mean(r.get('gated_after'))} |")
    lines += ["", "Mean shift of r per action entry after the steps: " + "; ".join(
        f"{r['setting']}: [{', '.join(f'{x:+.3f}' for x in r['mean_shift'])}]" for r in p["rows"]), "",
              f"![drift]({p['name']}.png)"]
    return lines


def main(cfg: BenchDriftConfig) -> int:
    import torch  # noqa: PLC0415

    from arli.bench.common import run_configs  # noqa: PLC0415
    from arli.runs import split_of  # noqa: PLC0415
    from arli.stats import success_ci  # noqa: PLC0415

    if not cfg.run:
        raise ConfigError("run: expected an `arli finetune` output directory with checkpoint/, e.g. "
                          "run=outputs/<run>")
    torch.set_num_threads(1)
    (run_cfg,) = run_configs([cfg.run])
    spec = run_cfg.run
    if not os.path.exists(os.path.join(cfg.run, "checkpoint", "trainer_state.pt")):
        raise ConfigError(f"run: {cfg.run} has no checkpoint/trainer_state.pt (its config and summary alone are not "
                          "enough: the bench loads the critic and the replay)")
    for entry in cfg.settings:  # every setting checked before any work
        check_setting(spec.learner, entry)
    seed_base = spec.tune_seed if cfg.seed_base is None else cfg.seed_base
    split = split_of(spec, seed_base, cfg.episodes, [])
    if split.startswith("test"):
        raise ConfigError(f"seed_base: {seed_base}.. overlaps the run's test seeds; drift is a diagnostic, "
                          "run it on tune seeds (the default) or others")
    rows: list[dict] = []
    before = None
    with tqdm(total=cfg.updates * len(cfg.settings), desc="drift", unit="step", mininterval=1.0) as bar:
        for entry in cfg.settings:
            rows.append(measure(cfg, entry, seed_base, before, bar))
            before = rows[-1]["before"]  # the same checkpoint's actor: evaluated once
    name = cfg.name or "drift"
    command = ("arli bench drift run=" + cfg.run + f" updates={cfg.updates} episodes={cfg.episodes} "
               + ("" if cfg.seed_base is None else f"seed_base={cfg.seed_base} ")
               + "'settings=[" + ", ".join(f'"{s}"' for s in cfg.settings) + "]'" + f" seed={cfg.seed} name={name}")
    payload = {"run": cfg.run, "command": command, "name": name, "updates": cfg.updates, "episodes": cfg.episodes,
               "seed_base": seed_base, "split": split, "rows": rows, "machine": machine_info()}
    os.makedirs(cfg.report_dir, exist_ok=True)
    with figure(os.path.join(cfg.report_dir, f"{name}.png"), figsize=(7, 3.5)) as ax:
        labels = [r["setting"] for r in rows]
        x = np.arange(len(rows))
        for key, shift, label in (("after", -0.2, "actor alone"), ("gated_after", 0.2, "gated")):
            shown = [r for r in rows if r[key] is not None]
            if not shown:
                continue
            mean = np.array([np.mean(r[key]) for r in shown])
            ci = np.array([success_ci(np.array(r[key], float)) for r in shown])
            ax.bar(x[:len(shown)] + shift, mean, width=0.4, yerr=[mean - ci[:, 0], ci[:, 1] - mean], capsize=3,
                   label=f"{label} after")
        ax.axhline(np.mean(rows[0]["before"]), color="k", ls="--", label="actor alone before")
        ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel(f"success after {cfg.updates} steps")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    lines = report_md(payload)
    summary = {"moved": {r["setting"]: r["moved"] for r in rows},
               "after": {r["setting"]: float(np.mean(r["after"])) for r in rows}} if cfg.json else None
    return publish(cfg.report_dir, name, payload, lines, slice(4, 6 + len(rows)), summary)
