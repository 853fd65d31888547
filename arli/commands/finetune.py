"""``arli finetune``: the main job. Makes sure demos and a base policy exist, collects anchor
data with the intervener, runs ARLI residual RL under simulated latency, evaluates base vs
finetuned on the same seeds and latency, and writes ``outputs/<run>/``."""

from __future__ import annotations

import json
import os
import sys
import time

from omegaconf import OmegaConf

from arli.bench.common import success_plot
from arli.pretrain import ensure_base_policy
from arli.config import ConfigError, FinetuneConfig
from arli.latency import FixedLatency, latency_from_config, to_delay_steps
from sim_envs import make_env, task_name
from sim_envs.experts import EXPERTS


def steps_to(history: list[dict], level: float) -> int | None:
    """First evaluated env step at which success reached ``level`` (None if never)."""
    return next((h["env_steps"] for h in history if h["success"] >= level), None)


def plot_curve(history: list[dict], base: float, path: str, title: str,
               start: float | None = None, final: float | None = None, final_steps: int = 0) -> None:
    """Evaluation success vs online env steps (the first point: the anchor-pretrained start
    at step 0, on the curve's seeds); ``base`` = the base policy alone; ``start`` / ``final``:
    the anchor-pretrained and finetuned residual on the larger final evaluation."""
    steps, success = [h["env_steps"] for h in history], [h["success"] for h in history]
    with success_plot(path, title, "online environment steps") as ax:
        ax.plot(steps, success, marker="o", label="base + residual (eval)")
        if start is not None and final is not None:
            ax.plot([0, final_steps], [start, final], ls="none", marker="s", color="tab:red",
                    label="anchor start and final (final-evaluation seeds)")
        ax.axhline(base, color="gray", ls="--", label="base policy")


def make_finetuner(cfg: FinetuneConfig, image_size: int = 0):
    """The run's Finetuner (base policy trained first if missing) -> (ft, task name, delay).
    ``image_size`` > 0 renders the task camera into every observation."""
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.policies.load import load_base_policy  # noqa: PLC0415

    name = task_name(cfg.env.name)
    if getattr(cfg, "robot", "sim") == "franka":
        return _real_robot_finetuner(cfg, name)
    if name not in EXPERTS and (cfg.anchor_episodes or cfg.regime == "hil"):
        raise ConfigError(f"env.name: {name} has no scripted expert for demonstrations or interventions; "
                          "set anchor_episodes=0 regime=rl")
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    env = make_env(name, dt=cfg.env.dt, max_episode_steps=cfg.env.max_episode_steps, image_size=image_size)
    base = load_base_policy(cfg.checkpoint, env.unwrapped.instruction, name,
                            cfg.pretrain.policy.chunk_size, state_dim=env.observation_space["state"].shape[0])
    latency = (FixedLatency(cfg.delay_steps * cfg.env.dt) if cfg.delay_steps is not None
               else latency_from_config(cfg.latency))
    delay = to_delay_steps(latency.max_latency(), cfg.env.dt)
    model = getattr(base, "model", None)  # built-in policy: reuse its state normalisation
    mean = model.state_mean.numpy() if model is not None else None
    std = model.state_std.numpy() if model is not None else None
    return Finetuner(cfg, env, base, EXPERTS.get(name), latency, mean, std), name, delay


def new_run_dir(prefix: str) -> str:
    """Create and return ``<prefix>_<YYYYmmdd_HHMMSS>``, suffixed ``_2``, ``_3``, ... when a run
    started in the same second already owns it (two runs must never share checkpoints)."""
    stem, n = f"{prefix}_{time.strftime('%Y%m%d_%H%M%S')}", 1
    while True:
        path = stem if n == 1 else f"{stem}_{n}"
        try:
            os.makedirs(path)  # atomic: exactly one process creates each name
            return path
        except FileExistsError:
            n += 1


def main(cfg: FinetuneConfig) -> int:
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

    from arli.rl.learner import LearnerDiverged  # noqa: PLC0415

    start = time.time()
    ft, name, delay = make_finetuner(cfg)
    run_dir = cfg.output_dir or new_run_dir(os.path.join("outputs", f"finetune_{name}_{cfg.variant}_d{delay}"))
    os.makedirs(run_dir, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(cfg), os.path.join(run_dir, "config.yaml"))

    if cfg.resume:
        ft.load(cfg.resume)
        print(f"resumed {cfg.resume} at env step {ft.env_steps}")
    else:
        prep = ft.prepare(progress=True)
        print(f"anchor data: {prep['anchor_transitions']} transitions from {cfg.anchor_episodes} demonstration "
              f"episodes; anchor pretraining loss {prep['pretrain_loss']:.4f}")
    anchor_eval = curve_start = None
    if not cfg.resume:  # the RL run's starting point: anchor-pretrained residual, no online step
        print(f"evaluating the anchor-pretrained start ({cfg.final_eval_episodes} episodes)")
        anchor_eval = ft.evaluate(cfg.final_eval_episodes)
        # the curve's own start: the same seeds as every curve point (eval_episodes of them)
        curve_start = ft.evaluate(cfg.eval_episodes, diagnostics=True)
        ft.history.insert(0, {"env_steps": 0, "success": curve_start["success"], "episodes": 0, "updates": 0,
                              "wall_s": 0.0, "q_eval": curve_start["q_mean"],
                              "return_eval": curve_start["return_mean"], "intervened_steps": 0})
    print(f"evaluating the base policy ({cfg.final_eval_episodes} episodes, async {cfg.strategy}, d={delay})")
    base_eval = ft.evaluate(cfg.final_eval_episodes, residual=False)
    writer = SummaryWriter(os.path.join(run_dir, "tb"))
    try:
        ft.train(writer=writer, checkpoint_dir=os.path.join(run_dir, "checkpoint"))
    except LearnerDiverged as exc:
        writer.close()
        print(f"arli finetune: stopped: {exc}", file=sys.stderr)
        return 3
    ft.save(os.path.join(run_dir, "checkpoint"))
    final = ft.evaluate(cfg.final_eval_episodes)
    writer.add_scalar("eval/final_success", final["success"], ft.env_steps)
    writer.close()
    start_success = anchor_eval["success"] if anchor_eval else None
    plot_curve(ft.history, base_eval["success"], os.path.join(run_dir, "learning_curve.png"),
               f"{cfg.variant} residual ({cfg.regime}) on {name}, async {cfg.strategy}, d={delay}",
               start_success, final["success"], ft.env_steps)
    summary = {
        "env": name, "variant": cfg.variant, "regime": cfg.regime, "strategy": cfg.strategy,
        "delay_steps": delay, "anchor_only_success": start_success,
        "env_steps": ft.env_steps, "updates": ft.learner.updates,
        # anchor replay = anchor episodes + online intervention steps
        "anchor_transitions": len(ft.anchor), "intervened_steps": ft.controller.intervened_steps,
        "intervention_share": round(ft.controller.intervened_steps / max(ft.env_steps, 1), 4),
        "takeovers": ft.controller.takeovers,
        "base_success": base_eval["success"], "finetuned_success": final["success"],
        "eval_episodes": cfg.final_eval_episodes, "steps_to_80": steps_to(ft.history, 0.8),
        "history": ft.history, "episodes": ft.episode_log,
        "wall_s": round(time.time() - start, 1), "run_dir": run_dir,
    }
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(f"\n| policy (async {cfg.strategy}, delay_steps={delay}) | success ({cfg.final_eval_episodes} episodes) |")
    print("|---|---:|")
    print(f"| base | {base_eval['success']:.2f} |")
    if start_success is not None:
        print(f"| base + anchor-pretrained residual (0 online steps) | {start_success:.2f} |")
    by_intervener = (f", {ft.controller.intervened_steps} of them by the intervener "
                     f"({summary['intervention_share']:.0%}, {ft.controller.takeovers} takeovers)"
                     if cfg.regime == "hil" else "")
    print(f"| base + {cfg.variant} residual after RL ({ft.env_steps} env steps{by_intervener}) "
          f"| {final['success']:.2f} |")
    if curve_start is not None:
        points = ", ".join(f"{h['success']:.2f}" for h in ft.history[1:])
        print(f"\nlearning curve ({cfg.eval_episodes} episodes, same seeds): start {curve_start['success']:.2f} -> "
              f"{points}; final vs start on {cfg.final_eval_episodes} seeds: {final['success'] - start_success:+.2f}")
    print(f"\nwrote {run_dir}/ (checkpoint/, tb/, learning_curve.png, summary.json) in {summary['wall_s']:.0f} s")
    return 0


def _real_robot_finetuner(cfg, name: str):
    """The learner of a real arm: the residual state from proprioception (``ProprioOnly``),
    the chunk size of the served policy, no base policy, demos or sim evaluation here."""
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.policies.base import BasePolicy  # noqa: PLC0415
    from sim_envs.base import ProprioOnly  # noqa: PLC0415

    class ServedElsewhere(BasePolicy):
        def __init__(self, chunk_size: int, action_dim: int):
            self.chunk_size, self.action_dim = chunk_size, action_dim

        def infer(self, request):
            raise RuntimeError("the learner of a real robot has no base policy: chunks come from `arli serve` "
                               "to the robot; there is no evaluation in sim")

    env = ProprioOnly(make_env(name, dt=cfg.env.dt, max_episode_steps=cfg.env.max_episode_steps))
    base = ServedElsewhere(cfg.chunk_size, env.action_space.shape[0])
    # the scheduler's planned delay, from the same latency settings as a sim run
    latency = (FixedLatency(cfg.delay_steps * cfg.env.dt) if cfg.delay_steps is not None
               else latency_from_config(cfg.latency))
    delay = to_delay_steps(latency.max_latency(), cfg.env.dt)
    return Finetuner(cfg, env, base, None, latency), name, delay
