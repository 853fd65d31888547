"""Scripted-expert demonstrations -> LeRobotDataset, and reading them back as chunks."""

from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np
from tqdm import tqdm

from arli.errors import InputError
from arli.record import EpisodeRecorder, dataset_features
from sim_envs import make_env, task_name
from sim_envs.base import ACTION_NAMES, PROPRIO_DIM
from sim_envs.experts import EXPERTS

IMAGE_PREFIX = "observation.images."  # + camera name: one video feature per camera
ENV_KEY = "observation.environment_state"


DEMO_COMMIT_EVERY = 25  # scripted episodes are regenerable: commit in batches (arli.record)


def collect_demos(env_name: str, episodes: int, root: str, seed: int = 0, dt: float = 0.05,
                  image_size: int = 0, only_success: bool = True, cameras: Sequence[str] = ("front",)) -> dict:
    """Run the scripted expert and record ``episodes`` episodes at ``root`` (committed every
    ``DEMO_COMMIT_EVERY`` episodes; a crash keeps the committed ones). With ``image_size``
    > 0 every camera of ``cameras`` is rendered and stored as ``observation.images.<name>``
    (an AV1 video per episode, as LeRobot records)."""
    name = task_name(env_name)
    if name not in EXPERTS:
        raise InputError(f"no scripted expert for {name!r}; demos exist for {sorted(EXPERTS)}")
    cameras = list(cameras) if image_size else []
    env = make_env(name, dt=dt, image_size=image_size, cameras=cameras)
    expert = EXPERTS[name]
    fps = int(round(1.0 / dt))
    features = dataset_features(env.state_names, ACTION_NAMES, image_size, image_keys=cameras,
                                proprio_dim=PROPRIO_DIM, use_videos=True)
    kept, tried, frames = 0, 0, 0
    sim_s = write_s = 0.0  # where the time goes: physics + expert (+ render), dataset writes
    start = time.perf_counter()
    with EpisodeRecorder(root, fps, features, commit_every=DEMO_COMMIT_EVERY, use_videos=bool(cameras)) as rec, \
            tqdm(total=episodes, desc=f"demos {name}", unit="ep") as bar:
        setup_s = time.perf_counter() - start  # LeRobot import + dataset creation
        while kept < episodes:
            t0 = time.perf_counter()
            obs, _ = env.reset(seed=seed + tried)
            sim_s += time.perf_counter() - t0
            tried += 1
            done = False
            while not done:
                t1 = time.perf_counter()
                action = expert(obs["state"])
                nxt, reward, term, trunc, info = env.step(action)
                t2 = time.perf_counter()
                sim_s += t2 - t1
                done = term or trunc
                rec.add_frame(obs["state"], action, reward, done, info["is_success"],
                              env.instruction, obs.get("images"))
                write_s += time.perf_counter() - t2
                obs = nxt
                frames += 1
            t3 = time.perf_counter()
            if info["is_success"] or not only_success:
                rec.save_episode()
                kept += 1
                bar.update(1)
            else:
                rec.discard_episode()
            write_s += time.perf_counter() - t3
    total = time.perf_counter() - start
    render_s = float(getattr(env.unwrapped, "render_s", 0.0))
    timing = {"frames": frames, "fps": frames / total if total else 0.0, "total_s": total,
              "render_s": render_s, "physics_expert_s": max(sim_s - render_s, 0.0), "write_s": write_s,
              "setup_s": setup_s, "finalize_s": total - setup_s - sim_s - write_s}
    return {"episodes": kept, "attempts": tried, "root": root, "timing": timing}


def describe_timing(timing: dict) -> str:
    """One line: frames per second and the share of each phase."""
    total = timing["total_s"] or 1.0
    parts = {"render": timing["render_s"], "physics + expert": timing["physics_expert_s"],
             "dataset write (frames, save, encode)": timing["write_s"],
             "setup (LeRobot import, dataset creation)": timing["setup_s"], "finalise": timing["finalize_s"]}
    top = max(parts, key=parts.get)
    shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in parts.items())
    return f"{timing['frames']} frames at {timing['fps']:.1f} fps; {shares}; {top} dominates"



def load_chunk_dataset(root: str, chunk_size: int, repo_id: str = "arli/local") -> dict:
    """Read a LeRobotDataset with LeRobot's loader into training arrays.

    Returns state (N, n), chunks (N, H, m) of future actions padded past the episode end
    with the hold action (no motion, last gripper command), episode_index (N,), task str,
    fps, state_names, cameras (names of the ``observation.images.*`` features), images
    (N, C, S, S, 3) uint8 in ``cameras`` order (videos decoded by LeRobot's decoder) or None.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    if not os.path.isfile(os.path.join(root, "meta", "info.json")):
        raise InputError(f"dataset_root: {root} is not a LeRobotDataset (no meta/info.json); collect demos "
                         f"there with `arli collect-demos root={root}` or point to an existing dataset")
    try:
        ds = LeRobotDataset(repo_id, root=root)
    except Exception as exc:  # noqa: BLE001  (LeRobot raises many kinds for a broken dataset)
        raise InputError(f"dataset_root: cannot read {root}: {exc}") from None
    missing = [k for k in ("observation.state", "action", "episode_index") if k not in ds.features]
    if missing:
        raise InputError(f"dataset {root} lacks feature(s) {missing}; it has {sorted(ds.features)}")
    table = ds.hf_dataset.with_format("numpy")
    state = np.asarray(table["observation.state"], np.float32)
    names = list(ds.meta.features["observation.state"]["names"] or [])
    if ENV_KEY in ds.features:  # LeRobot layout: the policy sees proprioception + object state
        state = np.concatenate([state, np.asarray(table[ENV_KEY], np.float32)], axis=1)
        names += list(ds.meta.features[ENV_KEY]["names"] or [])
    elif state.shape[1] > PROPRIO_DIM and {"next.done", "next.success"} <= set(ds.features):
        raise InputError(f"dataset {root} has the object state inside observation.state (written by an older "
                         f"ARLI; LeRobot's ACT / Diffusion cannot train on it): re-collect it with "
                         f"`arli collect-demos env=<task> root={root}_v2` and point dataset_root there")
    action = np.asarray(table["action"], np.float32)
    episode = np.asarray(table["episode_index"]).astype(np.int64)
    N, m = action.shape
    chunks = np.zeros((N, chunk_size, m), np.float32)
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]])
    ends = np.r_[starts[1:], N]
    for s, e in zip(starts, ends):
        for i in range(s, e):
            take = action[i:min(i + chunk_size, e)]
            chunks[i, : len(take)] = take
            if len(take) < chunk_size:
                chunks[i, len(take):, -1] = take[-1, -1]  # hold: keep the gripper command
    cameras = [k[len(IMAGE_PREFIX):] for k in ds.features if k.startswith(IMAGE_PREFIX)]
    images = None
    if cameras:  # (N, C, S, S, 3) uint8, for the policy's CNN
        images = np.stack([_camera_frames(ds, table, IMAGE_PREFIX + c, episode, starts, ends) for c in cameras],
                          axis=1)
    task = ds.meta.tasks.index[0] if len(ds.meta.tasks) else ""
    return {"state": state, "chunks": chunks, "episode_index": episode, "task": str(task),
            "fps": ds.fps, "state_names": names, "cameras": cameras, "images": images}


def _camera_frames(ds, table, key: str, episode: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every frame of camera ``key``, (N, S, S, 3) uint8: stored images as they are, videos
    decoded episode by episode at the frames' timestamps (LeRobot's own decoder, pyav)."""
    if ds.features[key]["dtype"] != "video":
        return np.stack([np.asarray(img, dtype=np.uint8) for img in table[key]])
    from lerobot.datasets.video_utils import decode_video_frames  # noqa: PLC0415

    stamps = np.asarray(table["timestamp"], np.float64)
    out = []
    for s, e in zip(starts, ends):
        ep = int(episode[s])
        offset = float(ds.meta.episodes[ep][f"videos/{key}/from_timestamp"])
        path = ds.root / ds.meta.get_video_file_path(ep, key)
        frames = decode_video_frames(path, (offset + stamps[s:e]).tolist(), ds.tolerance_s, "pyav")  # (T, 3, S, S)
        out.append((frames.permute(0, 2, 3, 1).numpy() * 255.0).round().astype(np.uint8))
    return np.concatenate(out)
