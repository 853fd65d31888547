"""Settings of the Franka driver (one dataclass; Hydra composes it as ``franka.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FrankaConfig:
    """Robot connection, safety limits and motion settings.

    The action convention is the MuJoCo tasks': (5,) ``[dx, dy, dz, dyaw, grip]`` in
    [-1, 1]; ``max_step_pos``/``max_step_yaw`` are the motion at |action| = 1 per step, so a
    policy trained in sim commands the same displacements here.
    """

    hostname: str = "172.16.0.2"  # the robot's FCI address (franky-sim: 127.0.0.1)
    gripper: bool = True
    realtime: bool = True  # False only for franky-sim / a non-RT kernel: libfranka refuses otherwise
    max_episode_steps: int = 300
    home_q: list[float] = field(
        default_factory=lambda: [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    # Workspace box of the end effector in the robot base frame (m); every target is clipped into it.
    workspace_low: list[float] = field(default_factory=lambda: [0.25, -0.30, 0.05])
    workspace_high: list[float] = field(default_factory=lambda: [0.70, 0.30, 0.60])
    max_step_pos: float = 0.02  # m per step at |action| = 1
    max_step_yaw: float = 0.15  # rad per step at |action| = 1
    max_yaw: float = 1.57  # |yaw| relative to home (rad)
    max_lead: float = 0.04  # the target never runs further than this ahead of the hand (m)
    relative_dynamics_factor: float = 0.2  # scales franky's velocity/acceleration/jerk limits
    home_dynamics_factor: float = 0.1
    torque_threshold: float = 20.0  # collision thresholds (Nm, N), set at connect
    force_threshold: float = 30.0
    grip_close_threshold: float = 0.0  # grip > threshold closes the gripper
    grip_speed: float = 0.1  # m/s
    grip_force: float = 20.0  # N
    watchdog_s: float = 0.25  # stop the arm when no action arrives for this long while moving
    max_recoveries: int = 3  # per fault: automatic error recovery, then reconnect attempts
    retry_backoff_s: float = 0.5

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field on settings that would make motion unsafe."""
        if len(self.home_q) != 7:
            raise ValueError(f"franka.home_q: expected 7 joint angles, got {len(self.home_q)}")
        for name in ("workspace_low", "workspace_high"):
            if len(getattr(self, name)) != 3:
                raise ValueError(f"franka.{name}: expected [x, y, z] in metres")
        if any(lo >= hi for lo, hi in zip(self.workspace_low, self.workspace_high)):
            raise ValueError("franka.workspace_low must be below franka.workspace_high on every axis")
        for name in ("relative_dynamics_factor", "home_dynamics_factor"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"franka.{name}: expected a value in (0, 1], got {value}")
        for name in ("max_step_pos", "max_step_yaw", "max_lead", "watchdog_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"franka.{name}: expected > 0, got {getattr(self, name)}")
        if self.max_step_pos > 0.05:
            raise ValueError(f"franka.max_step_pos={self.max_step_pos} m per step is above the "
                             "0.05 m safety cap; lower it")
