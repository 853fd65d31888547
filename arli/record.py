"""Crash-safe episode recording into LeRobotDataset v3 (lerobot 0.4.x), local root, no hub.

LeRobot keeps the data and episode-index parquet writers open until ``finalize()`` and
buffers episode metadata, so a process killed mid-recording normally leaves every file of
the dataset unreadable. Here every episode is made durable on its own, in one open dataset:

* frames are buffered in memory while the episode runs (a crash loses that episode only);
* ``save_episode`` writes a journal (which files exist, a copy of the three metadata files
  a save rewrites), saves the episode, ``finalize()``-s the dataset (parquet footers written,
  the metadata buffer flushed) and removes the journal: the commit point. Then the open
  dataset is put where LeRobot's resume path would put it (the next episode goes to new
  data, episode-index and video files; no finished file is opened for writing again) from
  the one episode record that path reads, so nothing is read back and a save's cost does
  not grow with the dataset (measured flat from 10 to 500 episodes: ``arli bench record``; each
  episode still adds its own data, index and video files);
* a journal left behind (killed *during* a save) is rolled back on the next open
  (``repair_dataset``): the metadata is restored and the files the save created deleted.

So after SIGKILL at any moment every completed episode loads with ``LeRobotDataset``.
A bulk writer whose episodes can be regenerated (scripted demonstrations) may commit every
``commit_every`` episodes: one journal covers the batch, and a crash loses at most the
uncommitted part of it.
"""

from __future__ import annotations

import json
import logging
import os
import re
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
                     proprio_dim: int | None = None, use_videos: bool = False) -> dict:
    """LeRobot feature spec for our tasks (state, action, reward, done, optional cameras).

    With ``proprio_dim``, LeRobot's layout: the first ``proprio_dim`` state entries
    (proprioception) are ``observation.state``, the object / task state after them
    ``observation.environment_state`` (what LeRobot's ACT and Diffusion read as such).
    Cameras ``image_keys`` (with ``image_size`` > 0) become ``observation.images.<name>``,
    (S, S, 3): a video per episode with ``use_videos`` (the recorder needs it too), else
    PNG images inside the parquet files.
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
            "dtype": "video" if use_videos else "image", "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
    return features


MUTABLE_META = ("info.json", "stats.json", "tasks.parquet")  # rewritten by each save; meta/episodes/* never
MIN_VIDEO_SIDE = 32  # LeRobot's AV1 encoder (SVT-AV1) died with SIGFPE on 24 x 24 frames here
_CHUNK_FILE = re.compile(r"chunk-(\d+)/file-(\d+)\.\w+$")


def _payload_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for sub in ("data", "videos") if (root / sub).exists()
                  for p in (root / sub).rglob("*") if p.is_file())


def _families(features: dict) -> list[str]:
    """Directories whose files LeRobot numbers chunk-C/file-F (data, episode index, one per
    video camera); each name is also the prefix of its index keys in an episode record."""
    return ["data", "meta/episodes", *(f"videos/{k}" for k, v in features.items() if v["dtype"] == "video")]


def repair_dataset(root: str | os.PathLike) -> bool:
    """Roll back a save that was interrupted (journal present); True if one was.

    Restores the metadata files from the copy taken before the save and deletes the
    numbered data / episode-index / video files the save had created (those after the
    journal's last committed ones), leaving exactly the episodes completed before it.
    """
    root = Path(root)
    journal = root / JOURNAL
    if not journal.exists():
        return False
    entry = json.loads(journal.read_text())
    backup = root / META_BACKUP
    if "files" in entry:  # a journal of an older ARLI: the whole meta/ copied, payload listed
        before = set(entry["files"])
        if backup.exists():
            shutil.rmtree(root / "meta", ignore_errors=True)
            backup.rename(root / "meta")
        for rel in _payload_files(root):
            if rel not in before:
                (root / rel).unlink()
    else:
        for name in MUTABLE_META:  # copied, not moved: a kill during the repair repeats it
            if name in entry["meta"]:
                shutil.copy2(backup / name, root / "meta" / name)
            else:
                (root / "meta" / name).unlink(missing_ok=True)
        for family, last in entry["frontier"].items():
            for path in (root / family).rglob("*") if (root / family).exists() else ():
                index = _CHUNK_FILE.search(path.relative_to(root / family).as_posix())
                if index and (last is None or (int(index[1]), int(index[2])) > tuple(last)):
                    path.unlink()
    shutil.rmtree(root / "images", ignore_errors=True)  # frames staged for video encoding
    journal.unlink()
    shutil.rmtree(backup, ignore_errors=True)
    log.warning("dataset %s: rolled back the episodes of an interrupted save", root)
    return True


class EpisodeRecorder:
    """Writes episodes to the LeRobotDataset at ``root``: a new one, or (``resume``) an
    existing one recorded with the same features. ``dataset`` is LeRobot's writer, kept open
    across episodes; read the dataset back with a fresh ``LeRobotDataset``, not through it."""

    def __init__(self, root: str | os.PathLike, fps: int, features: dict, repo_id: str = "arli/local",
                 robot_type: str = "franka_panda", resume: bool = False, use_videos: bool = False,
                 commit_every: int = 1) -> None:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415 - heavy

        if commit_every < 1:
            raise ValueError(f"commit_every: expected >= 1 episodes per commit, got {commit_every}")
        small = [k for k, v in features.items() if v["dtype"] == "video" and min(v["shape"][:2]) < MIN_VIDEO_SIDE]
        if small:
            raise InputError(f"{small}: video frames of at least {MIN_VIDEO_SIDE} x {MIN_VIDEO_SIDE} expected "
                             f"(LeRobot's AV1 encoder crashes below), got {[features[k]['shape'] for k in small]}; "
                             f"record with env.image_size >= {MIN_VIDEO_SIDE}")
        self.root, self.repo_id, self.commit_every = Path(root), repo_id, commit_every
        self._cls = LeRobotDataset
        exists = self.root.exists() and any(self.root.iterdir())
        if exists and not resume:
            raise FileExistsError(f"dataset root {self.root} exists and is not empty; choose another "
                                  "root, append to it (`arli record append=true`), or delete it "
                                  "(recordings are never overwritten)")
        if exists:
            repair_dataset(self.root)
            # frames staged for an episode that was never saved (killed mid-episode): LeRobot
            # would encode them into the next episode's video along with its own
            shutil.rmtree(self.root / "images", ignore_errors=True)
            self.dataset = self._open()  # LeRobot's resume path, once per recorder
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
            use_videos = use_videos or any(v["dtype"] == "video" for v in features.values())
            self.dataset = LeRobotDataset.create(repo_id=repo_id, fps=fps, features=features,
                                                 root=self.root, robot_type=robot_type,
                                                 use_videos=use_videos)
        self.features = features
        self.episodes = 0  # saved by this recorder (committed or in the open batch)
        self._pending = 0  # saved since the last commit, covered by the journal
        self._families = _families(self.dataset.features)
        episodes = self.dataset.meta.episodes
        # the last committed episode's record (index keys -> value): where new files start
        self._last: dict | None = dict(episodes[-1]) if episodes is not None and len(episodes) else None
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
            # cameras one after the other: LeRobot's parallel encoding forks this process, and a
            # fork of a process holding a GL context (the sim's renderer) dies in the encoder
            self.dataset.save_episode(parallel_encoding=False)
        self._saving = False
        self._pending += 1
        self.episodes += 1
        if self._pending >= self.commit_every:
            self._commit()

    def _frontier(self, record: dict | None) -> dict[str, list[int] | None]:
        """Per numbered family, the (chunk, file) of ``record``'s file (None: no file yet)."""
        if record is None:
            return {f: None for f in self._families}
        return {f: [int(record[f"{f}/chunk_index"]), int(record[f"{f}/file_index"])] for f in self._families}

    def _begin(self) -> None:
        """Journal + copy of the metadata a save rewrites: until the commit, a crash rolls
        back to this point. Constant work: three small files and the last file numbers."""
        journal = self.root / JOURNAL
        backup = self.root / META_BACKUP
        shutil.rmtree(backup, ignore_errors=True)
        backup.mkdir()
        have = [name for name in MUTABLE_META if (self.root / "meta" / name).exists()]
        for name in have:
            shutil.copy2(self.root / "meta" / name, backup / name)
        _fsync([backup / name for name in have])
        tmp = journal.with_suffix(".tmp")
        tmp.write_text(json.dumps({"frontier": self._frontier(self._last), "meta": have}))
        _fsync([tmp])
        os.replace(tmp, journal)  # the save starts only once the journal is complete

    def _commit(self, reopen: bool = True) -> None:
        """Finalize, flush, drop the journal (the commit point); with ``reopen`` get the open
        dataset ready for the next episode (not on close)."""
        self.dataset.finalize()
        last = {k: (v[0] if isinstance(v, list) else v) for k, v in self.dataset.meta.latest_episode.items()}
        _fsync(self._new_files(last) + [self.root / "meta" / n for n in MUTABLE_META])
        (self.root / JOURNAL).unlink()  # commit point: the batch is in
        shutil.rmtree(self.root / META_BACKUP, ignore_errors=True)
        self._pending = 0
        self._last = last
        if reopen:
            self._continue()

    def _continue(self) -> None:
        """Leave the finalized dataset as LeRobot's resume path leaves a reopened one: no
        latest episode, so every writer starts at the file after ``episodes[-1]`` — the one
        record of the episode index that path reads. Reading it all back (what reopening
        does) would make each save cost more as the dataset grows."""
        self.dataset.latest_episode = None
        self.dataset.meta.latest_episode = None
        self.dataset.meta.episodes = [self._last]

    def _new_files(self, last: dict) -> list[Path]:
        """The numbered files the open batch wrote: after the journal's frontier, up to ``last``'s."""
        from lerobot.datasets.utils import update_chunk_file_indices  # noqa: PLC0415

        size, out = self.dataset.meta.chunks_size, []
        for family, front in self._frontier(self._last).items():
            end = (int(last[f"{family}/chunk_index"]), int(last[f"{family}/file_index"]))
            index = (0, 0) if front is None else update_chunk_file_indices(*front, size)
            while index <= end:
                out += sorted((self.root / family).glob(f"chunk-{index[0]:03d}/file-{index[1]:03d}.*"))
                index = update_chunk_file_indices(*index, size)
        return out

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


def _fsync(paths: Sequence[Path]) -> None:
    # Written, but maybe only to the page cache: flush the batch's new files and the metadata
    # before the journal goes, so a power loss cannot keep the commit and lose them.
    for path in paths:
        if path.exists():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
