"""``arli collect-demos`` and ``arli pretrain``."""

from __future__ import annotations

import json
import os
import time

import torch

from arli.config import CollectDemosConfig, PretrainConfig
from arli.demos import collect_demos, describe_timing, load_chunk_dataset
from arli.pretrain import build_policy, make_evaluator, train_flow


def collect_main(cfg: CollectDemosConfig) -> int:
    out = collect_demos(cfg.env.name, cfg.episodes, cfg.root, cfg.seed, cfg.env.dt, cfg.env.image_size)
    print(f"recorded {out['episodes']} successful episodes ({out['attempts']} attempts) -> {cfg.root}")
    print(describe_timing(out["timing"]))
    return 0


def ensure_demos(cfg: PretrainConfig) -> None:
    """Collect ``cfg.demos`` demonstrations if ``dataset_root`` holds none; say so when the
    dataset there has another count (an interrupted collection keeps its committed batches)."""
    info = os.path.join(cfg.dataset_root, "meta", "info.json")
    if not os.path.exists(info):
        print(f"no demos at {cfg.dataset_root}: collecting {cfg.demos} with the scripted expert")
        collect_demos(cfg.env.name, cfg.demos, cfg.dataset_root, cfg.seed, cfg.env.dt,
                      cfg.env.image_size)
        return
    with open(info, encoding="utf-8") as fh:
        have = int(json.load(fh).get("total_episodes", 0))
    if have != cfg.demos:
        print(f"warning: {cfg.dataset_root} holds {have} episodes, not demos={cfg.demos}; pretraining on "
              f"those {have} (delete the directory to collect {cfg.demos} afresh)")


def ensure_base_policy(checkpoint: str, pretrain_cfg: PretrainConfig, env_cfg) -> None:
    """Pretrain (collecting demos first if needed) when the *default* checkpoint holds no
    policy. Any other path must exist: a mistyped checkpoint is an error, not a 5-15 minute
    pretraining into the typo."""
    if checkpoint == "expert" or os.path.exists(os.path.join(checkpoint, "config.json")):
        return
    default = f"checkpoints/base_{env_cfg.name}"
    if os.path.normpath(checkpoint) != os.path.normpath(default):
        from arli.config import ConfigError  # noqa: PLC0415

        raise ConfigError(f"checkpoint: no policy at {checkpoint} (no config.json there); pass an existing "
                          f"checkpoint directory or 'expert', or train one: arli pretrain env={env_cfg.name} "
                          f"output_dir={checkpoint}")
    print(f"no base policy at {checkpoint}: running arli pretrain")
    pretrain_cfg.output_dir, pretrain_cfg.env = checkpoint, env_cfg
    pretrain(pretrain_cfg)


def pretrain(cfg: PretrainConfig) -> dict:
    """Train + save the base policy; returns the summary written next to the checkpoint."""
    ensure_demos(cfg)
    start = time.time()
    data = load_chunk_dataset(cfg.dataset_root, cfg.policy.chunk_size)
    # seeded before the network is built: its initial weights come from the global generator,
    # and an unseeded init made every fresh clone's base policy a different one
    torch.manual_seed(cfg.seed)
    policy = build_policy(data, cfg.policy)
    evaluate = make_evaluator(cfg.env.name, cfg.eval_episodes, seed=50_000, dt=cfg.env.dt,
                              image_size=policy.cfg.image_size)
    history = train_flow(policy, data, cfg.steps, cfg.batch_size, cfg.lr, cfg.weight_decay,
                         cfg.seed, evaluate, cfg.eval_every)
    policy.save(cfg.output_dir)
    summary = {"env": cfg.env.name, "frames": int(len(data["state"])),
               "episodes": int(data["episode_index"].max() + 1), "steps": cfg.steps,
               "train_time_s": round(time.time() - start, 1), "history": history}
    with open(os.path.join(cfg.output_dir, "pretrain_summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    return summary


def main(cfg: PretrainConfig) -> int:
    summary = pretrain(cfg)
    last = summary["history"][-1] if summary["history"] else {}
    print(f"saved {cfg.output_dir}  ({summary['frames']} frames, {summary['train_time_s']} s, "
          f"final sync success {last.get('success', float('nan')):.2f})")
    return 0
