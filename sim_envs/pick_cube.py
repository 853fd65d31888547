"""PickCube: grasp a randomly placed 4 cm cube and lift it 8 cm above the table."""

from __future__ import annotations

import mujoco
import numpy as np

from sim_envs.base import FrankaTaskEnv, add_box

CUBE_HALF = 0.02
LIFT_HEIGHT = 0.10  # cube centre height (m) that counts as lifted


class PickCubeEnv(FrankaTaskEnv):
    """State: proprio (9) + cube pos (3) + sin/cos(4 * cube yaw) (2) + cube - ee (3)."""

    instruction = "pick up the red cube and lift it"
    default_max_episode_steps = 100
    task_state_names = ("cube_x", "cube_y", "cube_z", "cube_yaw4_sin", "cube_yaw4_cos",
                        "cube_rel_x", "cube_rel_y", "cube_rel_z")

    def _add_objects(self, spec: mujoco.MjSpec) -> None:
        cube = spec.worldbody.add_body()
        cube.name = "cube"
        cube.add_freejoint().name = "cube_free"
        add_box(cube, "cube_geom", [CUBE_HALF] * 3, [0, 0, 0], [0.85, 0.15, 0.1, 1.0],
                mass=0.08, friction=[1.0, 0.005, 0.0001])

    def _bind_objects(self) -> None:
        self._cube_qadr = self.model.joint("cube_free").qposadr[0]
        self._cube_body = self.model.body("cube").id

    def _reset_task(self, rng: np.random.Generator) -> None:
        xy = rng.uniform([0.40, -0.15], [0.62, 0.15])
        yaw = rng.uniform(-np.pi / 4, np.pi / 4)
        q = self.data.qpos
        q[self._cube_qadr:self._cube_qadr + 3] = (xy[0], xy[1], CUBE_HALF)
        q[self._cube_qadr + 3:self._cube_qadr + 7] = (np.cos(yaw / 2), 0, 0, np.sin(yaw / 2))

    def cube_pos(self) -> np.ndarray:
        return self.data.xpos[self._cube_body].copy()

    def _task_state(self) -> np.ndarray:
        pos = self.cube_pos()
        xmat = self.data.xmat[self._cube_body].reshape(3, 3)
        yaw4 = 4.0 * np.arctan2(xmat[1, 0], xmat[0, 0])
        return np.concatenate([pos, [np.sin(yaw4), np.cos(yaw4)], pos - self.ctrl.ee_pos()])

    def _is_success(self) -> bool:
        pos = self.cube_pos()
        held = np.linalg.norm(pos - self.ctrl.ee_pos()) < 0.04
        return bool(pos[2] > LIFT_HEIGHT and held)
