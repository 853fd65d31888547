"""The scripted expert behind the device interface: a simulated operator for sim runs.

It watches the robot's state (``observe``) and, like the SpaceMouse operator, takes over
when the robot's action strays from what it would do for ``patience`` steps, drives for
``segment`` steps, then hands back (HG-DAgger-style corrective interventions).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from robot_drivers.teleop.base import Event, TeleopDevice, TeleopState


class ScriptedOperator(TeleopDevice):
    name = "scripted"

    def __init__(self, expert: Callable[[np.ndarray], np.ndarray], threshold: float = 0.5, patience: int = 3,
                 segment: int = 10, judged_dims: int | None = None):
        super().__init__()
        self.expert, self.threshold, self.patience, self.segment = expert, threshold, patience, segment
        # Like a person watching the arm, judge the motion (the first ``judged_dims`` action
        # entries), not the gripper command's timing: under latency every grasp command is a
        # few steps late, and a gap in it says nothing about where the arm is going.
        self.judged_dims = judged_dims
        self.connected, self.status = True, "scripted"
        self._state: np.ndarray | None = None
        self._proposed: np.ndarray | None = None
        self._over = self._left = 0

    def observe(self, state: np.ndarray, proposed: np.ndarray) -> None:
        """What the operator sees: the robot's state and the action it is about to take."""
        self._state, self._proposed = state, proposed

    def reset(self) -> None:
        """A new episode: nothing seen, not in control."""
        self._state = self._proposed = None
        self._over = self._left = 0
        self.active = False

    def poll(self) -> TeleopState:
        """Acts for ``segment`` consecutive steps from the one that triggers it; the step after
        the segment hands back and is judged again (so a still-bad robot is taken over again)."""
        if self._state is None:
            return TeleopState()
        expert = np.asarray(self.expert(self._state), np.float32)
        events = []
        if self._left == 0:
            if self.active:
                events.append(Event.HAND_BACK)
            dims = slice(0, self.judged_dims)
            gap = (float(np.max(np.abs(self._proposed[dims] - expert[dims])))
                   if self._proposed is not None else 0.0)
            self._over = self._over + 1 if gap > self.threshold else 0
            if self._over >= self.patience:
                events.append(Event.TAKE_OVER)
                self._over, self._left = 0, self.segment
        if self._left > 0:
            self._left -= 1
        return self._track(TeleopState(events=events, command=expert))
