"""Crash-safe episode recording into LeRobotDataset v3 (lerobot 0.4.x), local root, no hub.

LeRobot keeps the data and episode-index parquet writers open until ``finalize()`` and
buffers episode metadata, so a process killed mid-recording normally leaves every file of
the dataset unreadable. Here every episode is made durable on its own:

* frames are buffered in memory while the episode runs (a crash loses that episode only);
* ``save_episode`` writes a journal, saves the episode, ``finalize()``-s the dataset, and
  reopens it through LeRobot's own resume path, so the next episode goes to new files and
  no finished file is ever opened for writing again; then it removes the journal;
* a journal left behind (killed *during* a save) is rolled back on the next open
  (``repair_dataset``): the metadata is restored and the half-written files deleted.

So after SIGKILL at any moment every completed episode loads with ``LeRobotDataset``.

Reopening reads every episode's metadata back, so it costs more as the dataset grows (about
4 s per episode at 170 episodes of a peg task). A bulk writer whose episodes can be
regenerated (scripted demonstrations) commits every ``commit_every`` episodes instead: one
journal covers the batch, and a crash loses at most the uncommitted part of it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from arli.errors import InputError

log = logging.getLogger("arli.record")
JOURNAL = ".arli_saving.json"
META_BACKUP = ".arli_meta_backup"


def dataset_features(state_names: Sequence[str], action_names: Sequence[str],
                     image_size: int = 0, image_keys: Sequence[str] = ("front",),
                     proprio_dim: int | None = None) -> dict:
    """LeRobot feature spec for our tasks (state, action, reward, done, optional images).

    With ``proprio_dim``, LeRobot's layout: the first ``proprio_dim`` state entries
    (proprioception) are ``observation.state``, the object / task state after them
    ``observation.environment_state`` (what LeRobot's ACT and Diffusion read as such).
    """
    p = len(state_names) if proprio_dim is None else proprio_dim
    features: dict = {
        "observation.state": {"dtype": "float32", "shape": (p,), "names": list(state_names[:p])},
        "action": {"dtype": "float32", "shape": (len(action_names),), "names": list(action_names)},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
    }
    if p < len(state_names):
        features["observation.environment_state"] = {
            "dtype": "float32", "shape": (len(state_names) - p,), "names": list(state_names[p:])}
    for key in image_keys if image_size else ():
        features[f"observation.images.{key}"] = {
            "dtype": "image", "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
    return features


def _payload_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for sub in ("data", "videos") if (root / sub).exists()
                  for p in (root / sub).rglob("*") if p.is_file())


def repair_dataset(root: str | os.PathLike) -> bool:
    """Roll back a save that was interrupted (journal present); True if one was.

    Restores ``meta/`` from the backup taken before the save and deletes the data/video
    files the save had created, leaving exactly the episodes completed before it.
    """
    root = Path(root)
    journal = root / JOURNAL
    if not journal.exists():
        return False
    before = set(json.loads(journal.read_text())["files"])
    backup = root / META_BACKUP
    if backup.exists():
        shutil.rmtree(root / "meta", ignore_errors=True)
        backup.rename(root / "meta")
    for rel in _payload_files(root):
        if rel not in before:
            (root / rel).unlink()
    shutil.rmtree(root / "images", ignore_errors=True)  # frames staged for video encoding
    journal.unlink()
    log.warning("dataset %s: rolled back the episodes of an interrupted save", root)
    return True


class EpisodeRecorder:
    """Writes episodes to the LeRobotDataset at ``root``: a new one, or (``resume``) an
    existing one recorded with the same features."""

    def __init__(self, root: str | os.PathLike, fps: int, features: dict, repo_id: str = "arli/local",
                 robot_type: str = "franka_panda", resume: bool = False, use_videos: bool = False,
                 commit_every: int = 1) -> None:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415 - heavy

        if commit_every < 1:
            raise ValueError(f"commit_every: expected >= 1 episodes per commit, got {commit_every}")
        self.root, self.repo_id, self.commit_every = Path(root), repo_id, commit_every
        self._cls = LeRobotDataset
        exists = self.root.exists() and any(self.root.iterdir())
        if exists and not resume:
            raise FileExistsError(f"dataset root {self.root} exists and is not empty; choose another "
                                  "root, append to it (`arli record append=true`), or delete it "
                                  "(recordings are never overwritten)")
        if exists:
            repair_dataset(self.root)
            self.dataset = self._open()
            def spec(feats: dict) -> dict:
                return {k: (v["dtype"], tuple(v["shape"])) for k, v in feats.items() if k in features}

            have, want = spec(self.dataset.features), spec(features)
            if have != want or set(want) != set(features):
                diff = sorted(k for k in features if have.get(k) != want.get(k))
                raise InputError(f"dataset {self.root} was recorded with other features (differing: "
                                 f"{diff}); record into a new root")
        else:
            if self.root.exists():
                self.root.rmdir()
            self.dataset = LeRobotDataset.create(repo_id=repo_id, fps=fps, features=features,
                                                 root=self.root, robot_type=robot_type,
                                                 use_videos=use_videos)
        self.features = features
        self.episodes = 0  # saved by this recorder (committed or in the open batch)
        self._pending = 0  # saved since the last commit, covered by the journal
        self._before: set[str] = set()  # payload files at the journal's start
        self._saving = False
        self._closed = False

    def _open(self):
        return self._cls(self.repo_id, root=self.root)

    @property
    def total_episodes(self) -> int:
        return int(self.dataset.meta.total_episodes)

    def add_frame(self, state: np.ndarray, action: np.ndarray, reward: float, done: bool,
                  success: bool, task: str, images: dict[str, np.ndarray] | None = None,
                  extra: dict[str, np.ndarray] | None = None) -> None:
        """One control step: observation before the action, the action, its outcome;
        ``extra``: more features of the spec (feature key -> value)."""
        state = np.asarray(state, np.float32)
        env = self.features.get("observation.environment_state")
        p = self.features["observation.state"]["shape"][0]
        if env is not None and state.shape[0] == p + env["shape"][0]:  # the full state: split it
            extra = {**(extra or {}), "observation.environment_state": state[p:]}
            state = state[:p]
        frame = {
            "observation.state": state,
            "action": np.asarray(action, np.float32),
            "next.reward": np.array([reward], np.float32),
            "next.done": np.array([done], bool),
            "next.success": np.array([success], bool),
            "task": task,
        }
        for key, img in (images or {}).items():
            frame[f"observation.images.{key}"] = img
        frame.update(extra or {})
        self.dataset.add_frame(frame)

    def save_episode(self) -> None:
        """Save the buffered episode; durable now, or with the batch (``commit_every``)."""
        if self._saving:  # committing now would seal a half-written episode into the batch
            raise RuntimeError(f"dataset {self.root}: an earlier save_episode broke off; close this recorder "
                               "(the open batch is rolled back when the dataset is next opened) and record "
                               "into a new one")
        if not self._pending:
            self._begin()
        _quiet_datasets()
        self._saving = True  # an exception inside LeRobot's save leaves the batch to roll back
        with warnings.catch_warnings():  # LeRobot's stats on bool features; nothing to act on
            warnings.filterwarnings("ignore", message="Converting input from bool")
            self.dataset.save_episode()
        self._saving = False
        self._pending += 1
        self.episodes += 1
        if self._pending >= self.commit_every:
            self._commit()

    def _begin(self) -> None:
        """Journal + metadata backup: until the commit, a crash rolls back to this point."""
        journal = self.root / JOURNAL
        backup = self.root / META_BACKUP
        shutil.rmtree(backup, ignore_errors=True)
        shutil.copytree(self.root / "meta", backup)
        tmp = journal.with_suffix(".tmp")
        before = _payload_files(self.root)
        tmp.write_text(json.dumps({"files": before}))
        os.replace(tmp, journal)  # the save starts only once the journal is complete
        self._before = set(before)

    def _commit(self, reopen: bool = True) -> None:
        """Finalize, flush, drop the journal (the commit point); ``reopen`` for new files
        (LeRobot's resume path, which reads every episode's metadata back: not on close)."""
        self.dataset.finalize()
        _fsync_new(self.root, self._before)
        (self.root / JOURNAL).unlink()  # commit point: the batch is in
        shutil.rmtree(self.root / META_BACKUP, ignore_errors=True)
        self._pending = 0
        if reopen:
            self.dataset = self._open()  # LeRobot's resume path: the next episode gets new files

    def discard_episode(self) -> None:
        """Drop the frames buffered for the current episode."""
        if self.dataset.episode_buffer is not None and self.dataset.episode_buffer["size"]:
            self.dataset.clear_episode_buffer()

    def close(self) -> None:
        """Drop an unsaved episode, commit the saved ones (unless a save broke off midway:
        then the journal stays, and the next open rolls the batch back)."""
        if not self._closed:
            self.discard_episode()
            if self._pending and not self._saving:
                self._commit(reopen=False)  # finalizes the dataset itself
            else:
                self.dataset.finalize()
            self._closed = True

    def __enter__(self) -> "EpisodeRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _quiet_datasets() -> None:
    # No per-episode "Map:" bar from `datasets`; LeRobot's loader turns them back on after
    # each load, so this is done before every save.
    import datasets  # noqa: PLC0415

    datasets.disable_progress_bars()


def _fsync_new(root: Path, before: set[str]) -> None:
    # Written, but maybe only to the page cache: flush the episode's new files and the
    # metadata before the journal goes, so a power loss cannot keep the commit and lose them.
    paths = [root / rel for rel in _payload_files(root) if rel not in before]
    paths += [p for p in (root / "meta").rglob("*") if p.is_file()]
    for path in paths:
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
