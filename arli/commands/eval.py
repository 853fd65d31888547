"""``arli eval run=<run dir> [seed_base=... episodes=...]``: a finetuned residual and the base
alone on the same episode seeds, per episode, with 95% intervals (as ``lerobot-eval`` writes
per-episode results for LeRobot policies)."""

from __future__ import annotations

import json
import os

from arli.config import ConfigError, EvalConfig
from arli.runs import load_run_config, split_of


def deployed_actor(run_dir: str) -> str:
    """Which of the checkpoint's actors the run deployed: "actor" (what RL trained) or
    "actor_start" (its end guard dropped the trained one); "actor" for runs without a summary
    or made before the guard."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return "actor"
    with open(path, encoding="utf-8") as fh:
        return json.load(fh).get("deployed_actor", "actor")


def main(cfg: EvalConfig) -> int:
    from arli.commands.finetune import run_videos, test_report  # noqa: PLC0415
    from arli.rl.learner import gate_shares  # noqa: PLC0415
    from arli.runs import make_finetuner  # noqa: PLC0415

    if not cfg.run:
        raise ConfigError("run: required; pass run=<an `arli finetune` output directory>, e.g. run=outputs/<run>")
    run_cfg = load_run_config(cfg.run)
    ft, name, delay = make_finetuner(run_cfg)
    ft.load(os.path.join(cfg.run, "checkpoint"))
    if deployed_actor(cfg.run) == "actor_start":  # the end guard dropped the trained residual
        ft.learner.revert_to_start()
        print("the run's end guard deployed its start: evaluating that residual (the checkpoint's actor_start)")
    if not cfg.gating:
        ft.learner.gating = False
        print("gating=false: the actor's own r(s) acts, without value gating")
    spec = run_cfg.run
    seed_base = spec.test_seed if cfg.seed_base is None else cfg.seed_base
    episodes = spec.test_episodes if cfg.episodes is None else cfg.episodes
    split = {"split": split_of(spec, seed_base, episodes, ft.train_ranges()), "seed_base": seed_base,
             "episodes": episodes}
    print(f"evaluating {cfg.run} ({spec.variant}, d={delay}, {ft.env_steps} env steps) and the base alone on "
          f"{episodes} episodes from seed {seed_base} ({split['split']} seeds)", flush=True)
    final = ft.evaluate(episodes, seed_base)
    base = ft.evaluate(episodes, seed_base, residual=False)
    report = test_report(spec, split, {"base": base["outcomes"], "final": final["outcomes"]})
    report.update(env=name, variant=spec.variant, delay_steps=delay, env_steps=ft.env_steps, gating=ft.learner.gating,
                  gate_picks=final["gate_picks"])
    writer = None
    if cfg.videos:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

        writer = SummaryWriter(os.path.join(cfg.run, "tb"))  # next to the run's own curves
    try:
        report["videos"] = run_videos(run_cfg, ft, name, cfg.run, cfg.videos, writer, seed_base)
    finally:
        if writer is not None:
            writer.close()
    out = cfg.output or os.path.join(cfg.run, f"eval_{seed_base}_{episodes}{'' if cfg.gating else '_ungated'}.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    ci, gain = report["ci95"], report["gains"]["final-base"]
    print(f"base {report['success']['base']:.3f} [{ci['base'][0]:.3f}, {ci['base'][1]:.3f}]  "
          f"finetuned {report['success']['final']:.3f} [{ci['final'][0]:.3f}, {ci['final'][1]:.3f}]  "
          f"gain {gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] ({gain['verdict']} 0)")
    if sum(final["gate_picks"].values()):
        print(f"value gating chose (share of gated steps): {gate_shares(final['gate_picks'])}")
    print(f"wrote {out}")
    return 0
