"""Rollout videos (``arli finetune videos=N``, ``arli eval videos=N``): every camera of the
task, the policies stacked per seed, an MP4 that reads back, and the same outcome as the
state-only evaluation of that seed (rendering does not change the episode)."""

import numpy as np
import pytest

from arli.chunking import ChunkingConfig
from arli.latency import FixedLatency
from arli.policies.expert import ExpertChunkPolicy
from arli.rollout import evaluate_policy
from arli.videos import write_run_videos
from sim_envs import make_env


@pytest.mark.slow
def test_videos_show_every_camera_and_the_evaluated_outcome(tmp_path):
    import imageio.v3 as iio
    from torch.utils.tensorboard import SummaryWriter

    chunking, latency, S = ChunkingConfig(), FixedLatency(4 * 0.05), 32
    policy = ExpertChunkPolicy("pick_cube", 16)
    seeds = [5_000_000, 5_000_001]
    evaluated = [evaluate_policy(make_env("pick_cube", max_episode_steps=60), policy, chunking, latency, 1, s)
                 ["outcomes"][0] for s in seeds]
    writer = SummaryWriter(str(tmp_path / "tb"))
    out = write_run_videos(lambda: make_env("pick_cube", max_episode_steps=60, image_size=S,
                                            cameras=["front", "wrist"]),
                           policy, chunking, latency, {"base alone": None, "again": None}, seeds, str(tmp_path),
                           writer)
    writer.close()
    assert [o["success"]["base alone"] for o in out] == evaluated
    assert all(o["success"]["again"] == o["success"]["base alone"] for o in out)  # deterministic per seed
    video = iio.imread(out[0]["path"], plugin="pyav")
    assert out[0]["cameras"] == ["front", "wrist"]
    T, H, W, _ = video.shape
    assert (H, W) == (2 * S, 2 * S) and 10 < T <= 61  # two policies stacked, two cameras side by side
    left, right = video[T // 2, :S, :S].astype(float), video[T // 2, :S, S:].astype(float)
    assert np.abs(left - right).mean() > 5  # front and wrist are different views
    assert list((tmp_path / "tb").iterdir())  # the filmstrips went to TensorBoard
