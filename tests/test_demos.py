import numpy as np
import pytest

from arli.demos import collect_demos, load_chunk_dataset
from arli.record import EpisodeRecorder, dataset_features
from sim_envs import make_env
from sim_envs.experts import EXPERTS


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos") / "pick"
    out = collect_demos("pick_cube", 3, str(root), seed=0)
    assert out["episodes"] == 3
    return root


def test_dataset_is_read_back_by_lerobots_loader(demo_root):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("arli/local", root=demo_root)
    assert ds.num_episodes == 3 and ds.fps == 20
    assert ds.meta.info["codebase_version"].startswith("v3")
    for key in ("observation.state", "observation.environment_state", "action", "next.reward", "next.done"):
        assert key in ds.features
    assert ds.features["observation.state"]["names"][0] == "ee_x"
    assert ds.features["observation.environment_state"]["names"][0] == "cube_x"
    frame = ds[0]
    assert frame["task"] == make_env("pick_cube").instruction
    assert frame["action"].shape == (5,)
    # the recorded actions are exactly what the expert does from the recorded seed
    env = make_env("pick_cube")
    obs, _ = env.reset(seed=0)
    length = int(ds.meta.episodes["length"][0])
    for i in range(length):
        a = EXPERTS["pick_cube"](obs["state"])
        np.testing.assert_allclose(ds[i]["action"].numpy(), a, atol=1e-6)
        # LeRobot's layout: proprioception, then the object / task state
        full = np.concatenate([ds[i]["observation.state"].numpy(), ds[i]["observation.environment_state"].numpy()])
        assert ds[i]["observation.state"].shape == (9,)
        np.testing.assert_allclose(full, obs["state"], atol=1e-6)
        obs, *_ = env.step(a)
    assert bool(ds[length - 1]["next.done"]) and float(ds[length - 1]["next.reward"]) == 1.0


def test_chunk_targets_follow_the_episode_and_pad_with_hold(demo_root):
    data = load_chunk_dataset(str(demo_root), chunk_size=8)
    ep = data["episode_index"]
    end = int(np.flatnonzero(ep == 0)[-1])
    raw = data["chunks"][:, 0]  # slot 0 = the frame's own action
    np.testing.assert_array_equal(data["chunks"][0, 3], raw[3])
    last = data["chunks"][end]
    np.testing.assert_array_equal(last[0], raw[end])
    assert np.all(last[1:, :4] == 0) and np.all(last[1:, 4] == raw[end, 4])  # hold
    assert data["task"] == "pick up the red cube and lift it"


def test_crash_mid_episode_keeps_saved_episodes_readable(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    env = make_env("pick_cube")
    root = tmp_path / "crash"
    features = dataset_features(env.state_names, ("dx", "dy", "dz", "dyaw", "grip"))
    with pytest.raises(RuntimeError, match="boom"):
        with EpisodeRecorder(root, 20, features) as rec:
            for ep in range(2):
                obs, _ = env.reset(seed=ep)
                for t in range(5):
                    rec.add_frame(obs["state"], np.zeros(5), 0.0, t == 4, False, env.instruction)
                if ep == 0:
                    rec.save_episode()
            raise RuntimeError("boom")  # crash with episode 1 half-recorded
    ds = LeRobotDataset("arli/local", root=root)
    assert ds.num_episodes == 1 and len(ds) == 5
    with pytest.raises(FileExistsError, match="never overwritten"):
        EpisodeRecorder(root, 20, features)


def test_bad_frame_is_a_clear_error(tmp_path):
    env = make_env("pick_cube")
    features = dataset_features(env.state_names, ("dx", "dy", "dz", "dyaw", "grip"))
    with EpisodeRecorder(tmp_path / "bad", 20, features) as rec:
        with pytest.raises(ValueError, match="observation.state"):
            rec.add_frame(np.zeros(3), np.zeros(5), 0.0, False, False, "x")


def test_collect_demos_with_images_says_where_the_time_goes(tmp_path):
    from arli.demos import collect_demos, describe_timing  # noqa: PLC0415

    out = collect_demos("pick_cube", 1, str(tmp_path / "img"), image_size=32)
    timing = out["timing"]
    assert timing["frames"] > 10 and timing["fps"] > 0
    assert timing["render_s"] > 0 and timing["write_s"] > 0 and timing["physics_expert_s"] > 0
    parts = timing["render_s"] + timing["physics_expert_s"] + timing["write_s"] + timing["setup_s"]
    assert parts <= timing["total_s"] * 1.01
    line = describe_timing(timing)
    assert "fps" in line and "dominates" in line and "render" in line


def test_demos_in_the_old_layout_are_refused_with_how_to_fix(tmp_path):
    from arli.errors import InputError  # noqa: PLC0415

    env = make_env("pick_cube")
    old = dataset_features(env.state_names, ("dx", "dy", "dz", "dyaw", "grip"))  # object state in observation.state
    with EpisodeRecorder(tmp_path / "old", 20, old) as rec:
        obs, _ = env.reset(seed=0)
        for t in range(5):
            rec.add_frame(obs["state"], np.zeros(5, np.float32), 0.0, t == 4, False, env.instruction)
        rec.save_episode()
    with pytest.raises(InputError, match="arli collect-demos"):
        load_chunk_dataset(str(tmp_path / "old"), chunk_size=8)
    (tmp_path / "junk" / "meta").mkdir(parents=True)
    (tmp_path / "junk" / "meta" / "info.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot read"):
        load_chunk_dataset(str(tmp_path / "junk"), chunk_size=8)
    with pytest.raises(InputError, match="not a LeRobotDataset"):
        load_chunk_dataset(str(tmp_path / "nothing"), chunk_size=8)


@pytest.mark.slow
def test_demos_record_every_camera_as_a_video_lerobot_reads_back(tmp_path):
    """Two sim cameras -> two ``observation.images.<name>`` AV1 video features, decoded by
    LeRobot's loader at the right shape, different between the cameras, and back as
    (N, C, S, S, 3) training images in camera order."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    root = tmp_path / "cams"
    collect_demos("pick_cube", 2, str(root), seed=0, image_size=32, cameras=["front", "wrist"])
    ds = LeRobotDataset("arli/local", root=root, video_backend="pyav")
    assert ds.num_episodes == 2
    for cam in ("front", "wrist"):
        assert ds.features[f"observation.images.{cam}"]["dtype"] == "video"
        assert tuple(ds.features[f"observation.images.{cam}"]["shape"]) == (32, 32, 3)
    first, last = ds[0], ds[len(ds) - 1]
    for item in (first, last):
        front, wrist = item["observation.images.front"], item["observation.images.wrist"]
        assert front.shape == wrist.shape == (3, 32, 32)
        assert float((front - wrist).abs().mean()) > 0.1
    # the wrist camera rode along with the hand: its first and last views differ
    assert float((first["observation.images.wrist"] - last["observation.images.wrist"]).abs().mean()) > 0.05
    data = load_chunk_dataset(str(root), chunk_size=8)
    assert data["cameras"] == ["front", "wrist"] and data["images"].shape == (len(ds), 2, 32, 32, 3)
    # the training images are the loader's frames (same decoder), camera by camera
    np.testing.assert_allclose(data["images"][-1, 1].transpose(2, 0, 1) / 255.0,
                               last["observation.images.wrist"].numpy(), atol=1 / 255 + 1e-6)
    env = make_env("pick_cube", image_size=32, cameras=["front", "wrist"])
    obs, _ = env.reset(seed=0)  # and they are what the cameras saw (AV1 is lossy: close, not equal)
    for c, cam in enumerate(("front", "wrist")):
        assert np.abs(data["images"][0, c].astype(int) - obs["images"][cam]).mean() < 12
