"""``arli bench ceiling``: what the residual's action space allows, apart from what a learner finds.

The projected-expert residual ``r = clip((expert(o_t) - b_t) / scale, -1, 1)`` acts through
the same scheduler, delays and bound ``a = clip(b + scale * r)`` as the learned residual, on
the same test episodes. It knows the task (the scripted expert at the fresh observation),
so its success is the ceiling of a residual with this state and bound: what a learner could
reach. With ``grip_authority`` the gripper entry is the expert's own (a grip decision the
residual may change outright) instead of a bounded nudge.

Also reported: the share of anchor rows (the expert's own demonstrations recorded inside the
asynchronous loop, ``run.demonstrations=expert``) whose regression target lies outside the bound,
i.e. what anchor pretraining cannot imitate.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict

import numpy as np
from tqdm import tqdm

from arli.bench.common import machine_info, print_last_line_json, success_plot, write_report
from arli.config import BenchCeilingConfig, ConfigError
from arli.interfaces import StepController
from arli.policies.residual_np import NoiseProcess, compose_numpy, project_numpy
from arli.pretrain import ensure_base_policy
from arli.stats import success_ci
from arli.types import Observation, StepInfo


class ProjectedExpert(StepController):
    """a = clip(b + scale * clip((expert(o_t) - b) / scale, -1, 1)); the grip entry the
    expert's own with ``grip_authority``. With ``noise`` (process, std) the learner's exploration
    is added to that residual r first, clipped to [-1, 1]. Shapes: state (n,), actions (m,)."""

    def __init__(self, expert, scale: float, grip_authority: bool, noise: tuple[str, float] | None = None,
                 seed: int = 0):
        self.expert, self.scale, self.grip_authority = expert, scale, grip_authority
        self.noise_std = 0.0 if noise is None else noise[1]
        self.process = NoiseProcess(differenced=noise is not None and noise[0] == "differenced")
        self.rng = np.random.default_rng(seed)

    def begin_episode(self) -> None:
        self.process.begin_episode()

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        target = np.asarray(self.expert(obs.state), np.float32)
        action = project_numpy(target, info.base_action, self.scale)
        if self.noise_std > 0:
            r = (action - info.base_action) / self.scale
            r += self.process(np.float32(self.noise_std) * self.rng.standard_normal(r.shape, np.float32))
            action = compose_numpy(info.base_action, np.clip(r, -1.0, 1.0), self.scale)
        if self.grip_authority:
            action[-1] = target[-1]
        return action


def _setup(settings: dict, delay: int):
    from arli.chunking import ChunkingConfig  # noqa: PLC0415
    from arli.latency import FixedLatency  # noqa: PLC0415
    from arli.policies.load import load_base_policy  # noqa: PLC0415
    from sim_envs import make_env  # noqa: PLC0415
    from sim_envs.experts import EXPERTS  # noqa: PLC0415

    name, dt = settings["env"]["name"], settings["env"]["dt"]
    env = make_env(name, dt=dt, max_episode_steps=settings["env"]["max_episode_steps"])
    base = load_base_policy(settings["checkpoint"], env.unwrapped.instruction, name, settings["chunk_size"],
                            state_dim=env.observation_space["state"].shape[0])
    return env, base, EXPERTS[name], FixedLatency(delay * dt), ChunkingConfig(**settings["chunking"])


def run_cell(settings: dict, delay: int, scale: float | None, grip: bool,
             noise: tuple[str, float] | None = None) -> dict:
    """One (delay, bound, gripper authority[, exploration noise]) cell on the test episodes;
    ``scale`` None = the base alone. Runs in a worker process."""
    import torch  # noqa: PLC0415

    from arli.rollout import evaluate_policy  # noqa: PLC0415

    torch.set_num_threads(1)
    env, base, expert, latency, chunking = _setup(settings, delay)
    controller = None if scale is None else ProjectedExpert(expert, scale, grip, noise)
    out = evaluate_policy(env, base, chunking, latency, settings["episodes"], settings["test_seed"], controller)
    return {"delay_steps": delay, "scale": scale, "grip_authority": grip, "success": out["success"],
            "outcomes": [int(x) for x in out["outcomes"]],
            "noise": None if noise is None else {"process": noise[0], "std": noise[1]}}


def anchor_clipping(settings: dict, delay: int, scales: list[float]) -> list[dict]:
    """Share of demonstration rows, recorded in the asynchronous loop at ``delay``, whose
    residual target (a - b) / scale leaves [-1, 1] in some entry (and per entry)."""
    import torch  # noqa: PLC0415

    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.rl.config import RunSpec  # noqa: PLC0415

    torch.set_num_threads(1)
    env, base, expert, latency, chunking = _setup(settings, delay)
    # the expert's own actions: what it would take to imitate it (bounded demonstrations stay
    # within the bound by construction)
    spec = RunSpec(anchor_episodes=settings["anchor_episodes"], demonstrations="expert")
    ft = Finetuner(spec, env, base, expert, latency, chunking=chunking)
    ft.collect_anchor()
    n = len(ft.anchor)
    gap = ft.anchor.data["action"][:n] - ft.anchor.data["base"][:n]
    return [{"delay_steps": delay, "scale": s, "rows": n, "share_any": float(np.mean(np.any(np.abs(gap) > s, 1))),
             "share_per_entry": [float(x) for x in np.mean(np.abs(gap) > s, 0)]} for s in scales]


def main(cfg: BenchCeilingConfig) -> int:
    from sim_envs.experts import EXPERTS  # noqa: PLC0415
    from sim_envs.registry import task_name  # noqa: PLC0415

    name = task_name(cfg.env.name)
    if name not in EXPERTS:
        raise ConfigError(f"env.name: {name} has no scripted expert to project; the ceiling runs on "
                          f"{sorted(EXPERTS)}")
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    settings = {"env": {**asdict(cfg.env), "name": name}, "checkpoint": cfg.checkpoint,
                "chunk_size": cfg.pretrain.policy.chunk_size, "chunking": asdict(cfg.chunking),
                "episodes": cfg.run.test_episodes, "test_seed": cfg.run.test_seed,
                "anchor_episodes": cfg.anchor_episodes}
    jobs = [(d, None, False) for d in cfg.delay_steps]
    jobs += [(d, s, g) for d in cfg.delay_steps for s in cfg.scales for g in cfg.grip_authority]
    default = cfg.run.learner.residual_scale
    jobs += [(d, default, False, (p, std)) for d in cfg.delay_steps for p in cfg.noise for std in cfg.noise_std]
    cells, clipping = [], []
    with ProcessPoolExecutor(cfg.workers) as pool:
        futures = [pool.submit(run_cell, settings, *job) for job in jobs]
        futures += [pool.submit(anchor_clipping, settings, d, list(cfg.scales)) for d in cfg.delay_steps]
        for fut in tqdm(as_completed(futures), total=len(futures), desc="ceiling cells", unit="cell"):
            got = fut.result()
            if isinstance(got, list):
                clipping += got
            else:
                cells.append(got)
                what = "base alone" if got["scale"] is None else \
                    f"expert through bound {got['scale']}{' + grip' if got['grip_authority'] else ''}" + \
                    ("" if got["noise"] is None else f" + {got['noise']['process']} noise {got['noise']['std']}")
                tqdm.write(f"d={got['delay_steps']} {what}: {got['success']:.3f}")
    for c in cells:
        c["ci95"] = [round(x, 4) for x in success_ci(c["outcomes"])]
    noisy = sorted((c for c in cells if c["noise"] is not None),
                   key=lambda c: (c["delay_steps"], c["noise"]["std"], c["noise"]["process"]))
    cells = [c for c in cells if c["noise"] is None]
    for c in cells:
        del c["noise"]
    cells.sort(key=lambda c: (c["delay_steps"], c["scale"] is not None, c["scale"] or 0, c["grip_authority"]))
    clipping.sort(key=lambda c: (c["delay_steps"], c["scale"]))
    ceiling = [{"delay_steps": c["delay_steps"], "success": c["success"], "ci95": c["ci95"]} for c in cells
               if c["scale"] == default and not c["grip_authority"]]
    payload = {"env": name, "eval": {"split": "test", "seed_base": cfg.run.test_seed,
                                     "episodes": cfg.run.test_episodes},
               "default_scale": default, "cells": cells, "ceiling": ceiling, "anchor_clipping": clipping,
               "exploration": noisy,
               "checkpoint": cfg.checkpoint, "machine": machine_info()}
    os.makedirs(cfg.report_dir, exist_ok=True)
    plot(cells, os.path.join(cfg.report_dir, f"ceiling_{name}.png"), name)
    md = markdown(payload, cfg)
    write_report(cfg.report_dir, f"ceiling_{name}", payload, md)
    print(md)
    print_last_line_json({k: payload[k] for k in ("env", "eval", "ceiling")})
    return 0


def plot(cells: list[dict], path: str, name: str) -> None:
    with success_plot(path, f"{name}: the residual's ceiling (projected expert)", "delay_steps d") as ax:
        for key in dict.fromkeys((c["scale"], c["grip_authority"]) for c in cells):
            pts = sorted((c["delay_steps"], c["success"], c["ci95"]) for c in cells
                         if (c["scale"], c["grip_authority"]) == key)
            x, y, ci = zip(*pts)
            err = np.array([[v - lo for v, (lo, _) in zip(y, ci)], [hi - v for v, (_, hi) in zip(y, ci)]])
            label = "base alone" if key[0] is None else f"bound {key[0]}" + (" + grip" if key[1] else "")
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, ls="--" if key[0] is None else "-", label=label)


def markdown(p: dict, cfg: BenchCeilingConfig) -> str:
    e = p["eval"]
    lines = [f"# The residual's ceiling — `{p['env']}`", "",
             f"`arli bench ceiling env={p['env']} 'delay_steps={list(cfg.delay_steps)}' 'scales={list(cfg.scales)}' "
             + ("'grip_authority=[" + ", ".join(str(g).lower() for g in cfg.grip_authority) + "]' "
                if list(cfg.grip_authority) != [False, True] else "")
             + (f"'noise_std={list(cfg.noise_std)}' " if cfg.noise_std else "")
             + (f"anchor_episodes={cfg.anchor_episodes} " if cfg.anchor_episodes != 20 else "")
             + f"run.test_episodes={e['episodes']}` — base `{p['checkpoint']}`; {e['episodes']} test episodes "
             f"(seeds {e['seed_base']}..), the same for every cell; 95% bootstrap intervals.", "",
             "The projected expert `r = clip((expert(o_t) - b_t) / scale, -1, 1)` acts through the learner's "
             "scheduler, delay and bound; *+ grip*: the gripper entry is the expert's own.", "",
             "| d | policy | success | 95% CI |", "|---:|---|---:|---:|"]
    for c in p["cells"]:
        what = "base alone" if c["scale"] is None else f"bound {c['scale']}" + (" + grip" if c["grip_authority"]
                                                                                 else "")
        lines.append(f"| {c['delay_steps']} | {what} | {c['success']:.3f} | {c['ci95'][0]:.3f}–{c['ci95'][1]:.3f} |")
    lines += ["", f"Anchor rows ({cfg.anchor_episodes} episodes of the expert's own demonstrations per delay, "
              "`run.demonstrations=expert`) whose residual target "
              "leaves the bound (any entry; per entry dx, dy, dz, dyaw, grip):", "",
              "| d | bound | rows | clipped (any) | per entry |", "|---:|---:|---:|---:|---|"]
    for c in p["anchor_clipping"]:
        lines.append(f"| {c['delay_steps']} | {c['scale']} | {c['rows']} | {c['share_any']:.3f} | "
                     f"{', '.join(f'{x:.2f}' for x in c['share_per_entry'])} |")
    if p.get("exploration"):
        lines += ["", f"Exploration the task tolerates: the projected expert at the default bound "
                  f"{p['default_scale']} with the learner's exploration noise on its r (`noise_std`, residual "
                  "units): *white* independent per step, *differenced* (xi_t - xi_{t-1}) / sqrt(2) "
                  "(`run.learner.exploration_differenced`). The actions are deltas the controller integrates "
                  "into the hand's target, so white noise walks the target away; differenced noise's sum stays "
                  "bounded.", "", "| d | noise std | process | success | 95% CI |", "|---:|---:|---|---:|---:|"]
        for c in p["exploration"]:
            lines.append(f"| {c['delay_steps']} | {c['noise']['std']} | {c['noise']['process']} | {c['success']:.3f} "
                         f"| {c['ci95'][0]:.3f}–{c['ci95'][1]:.3f} |")
    lines += ["", f"![ceiling](ceiling_{p['env']}.png)", ""]
    return "\n".join(lines)
