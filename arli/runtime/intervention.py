"""The online intervener behind the device interface: a scripted operator in sim, or a
person's SpaceMouse, gamepad or keyboard on a robot (``robot_drivers.teleop``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from arli.rl.config import InterventionSpec
from robot_drivers.teleop.base import TeleopDevice
from robot_drivers.teleop.scripted import ScriptedOperator

log = logging.getLogger("arli.intervention")
Expert = Callable[[np.ndarray], np.ndarray]


@dataclass
class Intervention:
    """The online intervener, behind the device interface (``robot_drivers.teleop``).

    Settings in ``spec``. In a share ``prob`` of episodes the intervener watches; from step
    ``after`` on it acts whenever its device says the operator holds control:
    * ``device=None`` (sim): the scripted expert as ``ScriptedOperator`` in ``corrective``
      mode (HG-DAgger-style: takes over after ``patience`` steps of the robot's action
      differing from the expert's by more than ``threshold``, drives ``segment`` steps, hands
      back; as the residual improves it triggers less, like a human who stops correcting a
      good robot), or the expert for the rest of the episode in ``takeover`` mode;
    * a real device (SpaceMouse, gamepad, keyboard): the operator's take-over / hand-back.
    """

    expert: Expert | None
    spec: InterventionSpec
    device: TeleopDevice | None = None

    def __post_init__(self) -> None:
        self.spec.validate()
        if self.device is None:
            if self.expert is None:
                raise ValueError("an intervener needs a scripted expert or a device")
            s = self.spec
            self.device = ScriptedOperator(self.expert, s.threshold, s.patience, s.segment,
                                           s.judged_dims or None)
        self.begin_episode(watching=False)

    def begin_episode(self, watching: bool) -> None:
        self.watching = watching
        self.events: list = []
        self._reported = getattr(self, "_reported", False)
        if isinstance(self.device, ScriptedOperator):
            self.device.reset()

    def decide(self, t: int, state: np.ndarray, proposed: np.ndarray) -> np.ndarray | None:
        """The intervener's action (m,) for step t, or None to let the robot act ``proposed``.
        A person's device is polled every step, so its events (``self.events``: success,
        failure, re-record, ...) are never lost; an unplugged one is reported once and the
        run goes on without it."""
        spec = self.spec
        self.events = []
        scripted = isinstance(self.device, ScriptedOperator)
        if scripted and (not self.watching or t < spec.after):
            return None
        if spec.mode == "takeover" and self.expert is not None:
            return np.asarray(self.expert(state), np.float32)
        if scripted:
            self.device.observe(state, proposed)
        command = self.device.poll()
        self.events = list(command.events)
        if not self.device.connected:
            if not self._reported:
                log.warning("intervention device %s: %s; going on without it", self.device.name,
                            self.device.status)
                self._reported = True
            return None
        self._reported = False
        if not self.watching or t < spec.after:
            return None
        return command.action() if self.device.active else None
