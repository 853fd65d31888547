"""``arli bench anchor-start``: how good is the policy RL starts from?

Before any online step the residual actor is behaviour-cloned onto anchor replay
(demonstrations relabelled with the base's own actions through the scheduler; DESIGN.md §7).
This bench measures that start — the latency sweep's ``anchor_only`` cell — against the
pretraining's learning rate and number of updates and how the demonstrator acts
(``run.demonstrations``: ``demonstrations=[expert,bounded]``), at each delay and seed:

* per (delay, seed, demonstrations) the anchor data are collected once (as ``arli finetune`` does);
* for every (learning rate, update count) the actor is reset to its zero-initialised weights
  and the generator to its post-collection state, then pretrained from scratch, so each
  point is exactly what ``run.learner.pretrain_lr=<lr> run.learner.pretrain_updates=<n>`` gives;
* each point is evaluated on the latency sweep's evaluation seeds (``eval_episodes``).

0 updates is the base under the same loop (the residual is exactly zero).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace

import numpy as np
from tqdm import tqdm

from arli.bench.common import machine_info, publish, success_plot
from arli.pretrain import ensure_base_policy
from arli.config import BenchAnchorStartConfig


def pretraining_restarter(ft):
    """For a prepared Finetuner (anchor data in, 0 pretraining updates): a function
    ``(lr, n) -> last loss`` that resets the actor to its initial weights and the learner's
    generator to its present state, then pretrains ``n`` updates at ``lr``. Afterwards the
    actor is exactly what ``prepare()`` with ``pretrain_lr=lr, pretrain_updates=n`` makes."""
    learner = ft.learner
    actor0 = {k: v.clone() for k, v in learner.actor.state_dict().items()}
    generator0 = learner.generator.get_state()

    def restart(lr: float, n: int) -> float:
        learner.actor.load_state_dict(actor0)  # copies into the flat buffer's views
        learner.generator.set_state(generator0)
        learner.cfg = replace(learner.cfg, pretrain_lr=lr)
        return learner.pretrain_actor(ft.anchor, n)

    return restart


def run_pair(settings: dict, delay: int, seed: int, demonstrations: str) -> list[dict]:
    """Every (lr, updates) point of one (delay, seed, demonstrations); runs in a worker process."""
    import torch  # noqa: PLC0415

    from arli.chunking import ChunkingConfig  # noqa: PLC0415
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.latency import FixedLatency  # noqa: PLC0415
    from arli.policies.load import load_base_policy  # noqa: PLC0415
    from arli.rl.config import InterventionSpec, LearnerConfig, RunSpec  # noqa: PLC0415
    from sim_envs import make_env, task_name  # noqa: PLC0415
    from sim_envs.experts import EXPERTS  # noqa: PLC0415

    torch.set_num_threads(settings["threads"])
    name, dt = task_name(settings["env"]["name"]), settings["env"]["dt"]
    env = make_env(name, dt=dt)
    base = load_base_policy(settings["checkpoint"], env.unwrapped.instruction, name, settings["chunk_size"])
    run = dict(settings["run"])
    spec = RunSpec(**{**run, "learner": LearnerConfig(**run.pop("learner")),
                      "intervention": InterventionSpec(**run.pop("intervention"))})
    spec = replace(spec, variant="arli", seed=seed, demonstrations=demonstrations,
                   learner=replace(spec.learner, pretrain_updates=0))
    model = getattr(base, "model", None)
    ft = Finetuner(spec, env, base, EXPERTS[name], FixedLatency(delay * dt),
                   None if model is None else model.state_mean.numpy(),
                   None if model is None else model.state_std.numpy(), ChunkingConfig(**settings["chunking"]))
    ft.prepare()  # anchor data only: 0 pretraining updates
    restart = pretraining_restarter(ft)
    base_success = None
    out = []
    for lr in settings["pretrain_lrs"]:
        for n in sorted(settings["updates"]):
            if n == 0 and base_success is not None:  # the zero residual does not depend on lr
                out.append({"delay_steps": delay, "seed": seed, "demonstrations": demonstrations,
                            "pretrain_lr": lr, "updates": 0, "success": base_success, "loss": None})
                continue
            loss = restart(lr, n)
            # a choice of setting: judged on the tune seeds, the same episodes for every training seed
            success = ft.evaluate(settings["eval_episodes"], seed=spec.tune_seed)["success"]
            if n == 0:
                base_success = success
            out.append({"delay_steps": delay, "seed": seed, "demonstrations": demonstrations, "pretrain_lr": lr,
                        "updates": n, "success": success, "loss": None if n == 0 else float(loss)})
    return out


def aggregate(rows: list[dict]) -> list[dict]:
    """Per (delay, demonstrations, lr, updates): mean and std of success over seeds, and the
    seeds' values."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["delay_steps"], r.get("demonstrations", "expert"), r["pretrain_lr"], r["updates"])
        groups.setdefault(key, []).append(r)
    points = []
    for (delay, demos, lr, n), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        vals = np.array([r["success"] for r in rs])
        points.append({"delay_steps": delay, "demonstrations": demos, "pretrain_lr": lr, "updates": n,
                       "success_mean": float(vals.mean()),
                       "success_std": float(vals.std()), "per_seed": {r["seed"]: r["success"] for r in rs}})
    return points


def markdown(points: list[dict], cfg: BenchAnchorStartConfig) -> list[str]:
    updates = sorted({p["updates"] for p in points})
    by = {(p["delay_steps"], p["demonstrations"], p["pretrain_lr"], p["updates"]): p for p in points}
    lines = ["# Anchor-pretrained start: success vs pretraining learning rate and updates", "",
             f"`arli bench anchor-start env={cfg.env.name} 'delay_steps={list(cfg.delay_steps)}' "
             f"'demonstrations=[{','.join(cfg.demonstration_modes())}]' "
             f"'seeds={list(cfg.seeds)}' 'pretrain_lrs={list(cfg.pretrain_lrs)}' 'updates={list(cfg.updates)}' "
             f"eval_episodes={cfg.eval_episodes} workers={cfg.workers}"
             + (f" report_dir={cfg.report_dir}" if cfg.report_dir != "reports" else "") + "` — base `{cfg.checkpoint}`, {cfg.run.anchor_episodes} "
             f"demonstration episodes as anchor data, batch {cfg.run.learner.batch_size}, residual scale "
             f"{cfg.run.learner.residual_scale}. Each point: pretraining from the zero residual, then "
             f"{cfg.eval_episodes} evaluation episodes per seed (tune seeds {cfg.run.tune_seed}.., the same for "
             f"every seed); mean ± std over "
             f"seeds {list(cfg.seeds)}. 0 updates = the base in the same loop. The default is "
             f"`run.learner.pretrain_lr={cfg.run.learner.pretrain_lr}`, "
             f"`run.learner.pretrain_updates={cfg.run.learner.pretrain_updates}`.", "",
             "Demonstrations (`run.demonstrations`): `expert` = the expert's own actions for whole episodes, "
             "`bounded` = its correction of the running base within the residual's reach.", "",
             "| delay | demonstrations | pretrain lr | " + " | ".join(f"{n} upd." for n in updates) + " |",
             "|---:|---|---:|" + "---:|" * len(updates)]
    for delay in sorted(cfg.delay_steps):
        for demos in cfg.demonstration_modes():
            for lr in cfg.pretrain_lrs:
                cells = []
                for n in updates:
                    p = by.get((delay, demos, lr, n))
                    cells.append("—" if p is None else f"{p['success_mean']:.2f} ± {p['success_std']:.2f}")
                lines.append(f"| {delay} | {demos} | {lr:g} | " + " | ".join(cells) + " |")
    lines += ["", "![anchor start](anchor_start.png)", "", f"Machine: {machine_info()}", ""]
    return lines


def plot(points: list[dict], path: str, title: str) -> None:
    with success_plot(path, title, "anchor-pretraining updates", "success rate (mean ± std over seeds)",
                      legend_size=8) as ax:
        for delay, demos, lr in dict.fromkeys((p["delay_steps"], p["demonstrations"], p["pretrain_lr"])
                                              for p in points):
            pts = sorted((p["updates"], p["success_mean"], p["success_std"]) for p in points
                         if (p["delay_steps"], p["demonstrations"], p["pretrain_lr"]) == (delay, demos, lr))
            x, y, e = zip(*pts)
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, ls="-" if delay else "--",
                        label=f"d = {delay}, {demos} demos, lr {lr:g}")


def main(cfg: BenchAnchorStartConfig) -> int:
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    settings = {"env": asdict(cfg.env), "checkpoint": cfg.checkpoint, "run": asdict(cfg.run),
                "chunking": asdict(cfg.chunking),
                "chunk_size": cfg.pretrain.policy.chunk_size, "eval_episodes": cfg.eval_episodes,
                "pretrain_lrs": list(cfg.pretrain_lrs), "updates": list(cfg.updates),
                "threads": max(1, (os.cpu_count() or 2) // cfg.workers)}
    pairs = [(d, s, m) for d in cfg.delay_steps for s in cfg.seeds for m in cfg.demonstration_modes()]
    rows: list[dict] = []
    with ProcessPoolExecutor(cfg.workers) as pool:
        futures = [pool.submit(run_pair, settings, *pair) for pair in pairs]
        for fut in tqdm(as_completed(futures), total=len(futures), desc="anchor start (delay, seed, demos)",
                        unit="pair"):
            rows += fut.result()
    points = aggregate(rows)
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(points, os.path.join(cfg.report_dir, "anchor_start.png"),
         f"{cfg.env.name}: the start RL begins from ({len(cfg.seeds)} seeds)")
    payload = {"env": cfg.env.name, "checkpoint": cfg.checkpoint, "points": points, "rows": rows,
               "eval_episodes": cfg.eval_episodes, "machine": machine_info()}
    md = markdown(points, cfg)
    summary = {"points": [{k: p[k] for k in ("delay_steps", "demonstrations", "pretrain_lr", "updates",
                                             "success_mean")}
                          for p in points]}
    return publish(cfg.report_dir, "anchor_start", payload, md, slice(4, len(md) - 4), summary if cfg.json else None)
