"""``arli bench record``: what saving one episode costs as the dataset grows.

Records ``episodes`` synthetic episodes (``frames`` steps, the sim tasks' state and action
sizes, ``cameras`` as ``image_size`` AV1 videos) into fresh LeRobotDatasets through
``arli.record.EpisodeRecorder``, timing every ``save_episode`` (encode, write, commit):

* ``open``: the recorder as it is, one LeRobot dataset kept open across episodes;
* ``reopen``: the same recorder but, after each commit, the dataset reopened through
  LeRobot's resume path (how ARLI made episodes durable before), which reads every
  episode's metadata and data files back. Its journal is the new, constant-size one, so the
  difference between the two is the reload alone.

Both datasets are read back with LeRobot's loader at the end (episodes and frames checked).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from arli.bench.common import figure, machine_info, publish
from arli.config import BenchRecordConfig
from arli.record import EpisodeRecorder, dataset_features
from sim_envs.base import ACTION_NAMES, PROPRIO_DIM, PROPRIO_NAMES

TASK = "synthetic episode"
ENV_STATE_DIM = 11  # peg_insert's object state


class ReopeningRecorder(EpisodeRecorder):
    """After each commit the dataset is reopened through LeRobot's resume path (the former
    way to send the next episode to new files), so every save reads the dataset back."""

    def _continue(self) -> None:
        self.dataset = self._open()


def synthetic_frames(episode: int, frames: int, cameras: list[str], size: int) -> list[dict]:
    """``frames`` steps of one episode: state (20,), action (5,), per camera a (size, size, 3)
    uint8 frame with a bright square moving across a gradient (compressible, like a scene,
    and different per camera)."""
    rng = np.random.default_rng(episode)
    ramp = np.linspace(40, 200, size, dtype=np.float32)
    out = []
    for t in range(frames):
        images = {}
        for c, name in enumerate(cameras):
            img = np.empty((size, size, 3), np.uint8)
            img[...] = (ramp[None, :, None] if c % 2 == 0 else ramp[:, None, None]).astype(np.uint8)
            x = (3 * t + 11 * c + episode) % (size - size // 4)
            img[size // 3: size // 3 + size // 4, x: x + size // 4] = (255, 60 * c % 256, 30)
            images[name] = img
        out.append({"state": rng.normal(size=PROPRIO_DIM + ENV_STATE_DIM).astype(np.float32),
                    "action": rng.uniform(-1, 1, len(ACTION_NAMES)).astype(np.float32),
                    "images": images, "done": t == frames - 1})
    return out


def measure(kind: str, root: Path, cfg: BenchRecordConfig, episodes: int) -> list[float]:
    """Seconds of each ``save_episode`` (index = episodes already in the dataset)."""
    names = list(PROPRIO_NAMES) + [f"object_{i}" for i in range(ENV_STATE_DIM)]
    features = dataset_features(names, ACTION_NAMES, cfg.image_size, image_keys=cfg.cameras,
                                proprio_dim=PROPRIO_DIM, use_videos=True)
    cls = EpisodeRecorder if kind == "open" else ReopeningRecorder
    seconds = []
    with cls(root, 20, features) as rec:
        for ep in tqdm(range(episodes), desc=f"record ({kind})", unit="ep"):
            for f in synthetic_frames(ep, cfg.frames, list(cfg.cameras), cfg.image_size):
                rec.add_frame(f["state"], f["action"], 0.0, f["done"], False, TASK, f["images"])
            start = time.perf_counter()
            rec.save_episode()
            seconds.append(time.perf_counter() - start)
    return seconds


def read_back(root: Path, episodes: int, frames: int, cameras: list[str], size: int) -> None:
    """The dataset loads with LeRobot's loader: every episode, every frame, every camera."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    ds = LeRobotDataset("arli/local", root=root, video_backend="pyav")
    if ds.meta.total_episodes != episodes or len(ds) != episodes * frames:
        raise RuntimeError(f"{root}: {ds.meta.total_episodes} episodes / {len(ds)} frames read back, "
                           f"expected {episodes} / {episodes * frames}")
    last = ds[len(ds) - 1]
    for name in cameras:
        if tuple(last[f"observation.images.{name}"].shape) != (3, size, size):
            raise RuntimeError(f"{root}: camera {name} decodes as {tuple(last[f'observation.images.{name}'].shape)}")


MARKS = (10, 100, 500)  # dataset sizes the report reads the save time at
MARK_WINDOW = 10  # saves whose median is the time at a mark: one save is too noisy on a shared VM


def at_marks(seconds: list[float], marks: tuple[int, ...] = MARKS) -> dict[str, float]:
    """{str(m): median seconds of the saves that made the dataset m - MARK_WINDOW + 1 .. m
    episodes long} for each mark the run reached (``seconds[i]`` saved episode i + 1)."""
    return {str(m): round(float(np.median(seconds[max(0, m - MARK_WINDOW):m])), 4)
            for m in marks if m <= len(seconds)}


def growth(seconds: list[float]) -> dict:
    """Least-squares slope (ms per 100 episodes already saved), first / last tenth means and
    the time at each of ``MARKS`` reached."""
    n = len(seconds)
    k = max(1, n // 10)
    slope = float(np.polyfit(np.arange(n), seconds, 1)[0]) if n > 1 else 0.0
    return {"episodes": n, "mean_s": round(float(np.mean(seconds)), 4),
            "first_tenth_s": round(float(np.mean(seconds[:k])), 4),
            "last_tenth_s": round(float(np.mean(seconds[-k:])), 4), "at_episodes_s": at_marks(seconds),
            "slope_ms_per_100_episodes": round(1e5 * slope, 1), "seconds": [round(s, 4) for s in seconds]}


def main(cfg: BenchRecordConfig) -> int:
    work = Path(tempfile.mkdtemp(prefix="arli_bench_record_"))
    runs = {}
    try:
        for kind, n in (("open", cfg.episodes), ("reopen", cfg.reopen_episodes)):
            if n:
                runs[kind] = measure(kind, work / kind, cfg, n)
                read_back(work / kind, n, cfg.frames, list(cfg.cameras), cfg.image_size)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stats = {kind: growth(s) for kind, s in runs.items()}
    cams = ",".join(cfg.cameras)
    command = (f"arli bench record episodes={cfg.episodes} reopen_episodes={cfg.reopen_episodes} "
               f"frames={cfg.frames} 'cameras=[{cams}]' image_size={cfg.image_size}")
    label = {"open": "one open dataset (now)", "reopen": "reopened after each episode (before)"}
    md = ["# Recording: save time per episode vs dataset size", "",
          f"Command: `{command}`", "",
          f"Each episode: {cfg.frames} frames, state ({PROPRIO_DIM + ENV_STATE_DIM},), action "
          f"({len(ACTION_NAMES)},), {len(cfg.cameras)} cameras ({cams}) as {cfg.image_size} x {cfg.image_size} "
          "AV1 video. Save = `EpisodeRecorder.save_episode`: encode, write, commit (crash-safe).", "",
          "| commit path | episodes | " + " | ".join(f"at {m} (s)" for m in MARKS)
          + " | slope (ms / 100 episodes) |", "|---|---:|" + "---:|" * len(MARKS) + "---:|"]
    for kind, g in stats.items():
        at = g["at_episodes_s"]
        md.append(f"| {label[kind]} | {g['episodes']} | "
                  + " | ".join(f"{at[str(m)]:.3f}" if str(m) in at else "not run" for m in MARKS)
                  + f" | {g['slope_ms_per_100_episodes']:.0f} |")
    md += ["", f"At m: the median of the {MARK_WINDOW} saves that brought the dataset to m - {MARK_WINDOW - 1} .. m "
           "episodes. Both datasets read back with LeRobot's `LeRobotDataset` (every episode and frame, each "
           "camera decoded). The reopen path shares the new constant-size journal, so its extra cost "
           "is the reload alone.", "", "![save time](record.png)", "", f"Machine: {machine_info()}", ""]
    os.makedirs(cfg.report_dir, exist_ok=True)
    with figure(os.path.join(cfg.report_dir, "record.png")) as ax:
        for kind, s in runs.items():
            ax.plot(np.arange(len(s)), s, ".-", ms=3, label=label[kind])
        ax.set_xlabel("episodes already in the dataset")
        ax.set_ylabel("save_episode (s)")
        ax.set_title(f"save time per episode ({len(cfg.cameras)} cameras, {cfg.image_size} px)")
        ax.grid(alpha=0.3)
        ax.legend()
    payload = {"command": command, "frames": cfg.frames, "cameras": list(cfg.cameras),
               "image_size": cfg.image_size, "paths": stats, "machine": machine_info()}
    summary = {k: {"at_episodes_s": g["at_episodes_s"], "first_tenth_s": g["first_tenth_s"],
                   "last_tenth_s": g["last_tenth_s"],
                   "slope_ms_per_100_episodes": g["slope_ms_per_100_episodes"]} for k, g in stats.items()}
    return publish(cfg.report_dir, "record", payload, md, slice(0, None), summary if cfg.json else None)
