"""``arli eval run=<run dir> [seed_base=... episodes=...]``: a finetuned residual and the base
alone on the same episode seeds, per episode, with 95% intervals (as ``lerobot-eval`` writes
per-episode results for LeRobot policies)."""

from __future__ import annotations

import json
import os

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from arli.config import ConfigError, EvalConfig, FinetuneConfig, validate


def load_run_config(run_dir: str) -> FinetuneConfig:
    """The finetune config a run saved (``<run>/config.yaml``), validated as at its start."""
    path = os.path.join(run_dir, "config.yaml")
    if not run_dir or not os.path.exists(path):
        raise ConfigError(f"run: no finetune run at {run_dir} (missing config.yaml); pass an `arli finetune` "
                          "output directory")
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(FinetuneConfig), OmegaConf.load(path)))
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"run: {path} does not fit this ARLI's finetune config ({first}); evaluate it with "
                          "the version that wrote it, or rerun it") from None
    validate(cfg)
    return cfg


def split_of(spec, seed_base: int, episodes: int, train: range) -> str:
    """Which seeds these are to the run: 'test' (within its test seeds), 'tune' (its curve's,
    where its choices were made), 'train' (its demonstration and training episodes), else
    'other' (seeds the run never saw)."""
    asked = range(seed_base, seed_base + episodes)

    def meets(r: range) -> bool:
        return asked.start < r.stop and r.start < asked.stop

    test = spec.test_range()
    if test.start <= asked.start and asked.stop <= test.stop:
        return "test"
    return "tune" if meets(spec.tune_range()) else "train" if meets(train) else "other"


def main(cfg: EvalConfig) -> int:
    from arli.commands.finetune import make_finetuner, test_report  # noqa: PLC0415

    run_cfg = load_run_config(cfg.run)
    ft, name, delay = make_finetuner(run_cfg)
    ft.load(os.path.join(cfg.run, "checkpoint"))
    spec = run_cfg.run
    seed_base = spec.test_seed if cfg.seed_base is None else cfg.seed_base
    episodes = spec.test_episodes if cfg.episodes is None else cfg.episodes
    split = {"split": split_of(spec, seed_base, episodes, ft.train_range()), "seed_base": seed_base,
             "episodes": episodes}
    print(f"evaluating {cfg.run} ({spec.variant}, d={delay}, {ft.env_steps} env steps) and the base alone on "
          f"{episodes} episodes from seed {seed_base} ({split['split']} seeds)", flush=True)
    final = ft.evaluate(episodes, seed_base)
    base = ft.evaluate(episodes, seed_base, residual=False)
    report = test_report(spec, split, {"base": base["outcomes"], "final": final["outcomes"]})
    report.update(env=name, variant=spec.variant, delay_steps=delay, env_steps=ft.env_steps)
    out = cfg.output or os.path.join(cfg.run, f"eval_{seed_base}_{episodes}.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    ci, gain = report["ci95"], report["gains"]["final-base"]
    print(f"base {report['success']['base']:.3f} [{ci['base'][0]:.3f}, {ci['base'][1]:.3f}]  "
          f"finetuned {report['success']['final']:.3f} [{ci['final'][0]:.3f}, {ci['final'][1]:.3f}]  "
          f"gain {gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, {gain['ci95'][1]:+.3f}] ({gain['verdict']} 0)")
    print(f"wrote {out}")
    return 0
