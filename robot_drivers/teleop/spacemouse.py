"""3Dconnexion SpaceMouse over HID (``hidapi``): report parsing is pure and tested with
real report layouts; the reader thread only moves bytes.

Report layouts (little-endian int16 axes, about +-350 at full deflection):
* id 1, 6 bytes: translation x, y, z (SpaceNavigator, SpaceMouse Pro / Wireless older firmware);
* id 1, 12 bytes: translation x, y, z then rotation rx, ry, rz (SpaceMouse Compact / Wireless);
* id 2, 6 bytes: rotation rx, ry, rz;
* id 3: button bitmask (bit 0 left, bit 1 right).

Mapping to the action: robot x = device -y (push forward), y = device -x, z = device -z
(lift the cap), yaw = device -rz (twist). Left button toggles take over / hand back; right
button toggles the gripper.
"""

from __future__ import annotations

import struct
import threading

import numpy as np

from robot_drivers.teleop.base import Event, TeleopDevice, TeleopState, deadzone

VENDOR_IDS = (0x046D, 0x256F)  # Logitech-era 3Dconnexion, 3Dconnexion
FULL_SCALE = 350.0
DEADZONE = 0.08


class SpaceMouseState:
    """Axes and buttons accumulated from reports; ``apply(report)`` -> events it caused."""

    def __init__(self) -> None:
        self.translation = np.zeros(3)
        self.rotation = np.zeros(3)
        self.buttons = 0

    def apply(self, report: bytes) -> list[str]:
        """Parse one HID report (report id first). Unknown ids are ignored; a short
        report raises ValueError naming its id and length."""
        if not report:
            return []
        rid, body = report[0], bytes(report[1:])
        if rid == 1:
            if len(body) >= 12:
                values = struct.unpack("<6h", body[:12])
                self.translation, self.rotation = np.array(values[:3], float), np.array(values[3:], float)
            elif len(body) >= 6:
                self.translation = np.array(struct.unpack("<3h", body[:6]), float)
            else:
                raise ValueError(f"SpaceMouse report 1 has {len(body)} data bytes, expected 6 or 12")
        elif rid == 2:
            if len(body) < 6:
                raise ValueError(f"SpaceMouse report 2 has {len(body)} data bytes, expected 6")
            self.rotation = np.array(struct.unpack("<3h", body[:6]), float)
        elif rid == 3:
            if not body:
                raise ValueError("SpaceMouse report 3 (buttons) is empty")
            new = body[0] | (body[1] << 8 if len(body) > 1 else 0)
            pressed = new & ~self.buttons
            self.buttons = new
            return [name for bit, name in ((0, "left"), (1, "right")) if pressed & (1 << bit)]
        return []

    def twist(self) -> np.ndarray:
        t, r = self.translation / FULL_SCALE, self.rotation / FULL_SCALE
        raw = (-t[1], -t[0], -t[2], -r[2])
        return np.array([deadzone(float(np.clip(v, -1, 1)), DEADZONE) for v in raw], np.float32)


class SpaceMouse(TeleopDevice):
    """Reads a SpaceMouse with ``hidapi`` in a background thread."""

    name = "spacemouse"

    def __init__(self, path: bytes | None = None):
        super().__init__()
        self.parser = SpaceMouseState()
        self.gripper = -1.0
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._device = None
        self._path = path

    def start(self) -> "SpaceMouse":
        try:
            import hid  # noqa: PLC0415

            infos = [d for d in hid.enumerate() if d["vendor_id"] in VENDOR_IDS]
            path = self._path or (infos[0]["path"] if infos else None)
            if path is None:
                raise OSError("no 3Dconnexion device found (is it plugged in, and readable by this user? "
                              "a udev rule may be needed: see the README, Franka section)")
            self._device = hid.device()
            self._device.open_path(path)
            self._device.set_nonblocking(False)
        except (ImportError, OSError, IOError) as exc:
            self.connected, self.status = False, f"SpaceMouse unavailable: {exc}"
            return self
        self.connected, self.status = True, "connected"
        threading.Thread(target=self._run, name="spacemouse", daemon=True).start()
        return self

    def feed(self, report: bytes) -> None:
        """One raw report (the reader thread calls this; tests call it directly)."""
        events = self.parser.apply(report)
        with self._lock:
            self._pending += events

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._device.read(64, 100)
            except (OSError, IOError) as exc:
                self.connected, self.status = False, f"SpaceMouse disconnected: {exc}"
                return
            if data:
                try:
                    self.feed(bytes(data))
                except ValueError as exc:
                    self.status = f"bad report ignored: {exc}"

    def poll(self) -> TeleopState:
        with self._lock:
            pressed, self._pending = self._pending, []
        events = []
        for button in pressed:
            if button == "left":
                events.append(Event.HAND_BACK if self.active else Event.TAKE_OVER)
            else:
                self.gripper = -self.gripper
        return self._track(TeleopState(self.parser.twist(), self.gripper, events))

    def close(self) -> None:
        self._stop.set()
        if self._device is not None:
            self._device.close()
