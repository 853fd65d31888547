"""Intervention devices behind one interface: SpaceMouse, gamepad, keyboard, and the
scripted expert standing in for a human in sim."""

from __future__ import annotations

from robot_drivers.teleop.base import TeleopDevice

DEVICES = ("none", "spacemouse", "gamepad", "keyboard")


def open_device(name: str) -> TeleopDevice | None:
    """A started person's device by name (``none`` -> None). One that is not plugged in
    comes back with ``connected = False`` and its reason in ``status``: the run goes on
    without it, and says so."""
    if name == "none":
        return None
    if name == "spacemouse":
        from robot_drivers.teleop.spacemouse import SpaceMouse as cls  # noqa: PLC0415
    elif name == "gamepad":
        from robot_drivers.teleop.gamepad import Gamepad as cls  # noqa: PLC0415
    elif name == "keyboard":
        from robot_drivers.teleop.keyboard import Keyboard as cls  # noqa: PLC0415
    else:
        raise ValueError(f"device: expected one of {DEVICES}, got {name!r}")
    return cls().start()
