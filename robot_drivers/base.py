"""The one driver interface the runtime depends on (MuJoCo tasks, Franka, ...).

A driver owns the robot (or the simulator standing in for it): it homes it, returns
timestamped observations and executes one action per control period. It knows nothing of
chunks, residuals or learning.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np

from arli.types import Observation


@dataclass(frozen=True)
class StepResult:
    """Outcome of one ``act``: the next observation, the task reward and episode flags.

    On a real robot ``reward``/``success`` come from a success detector or the operator's
    device events; ``truncated`` is the time limit.
    """

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    info: dict = field(default_factory=dict)


class RobotDriver(abc.ABC):
    """reset/home, timestamped observation, act, close. Shapes: state (n,), action (m,)."""

    dt: float  # control period (s)
    state_dim: int
    action_dim: int
    max_episode_steps: int

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> Observation:
        """Home the robot (reset the task); returns the first observation (step 0)."""

    @abc.abstractmethod
    def observe(self) -> Observation:
        """The latest observation, stamped with its capture time."""

    @abc.abstractmethod
    def act(self, action: np.ndarray) -> StepResult:
        """Execute one action (m,) in [-1, 1] for one control period."""

    def end_episode(self, success: bool) -> bool:
        """The operator's verdict (a device's success / failure event): end the episode at
        the next ``act``. Returns whether this driver can; the default cannot."""
        return False

    def close(self) -> None:
        """Release the robot / simulator."""


def check_action(action: np.ndarray, action_dim: int) -> np.ndarray:
    """The last gate before hardware: shape (m,), finite, clipped to [-1, 1]; raises otherwise."""
    a = np.asarray(action, np.float32)
    if a.shape != (action_dim,):
        raise ValueError(f"action must have shape ({action_dim},), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"action has NaN/inf: {a}; refusing to execute it")
    return np.clip(a, -1.0, 1.0)


class RobotFault(RuntimeError):
    """The robot cannot go on (connection lost, errors that recovery did not clear).

    The runtime ends the episode cleanly on it (recorded data is kept) and reports it; the
    next ``reset`` may reconnect.
    """
