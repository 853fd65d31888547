"""OpenCV cameras with latest-frame semantics: a background thread grabs frames as fast as
the source gives them, stamps each with its capture time, resizes it, and keeps only the
newest; the control loop takes that one (or nothing, if it is older than it may be).

A video file stands in for a live camera (tests, replays): it is paced at its own frame
rate and can loop. Frames are RGB uint8 (h, w, 3).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("arli.camera")


class CameraError(RuntimeError):
    """A camera that cannot be opened or has stopped delivering frames."""


@dataclass(frozen=True)
class Frame:
    image: np.ndarray  # (h, w, 3) uint8, RGB
    capture_ts: float  # time.perf_counter() when the frame was grabbed
    index: int  # frames grabbed from the source before this one


class Camera:
    """``source``: a device index (``0``), a URL or a video file path. ``size``: (width,
    height) to resize to, or None. ``fps``: pace for files (default: the file's own)."""

    def __init__(self, source: int | str, name: str = "front", size: tuple[int, int] | None = None,
                 fps: float | None = None, loop: bool = False):
        self.source, self.name, self.size, self.loop = source, name, size, loop
        self._fps = fps
        self._lock = threading.Lock()
        self._latest: Frame | None = None
        self._taken = -1
        self.grabbed = 0
        self.dropped = 0  # frames replaced before anyone took them
        self.ended = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Camera":
        import cv2  # noqa: PLC0415

        cap = cv2.VideoCapture(self.source)
        if not cap.isOpened():
            raise CameraError(f"camera {self.name!r}: cannot open source {self.source!r} (check the device "
                              "index / path, permissions, and that no other process holds it)")
        self._is_file = isinstance(self.source, str) and not self.source.startswith(("rtsp:", "http"))
        fps = self._fps or (cap.get(cv2.CAP_PROP_FPS) if self._is_file else 0) or 30.0
        self._period = 1.0 / fps if self._is_file else 0.0
        self._cap = cap
        self._thread = threading.Thread(target=self._run, name=f"camera-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import cv2  # noqa: PLC0415

        next_t = time.perf_counter()
        while not self._stop.is_set():
            if self._period:
                next_t += self._period
                delay = next_t - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            ok, bgr = self._cap.read()
            ts = time.perf_counter()
            if not ok:
                if self._is_file and self.loop:
                    self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
                    continue
                self.ended = True
                log.warning("camera %r: source %r stopped delivering frames", self.name, self.source)
                break
            if self.size is not None and (bgr.shape[1], bgr.shape[0]) != tuple(self.size):
                bgr = cv2.resize(bgr, tuple(self.size), interpolation=cv2.INTER_AREA)
            frame = Frame(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), ts, self.grabbed)
            with self._lock:
                if self._latest is not None and self._latest.index != self._taken:
                    self.dropped += 1
                self._latest = frame
                self.grabbed += 1
        self._cap.release()

    def latest(self, max_age_s: float | None = None) -> Frame | None:
        """The newest frame, or None if there is none yet or it is older than ``max_age_s``."""
        with self._lock:
            frame = self._latest
            if frame is not None:
                self._taken = frame.index
        if frame is None or (max_age_s is not None and time.perf_counter() - frame.capture_ts > max_age_s):
            return None
        return frame

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
