"""Franka Panda model and its Cartesian controller.

The arm and hand meshes come from robosuite's installed assets (Panda arm + Panda hand);
nothing is downloaded. We compose them with ``mujoco.MjSpec`` and make the scene lean for
speed: only the hand and finger pads collide, arm links are gravity-compensated and driven
by joint-space position actuators, so a whole control step is one ``mj_step(nstep=k)`` call
in MuJoCo's C loop plus one damped-least-squares IK solve in numpy.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import mujoco
import numpy as np

ARM_JOINTS = tuple(f"joint{i}" for i in range(1, 8))
# Joint-space home posture: hand pointing down, ~0.45 m in front of the base.
HOME_QPOS = np.array([0.0, 0.2, 0.0, -2.3, 0.0, 2.5, np.pi / 4])
# Position-actuator gains (N m / rad) and damping; the arm is gravity-compensated,
# so these only have to reject contact forces and track the IK targets.
ARM_KP = np.array([1200.0, 1200.0, 1000.0, 1000.0, 500.0, 400.0, 300.0])
ARM_KV = 2.0 * np.sqrt(ARM_KP) * np.array([1.5, 1.5, 1.2, 1.2, 0.6, 0.5, 0.3])
FINGER_OPEN = 0.04  # m, per finger
GRIP_SITE = "grip_site"
# Cameras a task can render, by name: a fixed scene camera facing the robot, and one on the
# hand (moves with it) looking along the fingers at what they are about to touch.
CAMERAS = ("front", "wrist")


def robosuite_assets_dir() -> str:
    """Directory of robosuite's MJCF assets (raises with an install hint if missing)."""
    # Located, not imported: importing robosuite prints five warnings and takes a second,
    # and only the robosuite tasks need its code.
    spec = importlib.util.find_spec("robosuite")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - pinned dependency
        raise ImportError("the Panda model is loaded from robosuite's assets: `pip install robosuite==1.5.1`")
    return os.path.join(list(spec.submodule_search_locations)[0], "models", "assets")


def build_panda_spec() -> mujoco.MjSpec:
    """World spec with a Panda (arm + hand) on the origin, table plane at z=0.

    Returns a spec the task adds its objects to. Names: joints ``joint1..7``,
    fingers ``finger_joint1/2``, site ``grip_site`` between the finger pads, cameras
    ``CAMERAS`` (``front`` fixed in the world, ``wrist`` on the hand).
    """
    assets = robosuite_assets_dir()
    spec = mujoco.MjSpec.from_file(os.path.join(assets, "robots", "panda", "robot.xml"))
    hand = mujoco.MjSpec.from_file(os.path.join(assets, "grippers", "panda_gripper.xml"))
    for act in list(spec.actuators):  # robosuite's torque motors: replaced below
        spec.delete(act)
    for sensor in list(hand.sensors):
        hand.delete(sensor)
    for act in list(hand.actuators):
        hand.delete(act)
    spec.body("right_hand").add_frame().attach_body(hand.body("right_gripper"), "", "")
    wrist = spec.body("right_gripper").add_camera()
    wrist.name = "wrist"
    # beside the hand, 6 cm off its axis, looking along the fingers and tilted 20 deg towards
    # them: the fingertips sit in the lower image half, the table beyond them fills the rest
    tilt = np.radians(25.0)
    wrist.pos = [0.0, -0.07, 0.04]
    wrist.quat = _quat_from_xyaxes([1.0, 0.0, 0.0], [0.0, -np.cos(tilt), np.sin(tilt)])
    wrist.fovy = 70.0

    spec.option.timestep = 0.005
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    # Elliptic friction cones at impratio 1 held a grasped cube through 300 random actions
    # at a 5 ms step; impratio 10 was unstable at this step size.
    spec.option.impratio = 1.0
    spec.option.iterations = 20
    spec.option.ls_iterations = 10

    for geom in spec.geoms:
        # Arm links never touch the workspace objects in these tasks; dropping their
        # mesh collisions is the largest single speed-up.
        keep = geom.name in ("hand_collision", "finger1_pad_collision", "finger2_pad_collision")
        if not keep:
            geom.contype = 0
            geom.conaffinity = 0
    for name in ("finger1_pad_collision", "finger2_pad_collision"):
        pad = spec.geom(name)
        pad.friction = [1.5, 0.01, 0.0001]
        pad.condim = 4
        pad.solref = [0.02, 1.0]  # time constant >= 2 * timestep for stability
        pad.size = [0.010, 0.004, 0.012]
    for body in spec.bodies:
        if body.name.startswith("link") or body.name in ("right_hand", "right_gripper"):
            body.gravcomp = 1.0

    for i, joint in enumerate(ARM_JOINTS):
        act = spec.add_actuator()
        act.name = f"act_{joint}"
        act.target = joint
        act.trntype = mujoco.mjtTrn.mjTRN_JOINT
        act.set_to_position(kp=float(ARM_KP[i]), kv=float(ARM_KV[i]))
        act.ctrlrange = spec.joint(joint).range
        act.ctrllimited = 1
        spec.joint(joint).armature = 0.1
        spec.joint(joint).damping = 1.0
    for joint, sign in (("finger_joint1", 1.0), ("finger_joint2", -1.0)):
        act = spec.add_actuator()
        act.name = f"act_{joint}"
        act.target = joint
        act.trntype = mujoco.mjtTrn.mjTRN_JOINT
        act.set_to_position(kp=600.0, kv=20.0)
        act.ctrlrange = sorted([0.0, sign * FINGER_OPEN])
        act.ctrllimited = 1
        act.forcerange = [-25.0, 25.0]  # ~ Franka hand continuous grasp force
        act.forcelimited = 1
        spec.joint(joint).damping = 5.0
        spec.joint(joint).armature = 0.01

    world = spec.worldbody
    table = world.add_geom()
    table.name = "table"
    table.type = mujoco.mjtGeom.mjGEOM_PLANE
    table.size = [1.0, 1.0, 0.01]
    table.rgba = [0.55, 0.5, 0.45, 1.0]
    table.friction = [1.0, 0.005, 0.0001]
    light = world.add_light()
    light.pos = [0.5, 0.0, 1.5]
    light.dir = [0.0, 0.0, -1.0]
    cam = world.add_camera()
    cam.name = "front"
    cam.pos = [1.25, 0.0, 0.55]
    cam.quat = _quat_from_xyaxes([0.0, 1.0, 0.0], [-0.35, 0.0, 0.94])
    cam.fovy = 45.0
    return spec


def _wrap(angle: float) -> float:
    return (angle + np.pi) % (2 * np.pi) - np.pi


def _quat_from_xyaxes(x_axis: list[float], y_axis: list[float]) -> np.ndarray:
    x = np.asarray(x_axis, float) / np.linalg.norm(x_axis)
    y = np.asarray(y_axis, float)
    y = y - x * (x @ y)
    y /= np.linalg.norm(y)
    mat = np.stack([x, y, np.cross(x, y)], axis=1)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, mat.ravel())
    return quat


@dataclass(frozen=True)
class CartesianLimits:
    """Workspace box for the grip site (m) and per-step motion limits."""

    low: tuple[float, float, float] = (0.25, -0.35, 0.012)
    high: tuple[float, float, float] = (0.75, 0.35, 0.40)
    max_step_pos: float = 0.02  # m per control step at |action| = 1
    max_step_yaw: float = 0.15  # rad per control step at |action| = 1
    max_lead: float = 0.04  # how far the target may run ahead of the hand (anti wind-up)


class PandaController:
    """Maps end-effector delta actions to joint-position targets (one DLS IK step).

    The target pose is kept between steps and integrated from the actions, so small
    tracking errors do not accumulate into drift.
    """

    def __init__(self, model: mujoco.MjModel, data: mujoco.MjData, limits: CartesianLimits):
        self.model, self.data, self.limits = model, data, limits
        self.qadr = np.array([model.joint(j).qposadr[0] for j in ARM_JOINTS])
        self.dadr = np.array([model.joint(j).dofadr[0] for j in ARM_JOINTS])
        self.finger_qadr = np.array(
            [model.joint(j).qposadr[0] for j in ("finger_joint1", "finger_joint2")]
        )
        self.site = model.site(GRIP_SITE).id
        self.arm_act = np.array([model.actuator(f"act_{j}").id for j in ARM_JOINTS])
        self.finger_act = np.array(
            [model.actuator(f"act_finger_joint{i}").id for i in (1, 2)]
        )
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))
        self.low = np.asarray(limits.low)
        self.high = np.asarray(limits.high)
        self.target_pos = np.zeros(3)
        self.target_yaw = 0.0

    # -- state -------------------------------------------------------------------------
    def ee_pos(self) -> np.ndarray:
        return self.data.site_xpos[self.site].copy()

    def ee_yaw(self) -> float:
        """Yaw of the hand about the world z axis (hand pointing down)."""
        x_axis = self.data.site_xmat[self.site].reshape(3, 3)[:, 0]
        # The hand's x axis points along +y at yaw 0 (fingers open along world x).
        return float(_wrap(np.arctan2(x_axis[1], x_axis[0]) - np.pi / 2))

    def gripper_width(self) -> float:
        q = self.data.qpos[self.finger_qadr]
        return float(q[0] - q[1])

    def reset_targets(self) -> None:
        self.target_pos = self.ee_pos()
        self.target_yaw = self.ee_yaw()

    # -- control -----------------------------------------------------------------------
    def apply(self, delta_pos: np.ndarray, delta_yaw: float, grip: float) -> None:
        """Set actuator controls for one control step.

        delta_pos: (3,) in [-1, 1]; delta_yaw: scalar in [-1, 1]; grip: -1 open .. 1 closed.
        """
        lim = self.limits
        ee = self.ee_pos()
        target = self.target_pos + lim.max_step_pos * delta_pos
        target = np.clip(target, self.low, self.high)
        target = ee + np.clip(target - ee, -lim.max_lead, lim.max_lead)
        self.target_pos = target
        self.target_yaw = float(
            np.clip(self.target_yaw + lim.max_step_yaw * delta_yaw, -np.pi / 2, np.pi / 2)
        )

        m, d = self.model, self.data
        mujoco.mj_jacSite(m, d, self._jacp, self._jacr, self.site)
        jac = np.vstack([self._jacp[:, self.dadr], self._jacr[:, self.dadr]])  # (6, 7)
        rot = d.site_xmat[self.site].reshape(3, 3)
        cy, sy = np.cos(self.target_yaw), np.sin(self.target_yaw)
        # Desired frame (columns x, y, z): z pointing down, x = +y world rotated by yaw.
        desired = np.array([[-sy, cy, 0.0], [cy, sy, 0.0], [0.0, 0.0, -1.0]])
        rot_err = 0.5 * sum(np.cross(rot[:, i], desired[:, i]) for i in range(3))
        err = np.concatenate([target - ee, rot_err])
        # Damped pseudo-inverse J^T (J J^T + lambda I)^-1, formed once per step: (7, 6)
        pinv = jac.T @ np.linalg.inv(jac @ jac.T + 1e-3 * np.eye(6))
        q = d.qpos[self.qadr]
        dq = pinv @ err
        # Null-space pull toward the home posture keeps the elbow from drifting.
        dq += (np.eye(7) - pinv @ jac) @ (0.1 * (HOME_QPOS - q))
        d.ctrl[self.arm_act] = q + dq
        width = FINGER_OPEN * (1.0 - float(np.clip(grip, -1.0, 1.0))) / 2.0
        d.ctrl[self.finger_act] = (width, -width)

    def set_home(self, qpos: np.ndarray) -> None:
        """Put the arm at ``qpos`` (7,) with matching actuator targets and open fingers."""
        self.data.qpos[self.qadr] = qpos
        self.data.qpos[self.finger_qadr] = (FINGER_OPEN, -FINGER_OPEN)
        self.data.ctrl[self.arm_act] = qpos
        self.data.ctrl[self.finger_act] = (FINGER_OPEN, -FINGER_OPEN)
