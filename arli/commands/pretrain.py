"""``arli collect-demos`` and ``arli pretrain``."""

from __future__ import annotations

from arli.config import CollectDemosConfig, PretrainConfig
from arli.demos import collect_demos, describe_timing
from arli.pretrain import pretrain


def collect_main(cfg: CollectDemosConfig) -> int:
    out = collect_demos(cfg.env.name, cfg.episodes, cfg.root, cfg.seed, cfg.env.dt, cfg.env.image_size,
                        cameras=cfg.env.cameras)
    print(f"recorded {out['episodes']} successful episodes ({out['attempts']} attempts) -> {cfg.root}")
    print(describe_timing(out["timing"]))
    return 0


def main(cfg: PretrainConfig) -> int:
    summary = pretrain(cfg)
    last = summary["history"][-1] if summary["history"] else {}
    print(f"saved {cfg.output_dir}  ({summary['frames']} frames, {summary['train_time_s']} s, "
          f"final sync success {last.get('success', float('nan')):.2f}, digest {summary['digest']} "
          f"with {summary['threads']} threads)")
    return 0
