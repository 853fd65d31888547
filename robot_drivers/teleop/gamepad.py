"""Gamepad through pygame's joystick events (Xbox-style layout).

Sticks: left x/y -> robot y/x, right y -> z, right x -> yaw (dead zone 0.1). Buttons:
A take over, B hand back, X success, Y failure, Back re-record, RB toggles the gripper.
``feed(event)`` takes pygame events (``type``, ``axis``/``value``, ``button``); tests build
them with ``pygame.event.Event``, the reader polls ``pygame.event.get()``.
"""

from __future__ import annotations

import numpy as np

from robot_drivers.teleop.base import Event, TeleopDevice, TeleopState, deadzone

AXES = {0: "lx", 1: "ly", 3: "rx", 4: "ry"}
BUTTONS = {0: Event.TAKE_OVER, 1: Event.HAND_BACK, 2: Event.SUCCESS, 3: Event.FAILURE, 6: Event.RERECORD}
GRIPPER_BUTTON = 5
DEAD = 0.1


class Gamepad(TeleopDevice):
    name = "gamepad"

    def __init__(self, index: int = 0):
        super().__init__()
        self.index = index
        self.axes = {k: 0.0 for k in AXES.values()}
        self.gripper = -1.0
        self._events: list[Event] = []
        self._joystick = None

    def start(self) -> "Gamepad":
        import os  # noqa: PLC0415

        # joystick events only: no sound card, no window, no banner
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        import pygame  # noqa: PLC0415

        pygame.display.init()  # the event queue needs the video subsystem
        pygame.joystick.init()
        if pygame.joystick.get_count() <= self.index:
            self.connected, self.status = False, (f"gamepad {self.index} unavailable: "
                                                  f"{pygame.joystick.get_count()} joystick(s) found")
            return self
        self._joystick = pygame.joystick.Joystick(self.index)
        self.connected, self.status = True, f"connected: {self._joystick.get_name()}"
        return self

    def feed(self, event) -> None:
        import pygame  # noqa: PLC0415

        if event.type == pygame.JOYAXISMOTION and event.axis in AXES:
            self.axes[AXES[event.axis]] = float(np.clip(event.value, -1, 1))
        elif event.type == pygame.JOYBUTTONDOWN:
            if event.button == GRIPPER_BUTTON:
                self.gripper = -self.gripper
            elif event.button in BUTTONS:
                self._events.append(BUTTONS[event.button])
        elif event.type == pygame.JOYDEVICEREMOVED:
            self.connected, self.status = False, "gamepad unplugged"

    def poll(self) -> TeleopState:
        if self._joystick is not None:
            import pygame  # noqa: PLC0415

            for event in pygame.event.get((pygame.JOYAXISMOTION, pygame.JOYBUTTONDOWN, pygame.JOYDEVICEREMOVED)):
                self.feed(event)
        a = self.axes
        twist = np.array([deadzone(-a["ly"], DEAD), deadzone(-a["lx"], DEAD), deadzone(-a["ry"], DEAD),
                          deadzone(-a["rx"], DEAD)], np.float32)
        events, self._events = self._events, []
        return self._track(TeleopState(twist, self.gripper, events))
