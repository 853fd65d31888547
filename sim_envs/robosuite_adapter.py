"""robosuite ``Lift`` (Panda, OSC_POSE controller) behind the same interface as our tasks.

Same action (5,) ``[dx, dy, dz, dyaw, grip]`` and the same state layout as ``pick_cube``
(positions relative to the table top), so policies, schedulers and the scripted pick
expert run unchanged. This is the literature's reference task; it is ~40x slower than ours
because robosuite runs its operational-space controller in Python at every physics step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sim_envs.base import ACTION_DIM, PROPRIO_NAMES, validate_action
from sim_envs.franka import CartesianLimits
from sim_envs.pick_cube import PickCubeEnv

_LIM = CartesianLimits()
OSC_MAX_POS, OSC_MAX_ROT = 0.05, 0.5  # robosuite OSC_POSE output_max (m, rad) at |input| = 1


def _yaw_from_quat_xyzw(q: np.ndarray) -> float:
    x, y, z, w = q
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


class RobosuiteLiftEnv(gym.Env):
    """robosuite Lift with a Panda at ``1/dt`` Hz, state observations only."""

    metadata = {"render_modes": [], "render_fps": 20}
    instruction = PickCubeEnv.instruction
    task_state_names = PickCubeEnv.task_state_names
    default_max_episode_steps = 100

    def __init__(self, dt: float = 0.05, image_size: int = 0, max_episode_steps: int | None = None,
                 render_mode: str | None = None, cameras=("front",)) -> None:
        import robosuite  # noqa: PLC0415 - slow import, only when this env is used
        from robosuite.controllers import load_composite_controller_config  # noqa: PLC0415

        if image_size:
            raise ValueError("robosuite_lift supports state observations only (image_size=0)")
        freq = 1.0 / dt
        if abs(freq - round(freq)) > 1e-6:
            raise ValueError(f"robosuite needs an integer control frequency; dt={dt} gives {freq} Hz")
        self.dt = dt
        self.max_episode_steps = int(max_episode_steps or self.default_max_episode_steps)
        self._env = robosuite.make(
            "Lift", robots="Panda",
            controller_configs=load_composite_controller_config(controller="BASIC"),
            has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
            control_freq=int(round(freq)), horizon=self.max_episode_steps + 1,
            reward_shaping=False, ignore_done=True,
        )
        self._table_z = float(self._env.table_offset[2])
        n = len(PROPRIO_NAMES) + len(self.task_state_names)
        self.observation_space = gym.spaces.Dict(
            {"state": gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.elapsed_steps = 0
        self._prev_ee: np.ndarray | None = None

    @property
    def state_names(self) -> tuple[str, ...]:
        return PROPRIO_NAMES + self.task_state_names

    def _state(self, obs: dict) -> np.ndarray:
        off = np.array([0.0, 0.0, self._table_z])
        ee = obs["robot0_eef_pos"] - off
        # robosuite's hand frame: yaw 0 when the fingers close along world y, as ours
        yaw = _yaw_from_quat_xyzw(obs["robot0_eef_quat"]) - np.pi / 2
        yaw = (yaw + np.pi) % (2 * np.pi) - np.pi
        width = float(obs["robot0_gripper_qpos"][0] - obs["robot0_gripper_qpos"][1])
        vel = np.zeros(3) if self._prev_ee is None else (ee - self._prev_ee) / self.dt
        self._prev_ee = ee
        cube = obs["cube_pos"] - off
        cube_yaw4 = 4.0 * _yaw_from_quat_xyzw(obs["cube_quat"])
        return np.concatenate([
            ee, [np.sin(yaw), np.cos(yaw), width], vel,
            cube, [np.sin(cube_yaw4), np.cos(cube_yaw4)], cube - ee,
        ]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            np.random.seed(seed)  # robosuite's placement sampler draws from numpy's global RNG
        obs = self._env.reset()
        self._prev_ee = None
        self.elapsed_steps = 0
        return {"state": self._state(obs)}, {"is_success": False}

    def step(self, action):
        act = validate_action(action)
        osc = np.zeros(7)
        osc[:3] = act[:3] * _LIM.max_step_pos / OSC_MAX_POS
        osc[5] = act[3] * _LIM.max_step_yaw / OSC_MAX_ROT
        osc[6] = act[4]
        obs, _, _, _ = self._env.step(osc)
        self.elapsed_steps += 1
        success = bool(self._env._check_success())
        truncated = self.elapsed_steps >= self.max_episode_steps
        return ({"state": self._state(obs)}, float(success), success, truncated and not success,
                {"is_success": success})

    def close(self) -> None:
        self._env.close()
