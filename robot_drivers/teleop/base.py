"""The device interface every intervener implements.

A device turns what the operator does into (1) a command in the robot's action space —
end-effector delta (dx, dy, dz, dyaw) in [-1, 1] plus an absolute gripper command (-1 open,
+1 closed), the same 5-d space as the policy — and (2) events: take over, hand back,
success, failure, re-record. ``poll()`` never blocks; a device that is unplugged reports
``connected = False`` with a reason, and the run goes on without it.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field

import numpy as np

ACTION_DIM = 5  # dx, dy, dz, dyaw, gripper


class Event(enum.Enum):
    TAKE_OVER = "take_over"
    HAND_BACK = "hand_back"
    SUCCESS = "success"
    FAILURE = "failure"
    RERECORD = "rerecord"


@dataclass
class TeleopState:
    """What a device says now. twist: (4,) in [-1, 1]; gripper: -1 open / +1 closed."""

    twist: np.ndarray = field(default_factory=lambda: np.zeros(4, np.float32))
    gripper: float = -1.0
    events: list[Event] = field(default_factory=list)
    command: np.ndarray | None = None  # a full action from a scripted operator (any action dim)

    def action(self) -> np.ndarray:
        """(5,) action in the policy's space (the scripted operator's own action as is)."""
        if self.command is not None:
            return np.asarray(self.command, np.float32).copy()
        return np.concatenate([np.clip(self.twist, -1, 1), [self.gripper]]).astype(np.float32)


class TeleopDevice(abc.ABC):
    """``poll()`` -> TeleopState (events since the last poll); ``connected`` / ``status``."""

    name: str = "device"

    def __init__(self) -> None:
        self.connected = False
        self.status = "not started"
        self.active = False  # the operator holds control (between TAKE_OVER and HAND_BACK)

    @abc.abstractmethod
    def poll(self) -> TeleopState:
        """Drain pending input; never blocks."""

    def close(self) -> None:
        """Release the device."""

    def _track(self, state: TeleopState) -> TeleopState:
        """Keep ``active`` in step with the take-over / hand-back events."""
        for event in state.events:
            if event is Event.TAKE_OVER:
                self.active = True
            elif event in (Event.HAND_BACK, Event.SUCCESS, Event.FAILURE, Event.RERECORD):
                self.active = False
        return state


def deadzone(value: float, dead: float) -> float:
    """0 inside ``dead``, rescaled to reach +-1 outside it."""
    if abs(value) <= dead:
        return 0.0
    return float(np.sign(value) * (abs(value) - dead) / (1 - dead))
