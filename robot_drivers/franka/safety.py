"""Action -> Cartesian target, with every limit applied before anything reaches the robot.

Pure numpy and testable without a robot: the driver asks ``TargetIntegrator.step`` for the
next target and sends only what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_drivers.base import check_action
from robot_drivers.franka.config import FrankaConfig


@dataclass(frozen=True)
class CartesianTarget:
    """One commanded end-effector pose: position (3,) in the base frame, yaw relative to home,
    and the binary gripper command."""

    position: np.ndarray
    yaw: float
    close_gripper: bool


class TargetIntegrator:
    """Integrates delta actions into a target pose that is always inside the safety limits.

    Per step: ``target += max_step_pos * a[:3]``, clipped to the workspace box, then pulled
    to within ``max_lead`` of the measured hand (no wind-up against an obstacle); yaw the same
    within ±``max_yaw``. The same rules as ``sim_envs.franka.PandaController``, so a policy
    trained in sim commands the same displacements.
    """

    def __init__(self, cfg: FrankaConfig) -> None:
        self.cfg = cfg
        self.low = np.asarray(cfg.workspace_low, np.float64)
        self.high = np.asarray(cfg.workspace_high, np.float64)
        self.position = np.zeros(3)
        self.yaw = 0.0
        self.close_gripper = False

    def reset(self, ee_position: np.ndarray, yaw: float = 0.0) -> None:
        """Start integrating from the measured pose (clipped into the box)."""
        self.position = np.clip(np.asarray(ee_position, np.float64), self.low, self.high)
        self.yaw = float(np.clip(yaw, -self.cfg.max_yaw, self.cfg.max_yaw))
        self.close_gripper = False

    def step(self, action: np.ndarray, ee_position: np.ndarray) -> CartesianTarget:
        """action (5,) in [-1, 1] (NaN/inf/wrong shape raise ``ValueError``); ee_position (3,)."""
        a = check_action(action, 5).astype(np.float64)
        cfg = self.cfg
        ee = np.asarray(ee_position, np.float64)
        target = np.clip(self.position + cfg.max_step_pos * a[:3], self.low, self.high)
        target = ee + np.clip(target - ee, -cfg.max_lead, cfg.max_lead)
        # The lead clip can step outside the box when the hand itself is outside (e.g. pushed
        # there by hand in guiding mode): clip again so a commanded target never is.
        self.position = np.clip(target, self.low, self.high)
        self.yaw = float(np.clip(self.yaw + cfg.max_step_yaw * a[3], -cfg.max_yaw, cfg.max_yaw))
        self.close_gripper = bool(a[4] > cfg.grip_close_threshold)
        return CartesianTarget(self.position.copy(), self.yaw, self.close_gripper)
