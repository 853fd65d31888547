"""Short rollout videos of a finetuning run: the base alone against base + residual on the
same test seeds, every camera, written as MP4 into the run directory and as filmstrips to
TensorBoard, so a user sees what the residual changed. Rendering does not change the
episode: the policies read the state, so a video's outcome is the evaluation's."""

from __future__ import annotations

import os

import numpy as np

from arli.rollout import sim_episode
from arli.chunking import delay_bounds, make_scheduler


def rollout_frames(env, policy, chunking, latency, seed: int, controller=None) -> tuple[list[dict], bool]:
    """One evaluation episode on ``env`` (which renders cameras) -> (per step {camera: (S, S, 3)
    uint8}, success)."""
    dt = float(getattr(env.unwrapped, "dt", 0.05))
    planned, low = delay_bounds(chunking, latency.max_latency(), latency.min_latency(), dt)
    scheduler = make_scheduler(chunking, policy.chunk_size, env.action_space.shape[0], planned, low)
    episode = sim_episode(env, policy, scheduler, latency, np.random.default_rng(seed), seed, controller)
    frames = [dict(episode.obs.images)]
    while not episode.done:
        episode.step()
        frames.append(dict(episode.obs.images))
    return frames, bool(episode.finish().success)


def _tile(step: dict[str, np.ndarray], cameras: list[str]) -> np.ndarray:
    """The cameras of one step side by side: (S, C * S, 3)."""
    return np.concatenate([step[c] for c in cameras], axis=1)


def _label(image: np.ndarray, text: str) -> np.ndarray:
    import cv2  # noqa: PLC0415

    out = np.ascontiguousarray(image)
    cv2.putText(out, text, (3, 11), cv2.FONT_HERSHEY_SIMPLEX, 0.33, (255, 255, 255), 1, cv2.LINE_AA)
    return out


def comparison(rows: dict[str, tuple[list[dict], bool]], cameras: list[str]) -> np.ndarray:
    """Videos of several policies on one seed stacked top to bottom -> (T, R * S, C * S, 3);
    a finished episode holds its last frame, each row labelled with its policy and outcome."""
    T = max(len(frames) for frames, _ in rows.values())
    video = []
    for t in range(T):
        video.append(np.concatenate([
            _label(_tile(frames[min(t, len(frames) - 1)], cameras),
                   f"{name}: {'success' if ok else 'fail'}" if t >= len(frames) - 1 else name)
            for name, (frames, ok) in rows.items()], axis=0))
    return np.stack(video)


def filmstrip(video: np.ndarray, frames: int = 6) -> np.ndarray:
    """``frames`` evenly spaced frames of (T, H, W, 3) side by side: (H, frames * W, 3)."""
    idx = np.linspace(0, len(video) - 1, frames).round().astype(int)
    return np.concatenate(list(video[idx]), axis=1)


def write_mp4(path: str, video: np.ndarray, fps: float) -> None:
    import imageio.v3 as iio  # noqa: PLC0415

    # even sizes: the H.264 encoder's 4:2:0 chroma needs them
    T, H, W, _ = video.shape
    video = np.pad(video, ((0, 0), (0, H % 2), (0, W % 2), (0, 0)))
    iio.imwrite(path, video, fps=fps, codec="libx264", plugin="pyav")


def write_run_videos(make_render_env, base, chunking, latency, controllers: dict, seeds: list[int], out_dir: str,
                     writer=None, step: int = 0) -> list[dict]:
    """For each seed: every policy in ``controllers`` (label -> StepController or None for the
    base alone) on a fresh rendering env -> ``<out_dir>/videos/seed<k>.mp4`` and a filmstrip in
    TensorBoard (``writer``). Returns one record per seed: path and each policy's outcome."""
    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    out = []
    for seed in seeds:
        rows, cameras, fps = {}, None, 20.0
        for label, controller in controllers.items():
            env = make_render_env()
            fps = 1.0 / float(getattr(env.unwrapped, "dt", 0.05))
            rows[label] = rollout_frames(env, base, chunking, latency, seed, controller)
            cameras = cameras or sorted(rows[label][0][0])
            env.close()
        video = comparison(rows, cameras)
        path = os.path.join(out_dir, "videos", f"seed{seed}.mp4")
        write_mp4(path, video, fps)
        if writer is not None:
            writer.add_image(f"rollouts/seed{seed}", filmstrip(video), step, dataformats="HWC")
        out.append({"seed": seed, "path": path, "cameras": cameras,
                    "success": {label: ok for label, (_, ok) in rows.items()}})
    return out
