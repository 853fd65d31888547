"""Recording: crash-safe LeRobotDataset episodes (SIGKILL mid-episode and mid-save), the
`arli record` dataset read back by LeRobot's own loader and trained on by a LeRobot policy,
and a lost robot connection ending an episode with its data kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from process_utils import ROOT

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _load(root):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    # pyav: torchcodec (LeRobot's default video decoder) needs FFmpeg's shared libraries
    return LeRobotDataset("arli/local", root=root, video_backend="pyav")


def _episode_lengths(ds) -> list[int]:
    return [int(n) for n in np.bincount(np.asarray(ds.hf_dataset["episode_index"]))]


def _child(root: Path, crash: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "record_child.py"), str(root), crash, *extra],
                            cwd=ROOT, env={**ENV, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _check_cameras(ds, lengths: list[int]) -> None:
    """Each episode's first and last frame of both cameras decode to the grey levels the
    child wrote (front 10 * episode, wrist 10 * episode + 100)."""
    start = 0
    for ep, n in enumerate(lengths):
        for i in (start, start + n - 1):
            item = ds[i]
            assert item["observation.state"][0] == ep
            for c, name in enumerate(("front", "wrist")):
                frame = item[f"observation.images.{name}"]
                assert frame.shape == (3, 32, 32)
                assert abs(float(frame.mean()) * 255 - (10 * ep + 100 * c)) < 4, (ep, name)
        start += n


@pytest.mark.slow
@pytest.mark.parametrize("cameras", [False, True], ids=["state", "two_cameras"])
def test_sigkill_mid_episode_keeps_every_completed_episode(tmp_path, cameras):
    root = tmp_path / "ds"
    proc = _child(root, "mid", *(["cameras"] if cameras else []))
    saved: dict[int, int] = {}
    for line in proc.stdout:
        if line.startswith("saved"):
            _, ep, n = line.split()
            saved[int(ep)] = int(n)
        if line.startswith("mid") and len(saved) >= 3:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    ds = _load(root)
    assert ds.meta.total_episodes == len(saved) >= 3
    assert _episode_lengths(ds) == [saved[i] for i in range(len(saved))]
    last = ds[len(ds) - 1]
    assert last["observation.state"].tolist() == [len(saved) - 1, saved[len(saved) - 1] - 1]
    if cameras:
        _check_cameras(ds, [saved[i] for i in range(len(saved))])


@pytest.mark.slow
@pytest.mark.parametrize("cameras", [False, True], ids=["state", "two_cameras"])
def test_sigkill_inside_a_save_is_rolled_back_on_resume(tmp_path, cameras):
    from arli.record import EpisodeRecorder, dataset_features  # noqa: PLC0415

    root = tmp_path / "ds"
    proc = _child(root, "save", *(["cameras"] if cameras else []))
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == -signal.SIGKILL, out
    saved = [int(line.split()[2]) for line in out.splitlines() if line.startswith("saved")]
    assert len(saved) == 2  # killed inside the third save
    assert (root / ".arli_saving.json").exists()
    if cameras:  # LeRobot had written the third episode's data and videos
        assert len(list((root / "videos" / "observation.images.wrist").rglob("*.mp4"))) == 3
    names = ["front", "wrist"] if cameras else []
    features = dataset_features(["x", "y"], ["a"], 32 if cameras else 0, names, use_videos=True)
    with EpisodeRecorder(root, 20, features, resume=True) as rec:
        assert rec.total_episodes == 2  # the half-saved episode is gone
        for t in range(7):
            images = {c: np.full((32, 32, 3), 10 * 2 + 100 * i, np.uint8) for i, c in enumerate(names)}
            rec.add_frame(np.array([2, t], np.float32), np.zeros(1, np.float32), 0.0, t == 6, False, "count",
                          images)
        rec.save_episode()
    ds = _load(root)
    assert _episode_lengths(ds) == saved + [7]
    if cameras:
        _check_cameras(ds, saved + [7])
    with pytest.raises(ValueError, match="other features"):
        EpisodeRecorder(root, 20, dataset_features(["x", "y", "z"], ["a"]), resume=True)
    with pytest.raises(FileExistsError, match=r"append=true"):
        EpisodeRecorder(root, 20, dataset_features(["x", "y"], ["a"]))


@pytest.mark.slow
def test_batched_commits_lose_only_the_open_batch_on_sigkill(tmp_path):
    """commit_every = 3 (how scripted demonstrations are written): killed with episode 3
    saved but not committed and episode 4 half recorded, the dataset reopens with exactly
    the 3 committed episodes, the rest rolled back."""
    from arli.record import EpisodeRecorder, dataset_features  # noqa: PLC0415

    root = tmp_path / "ds"
    proc = _child(root, "batch")
    saved: dict[int, int] = {}
    committed = 0
    for line in proc.stdout:
        if line.startswith("saved"):
            _, ep, n = line.split()
            saved[int(ep)] = int(n)
        if line.startswith("committed"):
            committed = int(line.split()[1])
        if line.startswith("mid") and len(saved) >= 4:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert committed == 3 and len(saved) == 4
    assert (root / ".arli_saving.json").exists()  # the open batch's journal
    with EpisodeRecorder(root, 20, dataset_features(["x", "y"], ["a"]), resume=True) as rec:
        assert rec.total_episodes == 3
    assert _episode_lengths(_load(root)) == [saved[i] for i in range(3)]


def test_saves_read_nothing_back_and_the_dataset_stays_whole(tmp_path, monkeypatch):
    """The per-episode commit keeps one LeRobot dataset open: after the recorder is built no
    save reads metadata or data back (what made saves slower as the dataset grew), each
    save's journal covers three metadata files whatever the size, and the result — also
    after a resume that appends — reads back with LeRobot's loader, row for row."""
    import lerobot.datasets.lerobot_dataset as lds  # noqa: PLC0415

    from arli.record import JOURNAL, META_BACKUP, EpisodeRecorder, dataset_features  # noqa: PLC0415

    root, features = tmp_path / "ds", dataset_features(["x", "y"], ["a"])
    reads = {"meta": 0, "data": 0}
    load_metadata, load_hf = lds.LeRobotDatasetMetadata.load_metadata, lds.LeRobotDataset.load_hf_dataset

    def counted_meta(self):
        reads["meta"] += 1
        return load_metadata(self)

    def counted_hf(self):
        reads["data"] += 1
        return load_hf(self)

    monkeypatch.setattr(lds.LeRobotDatasetMetadata, "load_metadata", counted_meta)
    monkeypatch.setattr(lds.LeRobotDataset, "load_hf_dataset", counted_hf)
    journals = []
    with EpisodeRecorder(root, 20, features) as rec:
        begin = rec._begin

        def spy():
            begin()
            journals.append((json.loads((root / JOURNAL).read_text()), sorted(os.listdir(root / META_BACKUP))))

        rec._begin = spy
        _record(rec, [(ep, 5 + ep) for ep in range(8)])
    assert reads == {"meta": 0, "data": 0}
    assert len(journals) == 8 and all(len(files) <= 3 for _, files in journals)
    assert journals[0][0]["frontier"]["data"] is None and journals[-1][0]["frontier"]["data"] == [0, 6]
    with EpisodeRecorder(root, 20, features, resume=True) as rec:  # reads the dataset once, here
        _record(rec, [(8, 4), (9, 6)])
    assert reads == {"meta": 1, "data": 1}
    monkeypatch.undo()
    ds = _load(root)
    assert _episode_lengths(ds) == [5 + ep for ep in range(8)] + [4, 6]
    state = np.asarray(ds.hf_dataset.with_format("numpy")["observation.state"])
    expected = np.concatenate([np.stack([np.full(n, ep), np.arange(n)], 1)
                               for ep, n in [(ep, 5 + ep) for ep in range(8)] + [(8, 4), (9, 6)]])
    np.testing.assert_array_equal(state, expected)


def _record(rec, lengths) -> None:
    for ep, n in lengths:
        for t in range(n):
            rec.add_frame(np.array([ep, t], np.float32), np.array([t / n], np.float32), 0.0, t == n - 1, False,
                          "count")
        rec.save_episode()


def test_close_commits_a_partial_batch_and_a_broken_save_refuses_more(tmp_path, monkeypatch):
    """close() commits the open batch (2 of commit_every=3); after a save that raised, the
    recorder refuses to save again (it would seal a half-written episode into the batch),
    and the next open rolls that batch back to the last commit."""
    from arli.record import EpisodeRecorder, dataset_features  # noqa: PLC0415

    root, features = tmp_path / "ds", dataset_features(["x", "y"], ["a"])
    with EpisodeRecorder(root, 20, features, commit_every=3) as rec:
        _record(rec, [(0, 12), (1, 14)])
    assert not (root / ".arli_saving.json").exists()
    assert _episode_lengths(_load(root)) == [12, 14]

    rec = EpisodeRecorder(root, 20, features, resume=True, commit_every=3)
    _record(rec, [(2, 16)])  # in the open batch

    def broken_save(**_):
        raise OSError("disk full")

    monkeypatch.setattr(rec.dataset, "save_episode", broken_save)
    with pytest.raises(OSError, match="disk full"):
        _record(rec, [(3, 10)])
    with pytest.raises(RuntimeError, match="broke off"):
        rec.save_episode()
    rec.close()
    assert (root / ".arli_saving.json").exists()  # not committed: left for the rollback
    with EpisodeRecorder(root, 20, features, resume=True) as again:
        assert again.total_episodes == 2
    assert _episode_lengths(_load(root)) == [12, 14]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec") / "pick"
    out = subprocess.run([sys.executable, "-m", "arli.cli", "record", "env=pick_cube", "checkpoint=expert",
                          "episodes=3", f"root={root}", "delay_steps=4", "run.intervention.threshold=0.3", "run.intervention.patience=1",
                          "env.image_size=32", "env.cameras=[front,wrist]"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout[out.stdout.index("{"):])
    return root, summary


@pytest.mark.slow
def test_record_writes_every_field_lerobot_reads_it_back(recorded):
    root, summary = recorded
    ds = _load(root)
    assert ds.meta.total_episodes == summary["episodes_saved"] == 3
    assert len(ds) == summary["frames"]
    for key in ("observation.state", "observation.environment_state", "action", "base_action",
                "residual_action", "intervention", "next.reward", "next.done", "delay_steps",
                "chunk_id", "chunk_slot", "arli.state"):
        assert key in ds.features, key
    t = ds.hf_dataset.with_format("numpy")
    action, base = np.asarray(t["action"]), np.asarray(t["base_action"])
    residual = np.asarray(t["residual_action"])
    intervened = np.asarray(t["intervention"]).reshape(-1).astype(bool)
    assert 0 < intervened.sum() < len(ds)  # the scripted operator took over some steps, not all
    # where the robot acted, the executed action is base + residual (clipped to the box)
    assert np.allclose(action[~intervened], np.clip(base + residual, -1, 1)[~intervened], atol=1e-5)
    assert not np.allclose(action[intervened], np.clip(base + residual, -1, 1)[intervened], atol=1e-3)
    slot, delay = np.asarray(t["chunk_slot"]).reshape(-1), np.asarray(t["delay_steps"]).reshape(-1)
    assert slot.min() >= -1 and slot.max() < 16 and set(delay[slot >= 0]) == {4}
    done = np.asarray(t["next.done"]).reshape(-1)
    assert done.sum() == 3 and done[-1]
    assert ds[0]["task"] == "pick up the red cube and lift it"
    # every camera went into an AV1 video per episode, decoded back frame by frame
    assert {ds.features[f"observation.images.{c}"]["dtype"] for c in ("front", "wrist")} == {"video"}
    item = ds[len(ds) // 2]
    front, wrist = item["observation.images.front"], item["observation.images.wrist"]
    assert front.shape == wrist.shape == (3, 32, 32) and 0.05 < float(front.mean()) < 0.95
    assert float((front - wrist).abs().mean()) > 0.05  # two views, not one image twice


def test_a_lerobot_policy_trains_on_the_recording(recorded):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415
    from lerobot.datasets.utils import dataset_to_policy_features  # noqa: PLC0415
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors  # noqa: PLC0415

    root, _ = recorded
    meta_ds = _load(root)
    feats = dataset_to_policy_features(meta_ds.meta.features)
    inputs = {k: feats[k] for k in ("observation.state", "observation.environment_state")}
    cfg = make_policy_config("act", device="cpu", input_features=inputs, output_features={"action": feats["action"]},
                             chunk_size=8, n_action_steps=8, dim_model=32, n_heads=2, dim_feedforward=32,
                             n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    ds = LeRobotDataset("arli/local", root=root, video_backend="pyav",
                        delta_timestamps={"action": [i / meta_ds.fps for i in range(8)]})
    pre, _ = make_pre_post_processors(cfg, dataset_stats=ds.meta.stats)
    torch.manual_seed(0)
    policy = get_policy_class("act")(cfg)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    batch = pre(next(iter(torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True))))
    assert batch["action"].shape == (16, 8, 5)
    losses = []
    for _ in range(5):
        loss, _ = policy.forward(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_the_learner_replays_a_recording_with_interventions_flagged(recorded, tmp_path):
    from arli.cli import compose  # noqa: PLC0415
    from arli.runs import make_finetuner  # noqa: PLC0415
    from arli.config import ConfigError  # noqa: PLC0415
    from arli.types import INTERVENTION, ONLINE  # noqa: PLC0415

    root, summary = recorded
    cfg = compose("finetune", ["env=pick_cube", "checkpoint=expert", f"run.datasets=[{root}]"])
    ft, _, _ = make_finetuner(cfg)
    counts = ft.load_datasets()
    t = _load(root).hf_dataset.with_format("numpy")
    intervened = np.asarray(t["intervention"]).reshape(-1).astype(bool)
    assert counts == {"online": int((~intervened).sum()), "anchor": int(intervened.sum()), "episodes": 3}
    assert set(ft.anchor.data["source"][: len(ft.anchor)].tolist()) == {INTERVENTION}
    assert set(ft.online.data["source"][: len(ft.online)].tolist()) == {ONLINE}
    # the replayed states are the recorded ones, row for row
    states = np.asarray(t["arli.state"], np.float32)
    assert np.allclose(ft.online.data["state"][0], states[np.flatnonzero(~intervened)[0]])
    # bad input: one line each, nothing loaded
    other = compose("finetune", ["env=peg_insert", "checkpoint=expert", f"run.datasets=[{root}]"])
    ft2, _, _ = make_finetuner(other)
    with pytest.raises(ValueError, match="another task, variant or chunk size"):
        ft2.load_datasets()
    assert len(ft2.online) == len(ft2.anchor) == 0
    with pytest.raises(ConfigError, match="datasets"):
        compose("finetune", ["env=pick_cube", f"run.datasets=[{tmp_path / 'nope'}]"])
    (tmp_path / "empty").mkdir()
    from arli.rl.recorded import load_recorded  # noqa: PLC0415

    with pytest.raises(ValueError, match="not a LeRobotDataset"):
        load_recorded(str(tmp_path / "empty"), 1, 5, 3, 0.99, ft.online, ft.anchor)


@pytest.mark.slow
def test_the_actors_recorder_takes_every_sim_camera(tmp_path):
    """``arli actor robot=sim record_root=...`` with ``env.image_size`` / ``env.cameras``:
    the task renders both cameras and the recorder's dataset has one video feature each.
    (The controller is a stand-in exposing only the ARLI state size: a real one needs a
    server and a learner, which `tests/test_launch.py` runs.)"""
    from types import SimpleNamespace  # noqa: PLC0415

    from arli.cli import compose  # noqa: PLC0415
    from arli.commands.pipeline import Recording  # noqa: PLC0415
    from robot_drivers.sim import SimDriver  # noqa: PLC0415
    from sim_envs import make_env  # noqa: PLC0415

    cfg = compose("actor", ["env=pick_cube", "env.image_size=32", "env.cameras=[front,wrist]",
                            f"record_root={tmp_path / 'rec'}"])
    env = make_env("pick_cube", **cfg.env.render_kwargs())
    driver = SimDriver(env)
    assert set(driver.reset(seed=0).images) == {"front", "wrist"}
    recording = Recording(cfg, env, driver, "pick")
    wrapped = recording.wrap(SimpleNamespace(builder=SimpleNamespace(dim=4)))
    feats = recording.recorder.features
    for cam in ("front", "wrist"):
        assert feats[f"observation.images.{cam}"]["dtype"] == "video"
        assert tuple(feats[f"observation.images.{cam}"]["shape"]) == (32, 32, 3)
    assert set(wrapped._cameras) == {"front", "wrist"}
    recording.close()


def test_record_acts_with_the_residual_as_its_run_trained_it(tmp_path, monkeypatch, capsys):
    """`arli record residual=<run>/checkpoint` takes the run's variant and learner from its
    config.yaml (a `+recipe=awr` run acts ungated although today's default gates), and where the
    run's end guard deployed the start, records that start."""
    from arli import runs
    from arli.cli import main

    run = tmp_path / "run"
    assert main(["finetune", "env=pick_cube", "checkpoint=expert", "delay_steps=4", "run.env_steps=300",
                 "run.eval_every=300", "run.eval_episodes=2", "run.guard_episodes=2", "run.test_episodes=2",
                 "run.anchor_episodes=2", "run.learn_after=100", "run.learner.hidden=32",
                 "run.learner.critic_hidden=32", "run.learner.pretrain_updates=20", "+recipe=awr",
                 "run.variant=arli_no_midobs", "videos=0", f"output_dir={run}"]) == 0
    built = []
    make = runs.make_finetuner
    monkeypatch.setattr(runs, "make_finetuner", lambda cfg, **kw: built.append(cfg) or make(cfg, **kw))
    summary = json.loads((run / "summary.json").read_text())
    summary["deployed_actor"] = "actor_start"  # as a run whose end guard dropped the trained residual
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["record", "env=pick_cube", "checkpoint=expert", "delay_steps=4", "episodes=1",
                 f"root={tmp_path / 'rec'}", f"residual={run / 'checkpoint'}"]) == 0
    (cfg,) = built
    assert cfg.run.variant == "arli_no_midobs" and cfg.run.learner.gate_candidates == 0
    assert cfg.run.learner.actor_update == "awr" and cfg.run.learner.hidden == 32
    out = capsys.readouterr().out
    assert f"variant and learner from {run}/config.yaml" in out and "deployed its start" in out
