"""``FrankaDriver``: the runtime's driver interface on a Panda / FR3 through franky.

Each ``act`` turns the action into a target pose (``TargetIntegrator``: workspace box,
per-step displacement, lead limit) and sends it as an asynchronous Cartesian motion, which
preempts the previous one, so the arm tracks a stream of targets at the policy rate. The
gripper gets a command only when the binary grip decision changes. A watchdog thread stops
the arm when actions stop arriving; faults go through a bounded recovery ladder (automatic
error recovery, then reconnect) and end in ``RobotFault`` with a report.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any, Callable

import numpy as np
from scipy.spatial.transform import Rotation

from arli.types import Observation
from robot_drivers.base import RobotDriver, RobotFault, StepResult, check_action
from robot_drivers.franka.config import FrankaConfig
from robot_drivers.franka.safety import CartesianTarget, TargetIntegrator

log = logging.getLogger("arli.franka")
_PENDING_GRIPPERS: list = []  # grippers with a command still running when released (see below)


def _is_network_error(franky: Any, exc: BaseException) -> bool:
    # After a UDP timeout franky's robot object answers every call with "Net Exception".
    return isinstance(exc, franky.NetworkException) or "Net Exception" in str(exc)


class FrankaDriver(RobotDriver):
    """State (9,) as the sim tasks' proprioception: ee xyz (base frame, m), sin/cos of the
    yaw relative to home, gripper width (m), ee linear velocity (m/s). Action (5,)
    ``[dx, dy, dz, dyaw, grip]`` in [-1, 1]. ``cameras``: name -> started ``Camera``; their
    latest frames go into the observation's images.
    """

    state_dim = 9
    action_dim = 5

    def __init__(self, cfg: FrankaConfig, cameras: dict | None = None,
                 now: Callable[[], float] = time.perf_counter, franky_module: Any = None, dt: float = 0.05) -> None:
        cfg.validate()
        if franky_module is None:
            import franky as franky_module  # noqa: PLC0415  (libfranka is only needed here)
        self.franky = franky_module
        self.cfg = cfg
        self.dt = dt  # the control period: the runtime's (env.dt), one for the loop and the arm
        self.max_episode_steps = cfg.max_episode_steps
        self.cameras = cameras or {}
        self._now = now
        self.integrator = TargetIntegrator(cfg)
        self.robot: Any = None
        self.gripper: Any = None
        self._home_rot = np.eye(3)
        self._gripper_closed: bool | None = None
        self._step = 0
        self._outcome: bool | None = None
        self._lock = threading.RLock()  # franky calls from the loop and the watchdog
        self._last_act = 0.0
        self._moving = False
        self.stats = {"sent": 0, "recoveries": 0, "reconnects": 0, "watchdog_stops": 0, "grip_deferred": 0,
                      "faults": []}
        self._grip_future: Any = None
        self._stop_watchdog = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="franka-watchdog", daemon=True)
        self._connect()
        self._watchdog.start()

    # -- connection ----------------------------------------------------------------------
    def _connect(self) -> None:
        fk, cfg = self.franky, self.cfg
        rt = fk.RealtimeConfig.Enforce if cfg.realtime else fk.RealtimeConfig.Ignore
        try:
            self.robot = fk.Robot(cfg.hostname, realtime_config=rt)
            self.robot.relative_dynamics_factor = cfg.relative_dynamics_factor
            self.robot.set_collision_behavior(cfg.torque_threshold, cfg.force_threshold)
            if cfg.gripper:
                self.gripper = fk.Gripper(cfg.hostname)
        except Exception as exc:  # noqa: BLE001  (franky raises several unrelated types)
            self.robot = None
            hint = ("use a PREEMPT_RT kernel, or robot.realtime=false for franky-sim only"
                    if isinstance(exc, getattr(fk, "RealtimeException", ())) else
                    "check the cable/IP, that FCI is enabled in Desk and the brakes are open")
            raise RobotFault(f"cannot connect to the Franka at {cfg.hostname}: {exc} ({hint})") from exc
        self._gripper_closed = None
        self._grip_future = None

    def _reconnect(self) -> None:
        with self._lock:
            self._release_gripper()
            self.robot = None
            gc.collect()  # drop libfranka's sockets so the robot accepts a new session
            self._connect()
            self.stats["reconnects"] += 1

    def _with_recovery(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; on an error try automatic recovery, then reconnecting, at most
        ``max_recoveries`` times in all; then ``RobotFault`` naming every attempt."""
        attempts: list[str] = []
        for attempt in range(self.cfg.max_recoveries + 1):
            try:
                if self.robot is None:
                    self._reconnect()
                return fn()
            except RobotFault as exc:
                attempts.append(f"reconnect: {exc}")
            except (self.franky.Exception, RuntimeError) as exc:
                # franky's own errors, and the RuntimeErrors its motion planner raises;
                # anything else is a bug here and propagates with its traceback.
                network = _is_network_error(self.franky, exc)
                attempts.append(f"{type(exc).__name__}: {exc}")
                self.stats["faults"].append({"during": what, "error": str(exc), "network": network,
                                             "t": self._now()})
                log.warning("franka: %s failed (%s); recovering (%d/%d)", what, exc, attempt + 1,
                            self.cfg.max_recoveries)
                if attempt == self.cfg.max_recoveries:
                    break
                if network:
                    self.robot = None  # reconnect on the next attempt
                else:
                    try:
                        with self._lock:
                            self.robot.recover_from_errors()
                        self.stats["recoveries"] += 1
                    except Exception as rexc:  # noqa: BLE001
                        attempts.append(f"recover_from_errors: {rexc}")
                        self.robot = None
            time.sleep(self.cfg.retry_backoff_s)
        raise RobotFault(f"Franka at {self.cfg.hostname}: {what} failed after "
                         f"{len(attempts)} attempts: " + " | ".join(attempts)
                         + " (check Desk for errors; the arm is holding or stopped)")

    # -- driver interface ----------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Observation:
        """Move to ``home_q`` (joint motion at ``home_dynamics_factor``), open the gripper."""
        fk, cfg = self.franky, self.cfg

        def home() -> None:
            with self._lock:
                self._moving = False
                self._clear_preemption()
                self.robot.move(fk.JointMotion(fk.JointState(cfg.home_q),
                                               relative_dynamics_factor=cfg.home_dynamics_factor))

        self._with_recovery("homing", home)
        pose = self.robot.current_cartesian_state.pose.end_effector_pose
        self._home_rot = Rotation.from_quat(np.asarray(pose.quaternion)).as_matrix()
        self._with_recovery("opening the gripper", lambda: self._set_gripper(False))
        self.integrator.reset(np.asarray(pose.translation), 0.0)
        self._step, self._outcome = 0, None
        return self.observe()

    def observe(self) -> Observation:
        def read() -> tuple:
            cart = self.robot.current_cartesian_state
            width = float(self.gripper.width) if self.gripper is not None else 0.0
            return (np.asarray(cart.pose.end_effector_pose.translation),
                    np.asarray(cart.pose.end_effector_pose.quaternion),
                    np.asarray(cart.velocity.end_effector_twist.linear), width)

        pos, quat, vel, width = self._with_recovery("reading the state", read)
        ts = self._now()
        yaw = self._yaw(quat)
        state = np.concatenate([pos, [np.sin(yaw), np.cos(yaw), width], vel]).astype(np.float32)
        images = {}
        for name, cam in self.cameras.items():
            frame = cam.latest(max_age_s=3 * self.dt)
            if frame is not None:
                images[name] = frame.image
        return Observation(state, self._step, ts, images)

    def act(self, action: np.ndarray) -> StepResult:
        """Clip and send one target (ValueError on NaN/inf/shape: nothing is sent)."""
        check_action(action, self.action_dim)  # refuse NaN/shape before touching the robot
        ee = self._with_recovery("reading the pose", lambda: np.asarray(
            self.robot.current_cartesian_state.pose.end_effector_pose.translation))
        target = self.integrator.step(action, ee)
        self._with_recovery("streaming a target", lambda: self._send(target))
        # gripper faults go through the same recovery as the arm's (not a raw franky error)
        self._with_recovery("commanding the gripper", lambda: self._set_gripper(target.close_gripper))
        self._step += 1
        obs = self.observe()
        success = bool(self._outcome)
        terminated = self._outcome is not None
        truncated = not terminated and self._step >= self.max_episode_steps
        return StepResult(obs, float(success), terminated, truncated, success,
                          {"is_success": success, "target": target.position.copy()})

    def end_episode(self, success: bool) -> bool:
        """The operator's verdict (device event): the next ``act`` terminates the episode."""
        self._outcome = bool(success)
        return True

    def close(self) -> None:
        self._stop_watchdog.set()
        with self._lock:
            if self.robot is not None:
                try:
                    self.robot.stop()
                except Exception:  # noqa: BLE001  (closing: nothing left to recover)
                    pass
            self._release_gripper()
            self.robot = None
        for cam in self.cameras.values():
            cam.close()

    # -- internals -----------------------------------------------------------------------
    def _target_affine(self, target: CartesianTarget) -> Any:
        rot = Rotation.from_euler("z", target.yaw).as_matrix() @ self._home_rot
        return self.franky.Affine(target.position, Rotation.from_matrix(rot).as_quat())

    def _send(self, target: CartesianTarget) -> None:
        motion = self.franky.CartesianMotion(self._target_affine(target))
        with self._lock:
            self.robot.move(motion, asynchronous=True)  # preempts the previous target
            self._last_act = time.monotonic()
            self._moving = True
            self.stats["sent"] += 1

    def _release_gripper(self) -> None:
        # franky crashes the process (SIGSEGV) when a Gripper is destroyed while one of its
        # async commands still runs: give it a moment, then keep it alive until exit instead.
        if self._grip_future is not None and not self._grip_future.wait(2.0):
            _PENDING_GRIPPERS.append((self.gripper, self._grip_future))
        self.gripper, self._grip_future = None, None

    def _set_gripper(self, close: bool) -> None:
        """Send the grip decision when it changes. franky queues gripper commands behind the
        one in flight (a call would block the control loop until it finishes), so a change
        while one runs waits for a later step instead."""
        if self.gripper is None or close == self._gripper_closed:
            return
        if self._grip_future is not None and not self._grip_future.wait(0):
            self.stats["grip_deferred"] += 1
            return
        cfg = self.cfg
        with self._lock:
            if close:  # grasp whatever is there: any final width counts
                self._grip_future = self.gripper.grasp_async(0.0, cfg.grip_speed, cfg.grip_force, 0.1, 0.1)
            else:
                self._grip_future = self.gripper.move_async(self.gripper.max_width, cfg.grip_speed)
        self._gripper_closed = close

    def _clear_preemption(self) -> None:
        # A stopped motion leaves its "preempted" error pending in franky until joined;
        # joining here keeps it from failing the next, unrelated command.
        try:
            self.robot.join_motion()
        except Exception:  # noqa: BLE001
            pass

    def _yaw(self, quat: np.ndarray) -> float:
        rel = Rotation.from_quat(quat).as_matrix() @ self._home_rot.T
        return float(np.arctan2(rel[1, 0], rel[0, 0]))

    def _watch(self) -> None:
        period = self.cfg.watchdog_s / 4
        while not self._stop_watchdog.wait(period):
            with self._lock:
                if self._moving and time.monotonic() - self._last_act > self.cfg.watchdog_s:
                    self._moving = False
                    try:
                        self.robot.stop()
                        self._clear_preemption()
                        self.stats["watchdog_stops"] += 1
                        log.warning("franka: no action for %.2f s; arm stopped", self.cfg.watchdog_s)
                    except Exception as exc:  # noqa: BLE001
                        log.error("franka: watchdog could not stop the arm: %s", exc)
