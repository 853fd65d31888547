"""Keyboard (``pynput``): held keys move the hand, single keys send events.

w/s: +x/-x, a/d: +y/-y, r/f: +z/-z, q/e: +yaw/-yaw, space: toggle gripper, t: take over,
h: hand back, enter: success, backspace: failure, x: re-record. ``press(name)`` /
``release(name)`` take key names; the pynput listener feeds them (it needs a display or
uinput; without one the device reports itself unavailable).
"""

from __future__ import annotations

import threading

import numpy as np

from robot_drivers.teleop.base import Event, TeleopDevice, TeleopState

MOTION = {"w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "r": (2, 1.0), "f": (2, -1.0),
          "q": (3, 1.0), "e": (3, -1.0)}
EVENTS = {"t": Event.TAKE_OVER, "h": Event.HAND_BACK, "enter": Event.SUCCESS, "backspace": Event.FAILURE,
          "x": Event.RERECORD}
SPEED = 0.5  # fraction of full speed while a motion key is held


class Keyboard(TeleopDevice):
    name = "keyboard"

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.gripper = -1.0
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._listener = None

    def start(self) -> "Keyboard":
        try:
            from pynput import keyboard  # noqa: PLC0415
        except ImportError as exc:  # pynput raises ImportError without an X display / uinput
            self.connected, self.status = False, f"keyboard unavailable: {exc}"
            return self

        def name(key) -> str:
            return getattr(key, "char", None) or str(key).removeprefix("Key.")

        self._listener = keyboard.Listener(on_press=lambda k: self.press(name(k)),
                                           on_release=lambda k: self.release(name(k)))
        self._listener.start()
        self.connected, self.status = True, "listening"
        return self

    def press(self, key: str) -> None:
        with self._lock:
            if key in MOTION:
                self.held.add(key)
            elif key == "space":
                self.gripper = -self.gripper
            elif key in EVENTS:
                self._events.append(EVENTS[key])

    def release(self, key: str) -> None:
        with self._lock:
            self.held.discard(key)

    def poll(self) -> TeleopState:
        with self._lock:
            twist = np.zeros(4, np.float32)
            for key in self.held:
                axis, sign = MOTION[key]
                twist[axis] += sign * SPEED
            events, self._events = self._events, []
        return self._track(TeleopState(np.clip(twist, -1, 1), self.gripper, events))

    def close(self) -> None:
        if self._listener is not None:
            self._listener.stop()
