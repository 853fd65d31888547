"""Cameras: a video file as the source, latest-frame semantics, capture stamps, resize,
staleness, and a clear error for a source that cannot be opened."""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest

from robot_drivers.camera import Camera, CameraError

FRAMES = 40


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("video") / "counter.avi")
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 50.0, (64, 48))
    for i in range(FRAMES):  # frame i is uniformly grey level 5 * i (BGR), so content encodes the index
        writer.write(np.full((48, 64, 3), 5 * i, np.uint8))
    writer.release()
    return path


def level(frame) -> int:
    return int(round(float(frame.image.mean()) / 5))


def test_latest_frame_is_the_newest_resized_and_stamped(video):
    cam = Camera(video, size=(32, 24), fps=50.0).start()
    try:
        # a few frames in (~0.1 s at 50 fps; longer where another test loads the cores while the
        # source opens): latest() then holds the newest of them, the older ones dropped
        deadline = time.perf_counter() + 10
        while cam.grabbed < 5 and time.perf_counter() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        before = time.perf_counter()
        frame = cam.latest()
        assert frame is not None and frame.image.shape == (24, 32, 3) and frame.image.dtype == np.uint8
        assert 0 <= before - frame.capture_ts < 0.25  # recent (two frame periods on an idle machine)
        assert abs(level(frame) - frame.index) <= 1  # its content is the frame it says it is
        assert frame.index >= 3 and cam.dropped >= frame.index - 1  # older ones were replaced, not queued
        time.sleep(0.1)
        later = cam.latest()
        assert later.index > frame.index and later.capture_ts > frame.capture_ts
    finally:
        cam.close()


def test_a_finished_source_goes_stale(video):
    cam = Camera(video, fps=400.0).start()
    try:
        deadline = time.perf_counter() + 3
        while not cam.ended and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert cam.ended and cam.grabbed == FRAMES
        time.sleep(0.06)
        assert cam.latest() is not None and cam.latest().index == FRAMES - 1
        assert cam.latest(max_age_s=0.05) is None  # too old to act on
    finally:
        cam.close()


def test_a_looping_file_keeps_delivering(video):
    cam = Camera(video, fps=400.0, loop=True).start()
    try:
        time.sleep(0.4)
        assert cam.grabbed > FRAMES and not cam.ended
    finally:
        cam.close()


def test_unopenable_source_names_itself(tmp_path):
    with pytest.raises(CameraError, match="nothing.avi"):
        Camera(str(tmp_path / "nothing.avi")).start()
