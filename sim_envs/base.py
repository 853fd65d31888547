"""Gymnasium base class shared by the MuJoCo Franka tasks.

Action (5,) float32 in [-1, 1]: end-effector delta ``[dx, dy, dz, dyaw, grip]``
(grip -1 = open, +1 = closed), executed at ``dt`` with ``round(dt / 0.005)`` physics
sub-steps inside MuJoCo's C loop. Observation: ``{"state": (n,) float32}`` plus
``{"images": {camera: (S, S, 3) uint8}}`` for each of ``cameras`` when ``image_size > 0``
(nothing is rendered otherwise). The first ``PROPRIO_DIM`` state
entries are proprioception (``PROPRIO_NAMES``); the task appends its object state.
"""

from __future__ import annotations

import abc
import logging
import time
from typing import Any, Sequence

import gymnasium as gym
import mujoco
import numpy as np

from sim_envs.franka import CAMERAS, HOME_QPOS, CartesianLimits, PandaController, build_panda_spec

ACTION_DIM = 5
ACTION_NAMES = ("dx", "dy", "dz", "dyaw", "grip")
PROPRIO_NAMES = ("ee_x", "ee_y", "ee_z", "ee_yaw_sin", "ee_yaw_cos", "gripper_width",
                 "ee_vx", "ee_vy", "ee_vz")
PROPRIO_DIM = len(PROPRIO_NAMES)
# the checks after which MuJoCo resets mjData (mj_checkPos / mj_checkVel / mj_checkAcc)
RESET_WARNINGS = tuple(int(w) for w in (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL,
                                        mujoco.mjtWarning.mjWARN_BADQACC))
log = logging.getLogger(__name__)


def validate_action(action: Any, dim: int = ACTION_DIM) -> np.ndarray:
    """Return ``action`` as a clipped float64 (dim,) array; raise on wrong shape or NaN.

    Finite values outside [-1, 1] are clipped (the env layer is the safety boundary);
    NaN or inf is never clipped into motion.
    """
    arr = np.asarray(action, dtype=np.float64)
    if arr.shape != (dim,):
        raise ValueError(f"action must have shape ({dim},) {ACTION_NAMES[:dim]}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"action contains NaN/inf: {arr.tolist()}; refusing to execute it")
    return np.clip(arr, -1.0, 1.0)


class FrankaTaskEnv(gym.Env, abc.ABC):
    """One Panda, one table, task objects added by the subclass."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    instruction: str = ""
    default_max_episode_steps: int = 100
    task_state_names: tuple[str, ...] = ()
    physics_timestep = 0.005

    def __init__(
        self,
        dt: float = 0.05,
        image_size: int = 0,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        cameras: Sequence[str] = ("front",),
    ) -> None:
        substeps = dt / self.physics_timestep
        if dt <= 0 or abs(substeps - round(substeps)) > 1e-6:
            raise ValueError(
                f"dt must be a positive multiple of the physics step {self.physics_timestep} s, got {dt}"
            )
        if image_size < 0:
            raise ValueError(f"image_size must be >= 0 (0 = no images), got {image_size}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown or len(set(cameras)) != len(cameras) or (image_size and not cameras):
            raise ValueError(f"cameras must be distinct names from {CAMERAS} (at least one when "
                             f"image_size > 0), got {list(cameras)}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.dt = float(dt)
        self.substeps = int(round(substeps))
        self.image_size = int(image_size)
        self.cameras = tuple(cameras) if self.image_size else ()
        self.render_mode = render_mode
        self.max_episode_steps = int(max_episode_steps or self.default_max_episode_steps)

        spec = build_panda_spec()
        self._add_objects(spec)
        self.model = spec.compile()
        self.data = mujoco.MjData(self.model)
        self.ctrl = PandaController(self.model, self.data, CartesianLimits())
        self._renderer: mujoco.Renderer | None = None
        self.render_s = 0.0  # wall time spent rendering camera images (s)
        self._site_vel = np.zeros(6)
        self._bind_objects()

        n_state = PROPRIO_DIM + len(self.task_state_names)
        spaces: dict[str, gym.Space] = {
            "state": gym.spaces.Box(-np.inf, np.inf, (n_state,), np.float32)
        }
        if self.cameras:
            image = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
            spaces["images"] = gym.spaces.Dict({name: image for name in self.cameras})
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.elapsed_steps = 0
        # episodes in which MuJoCo found a NaN/inf/huge position, velocity or acceleration and
        # reset the physics to the model's default state: each ended at that step, truncated
        # and unsuccessful
        self.unstable_episodes = 0

    # -- subclass hooks ----------------------------------------------------------------
    @abc.abstractmethod
    def _add_objects(self, spec: mujoco.MjSpec) -> None:
        """Add the task's bodies/geoms to ``spec``."""

    def _bind_objects(self) -> None:
        """Look up ids of the task's objects in the compiled model."""

    def _after_physics(self) -> None:
        """Called after every control step's physics (dynamic tasks change the scene here)."""

    @abc.abstractmethod
    def _reset_task(self, rng: np.random.Generator) -> None:
        """Place the task objects (qpos / static body poses) for a new episode."""

    @abc.abstractmethod
    def _task_state(self) -> np.ndarray:
        """Task part of the state vector, shape (len(task_state_names),)."""

    @abc.abstractmethod
    def _is_success(self) -> bool:
        """Whether the task is solved in the current physics state."""

    # -- gym API -----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        mujoco.mj_resetData(self.model, self.data)
        qpos = HOME_QPOS + rng.uniform(-0.03, 0.03, size=7)
        self.ctrl.set_home(qpos)
        self._reset_task(rng)
        mujoco.mj_forward(self.model, self.data)
        self.ctrl.reset_targets()
        self.elapsed_steps = 0
        return self._observation(), {"is_success": False}

    def step(self, action):
        act = validate_action(action)
        self.ctrl.apply(act[:3], float(act[3]), float(act[4]))
        # MuJoCo resets mjData when a position, velocity or acceleration is NaN/inf (or huge)
        # and carries on: the objects jump to their default poses, so the rest of such an
        # episode would be a different task. A reset zeroes every warning counter and then
        # sets its own to 1, so counts are not monotonic: zeroed here, any count after the
        # step means at least one reset in it
        for w in RESET_WARNINGS:
            self.data.warning[w].number = 0
        mujoco.mj_step(self.model, self.data, nstep=self.substeps)
        unstable = any(self.data.warning[w].number > 0 for w in RESET_WARNINGS)
        # mj_step leaves positions integrated past the last kinematics pass; refresh them
        # so observations, IK and success checks see the same state.
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)
        mujoco.mj_comVel(self.model, self.data)
        if self.cameras:  # camera poses too (the wrist camera rides on the hand)
            mujoco.mj_camlight(self.model, self.data)
        self.elapsed_steps += 1
        self._after_physics()
        success = not unstable and self._is_success()
        truncated = unstable or self.elapsed_steps >= self.max_episode_steps
        if unstable:
            self.unstable_episodes += 1
            log.warning("MuJoCo reset an unstable simulation (NaN/inf/huge state) at control step %d: the "
                        "episode ends here, unsuccessful", self.elapsed_steps)
        info = {"is_success": success, "sim_unstable": unstable}
        return self._observation(), float(success), success, truncated and not success, info

    def render(self) -> np.ndarray:
        return self._render_image(max(self.image_size, 128))

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # -- helpers -----------------------------------------------------------------------
    @property
    def state_names(self) -> tuple[str, ...]:
        return PROPRIO_NAMES + self.task_state_names

    def _proprio(self) -> np.ndarray:
        mujoco.mj_objectVelocity(
            self.model, self.data, mujoco.mjtObj.mjOBJ_SITE, self.ctrl.site, self._site_vel, 0
        )
        yaw = self.ctrl.ee_yaw()
        return np.concatenate([
            self.ctrl.ee_pos(), [np.sin(yaw), np.cos(yaw), self.ctrl.gripper_width()],
            self._site_vel[3:],
        ])

    def _observation(self) -> dict[str, np.ndarray]:
        state = np.concatenate([self._proprio(), self._task_state()]).astype(np.float32)
        obs = {"state": state}
        if self.cameras:
            obs["images"] = {name: self._render_image(self.image_size, name) for name in self.cameras}
        return obs

    def _render_image(self, size: int, camera: str = "front") -> np.ndarray:
        """(size, size, 3) uint8 from ``camera`` (one renderer serves every camera).
        Shadows, reflections and multisampling are off: on a software GL (Mesa llvmpipe, no
        GPU) the 4096² shadow maps alone cost ~250 ms a frame at 96², this renders in ~30 ms;
        ``render_s`` sums it."""
        start = time.perf_counter()
        if self._renderer is None or self._renderer.width != size:
            if self._renderer is not None:
                self._renderer.close()
            self.model.vis.quality.offsamples = 0
            self._renderer = mujoco.Renderer(self.model, size, size)
            self._scene_option = mujoco.MjvOption()
            self._scene_option.sitegroup[:] = 0  # sites mark frames for debugging; no camera sees them
        self._renderer.update_scene(self.data, camera=camera, scene_option=self._scene_option)
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        image = self._renderer.render().copy()
        self.render_s += time.perf_counter() - start
        return image


def add_box(parent: mujoco.MjsBody, name: str, half_size, pos, rgba, **geom_attrs):
    """Add a box geom to ``parent``; returns the geom spec."""
    geom = parent.add_geom()
    geom.name = name
    geom.type = mujoco.mjtGeom.mjGEOM_BOX
    geom.size = list(half_size)
    geom.pos = list(pos)
    geom.rgba = list(rgba)
    for key, value in geom_attrs.items():
        setattr(geom, key, value)
    return geom


class ProprioOnly(gym.ObservationWrapper):
    """The task as a real arm sees it: ``state`` is proprioception only (``PROPRIO_NAMES``),
    the object state a sim knows is dropped (a real robot has it only through cameras)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Dict({
            **space.spaces, "state": gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32)})

    @property
    def state_names(self) -> tuple[str, ...]:
        return PROPRIO_NAMES

    def observation(self, observation):
        return {**observation, "state": np.asarray(observation["state"][:PROPRIO_DIM], np.float32)}
