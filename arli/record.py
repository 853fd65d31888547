"""Episode recording into LeRobotDataset v3 (lerobot 0.4.x), local root, no hub.

Frames are buffered per episode and written by ``save_episode`` only, so a crash mid
episode loses that episode and nothing else; ``close`` (also on exceptions, via the
context manager) finalises the parquet files so what was saved stays readable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np


def dataset_features(state_names: Sequence[str], action_names: Sequence[str],
                     image_size: int = 0, image_keys: Sequence[str] = ("front",)) -> dict:
    """LeRobot feature spec for our tasks (state, action, reward, done, optional images)."""
    features: dict = {
        "observation.state": {"dtype": "float32", "shape": (len(state_names),),
                              "names": list(state_names)},
        "action": {"dtype": "float32", "shape": (len(action_names),), "names": list(action_names)},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
    }
    for key in image_keys if image_size else ():
        features[f"observation.images.{key}"] = {
            "dtype": "image", "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
    return features


class EpisodeRecorder:
    """Writes episodes to a new LeRobotDataset at ``root``."""

    def __init__(self, root: str | os.PathLike, fps: int, features: dict, repo_id: str = "arli/local",
                 robot_type: str = "franka_panda") -> None:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415 - heavy

        root = Path(root)
        if root.exists() and any(root.iterdir()):
            raise FileExistsError(f"dataset root {root} exists and is not empty; choose another "
                                  "root or delete it (recordings are never overwritten)")
        if root.exists():
            root.rmdir()
        self.features = features
        self.dataset = LeRobotDataset.create(repo_id=repo_id, fps=fps, features=features, root=root,
                                             robot_type=robot_type, use_videos=False)
        self.episodes = 0
        self._closed = False

    def add_frame(self, state: np.ndarray, action: np.ndarray, reward: float, done: bool,
                  success: bool, task: str, images: dict[str, np.ndarray] | None = None) -> None:
        """One control step: observation before the action, the action, its outcome."""
        frame = {
            "observation.state": np.asarray(state, np.float32),
            "action": np.asarray(action, np.float32),
            "next.reward": np.array([reward], np.float32),
            "next.done": np.array([done], bool),
            "next.success": np.array([success], bool),
            "task": task,
        }
        for key, img in (images or {}).items():
            frame[f"observation.images.{key}"] = img
        self.dataset.add_frame(frame)

    def save_episode(self) -> None:
        self.dataset.save_episode()
        self.episodes += 1

    def discard_episode(self) -> None:
        """Drop the frames buffered for the current episode."""
        if self.dataset.episode_buffer is not None and self.dataset.episode_buffer["size"]:
            self.dataset.clear_episode_buffer()

    def close(self) -> None:
        if not self._closed:
            self.discard_episode()
            self.dataset.finalize()
            self._closed = True

    def __enter__(self) -> "EpisodeRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
