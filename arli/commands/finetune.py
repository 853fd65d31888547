"""``arli finetune``: the main job. Makes sure demos and a base policy exist, collects anchor
data with the intervener, runs ARLI residual RL under simulated latency, evaluates base vs
finetuned on the same seeds and latency, and writes ``outputs/<run>/``."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from omegaconf import OmegaConf

# first: the snapshot of the code files before the run imports the code it runs (the summary's
# ``sources``)
from arli.bench.provenance import loaded_sources  # noqa: I001
from arli.bench.common import machine_info, success_plot
from arli.config import ConfigError, FinetuneConfig
from arli.policies.load import EXPERT, policy_digest
from arli.runs import make_finetuner
from sim_envs import make_env


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


def run_videos(cfg: FinetuneConfig, ft, name: str, out_dir: str, episodes: int, writer=None,
               seed_base: int | None = None) -> list[dict]:
    """Rollout videos of the first ``episodes`` seeds from ``seed_base`` (default: the test
    seeds), the base alone against base + residual, every camera of the task -> ``<out_dir>/videos/``
    (and filmstrips to ``writer``). Rendered at ``cfg.video_size``, or at the base's own image
    size when it reads cameras (it refuses frames of another size)."""
    if episodes <= 0:
        return []
    from arli.videos import write_run_videos  # noqa: PLC0415
    from sim_envs.franka import CAMERAS  # noqa: PLC0415

    sizes = {h for h, w, _ in ft.base.camera_shapes().values() if h and h == w} \
        if hasattr(ft.base, "camera_shapes") else set()
    size = sizes.pop() if len(sizes) == 1 else cfg.video_size

    def render_env():
        return make_env(name, dt=cfg.env.dt, max_episode_steps=cfg.env.max_episode_steps,
                        image_size=size, cameras=list(CAMERAS))

    controllers = {"base alone": None, f"base + {cfg.run.variant} residual": ft.evaluation_controller()}
    first = cfg.run.test_seed if seed_base is None else seed_base
    seeds = list(range(first, first + episodes))
    print(f"rollout videos of seeds {seeds} ({', '.join(CAMERAS)} cameras, {size} px) -> {out_dir}/videos/")
    try:
        return write_run_videos(render_env, ft.base, ft.chunking, ft.latency, controllers, seeds, out_dir, writer,
                                ft.env_steps)
    except Exception as exc:  # the run's results do not depend on its videos
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        hint = ("the base refused the rendered frames" if isinstance(exc, ValueError) else
                "rendering needs an OpenGL context: headless machines render with MUJOCO_GL=egl (or osmesa)")
        print(f"arli: no rollout videos ({type(exc).__name__}: {first_line}); {hint}; `videos=0` skips them",
              file=sys.stderr)
        return []


def test_report(run, split: dict, outcomes: dict[str, list[bool]]) -> dict:
    """Per-episode outcomes of each evaluated policy on one seed range, their success with a
    95% bootstrap interval, and the paired gains (finetuned vs start, vs base) with theirs.
    ``final``: the deployed residual; ``trained``: the one RL trained (they differ where the end
    guard dropped it)."""
    from arli.stats import gain_ci, success_ci, verdict  # noqa: PLC0415

    out = {"split": split, "outcomes": outcomes,
           "success": {k: float(np.mean(v)) for k, v in outcomes.items()},
           "ci95": {k: list(success_ci(v)) for k, v in outcomes.items()}, "gains": {}}
    for a, b in (("final", "start"), ("final", "base"), ("start", "base"), ("trained", "start")):
        if a in outcomes and b in outcomes:
            ci = gain_ci(outcomes[a], outcomes[b])
            out["gains"][f"{a}-{b}"] = {"mean": out["success"][a] - out["success"][b], "ci95": list(ci),
                                        "verdict": verdict(ci)}
    return out


def base_identity(checkpoint: str) -> str:
    """Which base a run finetuned, so runs on different bases are never pooled or paired: the
    content digest of a local checkpoint (or ``expert``), else the hub id as given."""
    return policy_digest(checkpoint) if checkpoint == EXPERT or os.path.isdir(checkpoint) else f"id:{checkpoint}"


def torch_threads() -> int:
    import torch  # noqa: PLC0415

    return torch.get_num_threads()


def main(cfg: FinetuneConfig) -> int:
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

    from arli.rl.learner import LearnerDiverged  # noqa: PLC0415
    from arli.rl.config import REPORTED_TEST_EPISODES  # noqa: PLC0415

    start = time.time()
    if cfg.resume and not os.path.exists(os.path.join(cfg.resume, "trainer_state.pt")):
        # before anything is trained or written: a bad resume= next to an existing output_dir
        # would otherwise overwrite that run's config.yaml
        raise ConfigError(f"resume: no finetuning checkpoint at {cfg.resume} (missing trainer_state.pt); pass the "
                          "checkpoint/ directory of an `arli finetune` run, e.g. resume=outputs/<run>/checkpoint")
    ft, name, delay = make_finetuner(cfg)
    base_digest = base_identity(cfg.checkpoint)
    spec = cfg.run
    run_dir = cfg.output_dir or new_run_dir(os.path.join("outputs", f"finetune_{name}_{spec.variant}_d{delay}"))
    os.makedirs(run_dir, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(cfg), os.path.join(run_dir, "config.yaml"))
    test = {"split": "test", "seed_base": spec.test_seed, "episodes": spec.test_episodes}
    if spec.test_episodes < REPORTED_TEST_EPISODES:
        print(f"note: run.test_episodes={spec.test_episodes} < {REPORTED_TEST_EPISODES}: this run's final numbers "
              "are for a check, too few episodes to report a gain (the protocol reports on >= "
              f"{REPORTED_TEST_EPISODES})", flush=True)
    if cfg.resume:
        ft.load(cfg.resume)
        print(f"resumed {cfg.resume} at env step {ft.env_steps}")
    else:
        prep = ft.prepare(progress=True)
        print(f"anchor data: {prep['anchor_transitions']} transitions from {spec.anchor_episodes} demonstration "
              f"episodes; anchor pretraining loss {prep['pretrain_loss']:.4f}")
        guard = prep.get("start_guard")
        if guard:
            print(f"start guard ({guard['episodes']} tune episodes): anchored start {guard['start']:.2f}, base "
                  f"{guard['base']:.2f} -> " + ("start dropped: RL starts from the base (zero residual)"
                                                if guard["reverted"] else "RL starts from the anchored start"))
    curve_start = None
    anchor_eval = ft.start_record.get("start_test")  # a resumed run's, from its checkpoint
    if anchor_eval is not None and (anchor_eval["seed_base"], anchor_eval["episodes"]) != (spec.test_seed,
                                                                                          spec.test_episodes):
        print(f"the start was evaluated on {anchor_eval['episodes']} test episodes from seed "
              f"{anchor_eval['seed_base']}, not this run's; the summary leaves the start out")
        anchor_eval = None
    if not cfg.resume:  # the RL run's starting point: anchor-pretrained residual, no online step
        print(f"evaluating the anchor-pretrained start ({spec.test_episodes} test episodes)")
        anchor_eval = ft.evaluate_test()
        ft.start_record["start_test"] = {"seed_base": spec.test_seed, "episodes": spec.test_episodes,
                                         "success": anchor_eval["success"], "outcomes": anchor_eval["outcomes"],
                                         "sim_unstable_episodes": anchor_eval["sim_unstable_episodes"]}
        # the curve's own start, on the tune seeds like every curve point
        curve_start = ft.evaluate(spec.eval_episodes, diagnostics=True)
        ft.history.insert(0, {"env_steps": 0, "success": curve_start["success"],
                              "eval_episodes": spec.eval_episodes, "episodes": 0, "updates": 0,
                              "wall_s": 0.0, "q_eval": curve_start["q_mean"],
                              "return_eval": curve_start["return_mean"], "intervened_steps": 0})
    print(f"evaluating the base policy ({spec.test_episodes} test episodes, async {cfg.chunking.strategy}, "
          f"d={delay})")
    base_eval = ft.evaluate_test(residual=False)
    writer = SummaryWriter(os.path.join(run_dir, "tb"))
    train_start, steps_before, updates_before = time.time(), ft.env_steps, ft.learner.updates
    try:
        ft.train(writer=writer, checkpoint_dir=os.path.join(run_dir, "checkpoint"))
    except LearnerDiverged as exc:
        writer.close()
        print(f"arli finetune: stopped: {exc}", file=sys.stderr)
        return LearnerDiverged.exit_code
    train_s = time.time() - train_start
    # the training state, the trained actor in it: resuming continues it, and the tuning and
    # critic benches judge what this setting trained; the summary names what is deployed
    # (``deployed_actor``: `arli eval` rebuilds the start from the checkpoint's actor_start), as
    # does residual_actor.safetensors
    ft.save(os.path.join(run_dir, "checkpoint"))
    trained = final = ft.evaluate_test()
    end_guard = ft.guard_end() if spec.end_guard else None
    if end_guard and end_guard["reverted"]:
        print(f"end guard ({end_guard['episodes']} tune episodes): trained {end_guard['trained']:.2f} < start "
              f"{end_guard['start']:.2f} -> the trained residual is dropped, the start deployed")
        ft.save_actor(os.path.join(run_dir, "checkpoint"))  # the deployed residual alone
        same_seeds = anchor_eval is not None and len(anchor_eval["outcomes"]) == spec.test_episodes
        # the start's weights on the same seeds: its outcomes again (evaluation is seeded per episode)
        final = anchor_eval if same_seeds else ft.evaluate_test()
    writer.add_scalar("eval/final_success", final["success"], ft.env_steps)
    writer.flush()
    outcomes = {"base": base_eval["outcomes"], "final": final["outcomes"], "trained": trained["outcomes"]}
    if anchor_eval is not None:
        outcomes["start"] = anchor_eval["outcomes"]
    report = test_report(spec, test, outcomes)
    with open(os.path.join(run_dir, "eval_test.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    start_success = anchor_eval["success"] if anchor_eval else None
    plot_curve(ft.history, base_eval["success"], os.path.join(run_dir, "learning_curve.png"),
               f"{spec.variant} residual ({spec.regime}) on {name}, async {cfg.chunking.strategy}, d={delay}",
               start_success, final["success"], ft.env_steps)
    summary = {
        "env": name, "variant": spec.variant, "regime": spec.regime, "strategy": cfg.chunking.strategy,
        "delay_steps": delay, "base_digest": base_digest, "anchor_only_success": start_success,
        "start_guard": ft.start_record.get("start_guard"), "end_guard": end_guard,
        "deployed_actor": "actor_start" if end_guard and end_guard["reverted"] else "actor",
        "trained_success": trained["success"],
        "env_steps": ft.env_steps, "updates": ft.learner.updates,
        # anchor replay = anchor episodes + online intervention steps
        "anchor_transitions": len(ft.anchor), "intervened_steps": ft.controller.intervened_steps,
        "intervention_share": round(ft.controller.intervened_steps / max(ft.env_steps, 1), 4),
        "takeovers": ft.controller.takeovers,
        "base_success": base_eval["success"], "finetuned_success": final["success"],
        "eval": test, "ci95": report["ci95"], "gains": report["gains"],
        "steps_to_80": steps_to(ft.history, 0.8), "curve_eval": {"split": "tune", "seed_base": spec.tune_seed,
                                                                 "episodes": spec.eval_episodes},
        "device": str(ft.learner.device),  # where the base and the learner ran (what the speeds depend on)
        "env_steps_per_s": round((ft.env_steps - steps_before) / max(train_s, 1e-9), 1),
        "updates_per_s": round((ft.learner.updates - updates_before) / max(train_s, 1e-9), 1),
        "train_time_s": ft.time_breakdown(),
        "learner_diagnostics": ft.learner_diagnostics(),
        # episodes MuJoCo's reset of an unstable state ended early (counted as failures): the
        # test evaluations' own, and every episode of the run (training, guard, curve, test)
        "sim_unstable_episodes": {"test_base": base_eval["sim_unstable_episodes"],
                                  "test_start": (anchor_eval or {}).get("sim_unstable_episodes"),
                                  "test_final": final["sim_unstable_episodes"], "run": ft.unstable_episodes},
        "history": ft.history, "episodes": ft.episode_log,
        "wall_s": round(time.time() - start, 1), "run_dir": run_dir,
        # what else a result depends on: the code that ran (file digests, as a sweep cell records
        # them) and torch's thread count (a policy's float sums follow it)
        "sources": loaded_sources(), "torch_threads": torch_threads(),
        # the machine, and how busy it was over the run's last 1 / 5 / 15 minutes (runnable
        # processes): a wall time is this run's speed only when the load was about its own threads
        "machine": {**machine_info(), "load_avg": [round(x, 2) for x in os.getloadavg()]},
    }
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    # last: every number above is on disk before any rendering runs
    summary["videos"] = run_videos(cfg, ft, name, run_dir, cfg.videos, writer)
    writer.close()
    if summary["videos"]:
        with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)
    ci = report["ci95"]
    print(f"\n| policy (async {cfg.chunking.strategy}, d={delay}; {spec.test_episodes} test episodes, seeds "
          f"{spec.test_seed}..) | success | 95% CI |")
    print("|---|---:|---:|")
    print(f"| base | {base_eval['success']:.2f} | {ci['base'][0]:.2f}–{ci['base'][1]:.2f} |")
    if start_success is not None:
        dropped = (summary["start_guard"] or {}).get("reverted", False)
        label = ("RL's start: the base (the start guard dropped the anchored residual)" if dropped
                 else "base + anchor-pretrained residual (0 online steps)")
        print(f"| {label} | {start_success:.2f} | {ci['start'][0]:.2f}–{ci['start'][1]:.2f} |")
    by_intervener = (f", {ft.controller.intervened_steps} of them by the intervener "
                     f"({summary['intervention_share']:.0%}, {ft.controller.takeovers} takeovers)"
                     if spec.regime == "hil" else "")
    if end_guard and end_guard["reverted"]:
        print(f"| base + {spec.variant} residual as RL trained it ({ft.env_steps} env steps{by_intervener}; "
              f"dropped by the end guard) | {trained['success']:.2f} | {ci['trained'][0]:.2f}–{ci['trained'][1]:.2f} |")
        print(f"| deployed after RL: the start (end guard) | {final['success']:.2f} "
              f"| {ci['final'][0]:.2f}–{ci['final'][1]:.2f} |")
    else:
        print(f"| base + {spec.variant} residual after RL ({ft.env_steps} env steps{by_intervener}) "
              f"| {final['success']:.2f} | {ci['final'][0]:.2f}–{ci['final'][1]:.2f} |")
    for key, gain in report["gains"].items():
        if key == "trained-start" and not (end_guard and end_guard["reverted"]):
            continue  # the same residual as final-start
        print(f"gain {key}: {gain['mean']:+.3f}, 95% CI [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] "
              f"({gain['verdict']} 0)")
    if curve_start is not None:
        points = ", ".join(f"{h['success']:.2f}" for h in ft.history[1:])
        print(f"learning curve ({spec.eval_episodes} tune episodes): {curve_start['success']:.2f} -> {points}")
    if summary["sim_unstable_episodes"]["run"]:
        print(f"note: {summary['sim_unstable_episodes']['run']} episodes ended early when MuJoCo reset an unstable "
              "state (counted as failures; per evaluation in summary.json)")
    print(f"{summary['env_steps_per_s']} env steps/s, {summary['updates_per_s']} updates/s while training "
          f"(base and learner on {summary['device']})")
    print("training time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary["train_time_s"].items()))
    print(f"\nwrote {run_dir}/ (checkpoint/, tb/, learning_curve.png, summary.json, eval_test.json"
          f"{', videos/' if summary['videos'] else ''}) in "
          f"{summary['wall_s']:.0f} s")
    return 0
