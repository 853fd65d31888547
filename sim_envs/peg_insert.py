"""PegInsert: grasp an upright peg and insert it into a square hole with 3 mm clearance.

The precision task: a lateral error above ~3 mm at the rim makes the peg land on the
fixture instead of in the hole.
"""

from __future__ import annotations

import mujoco
import numpy as np

from sim_envs.base import FrankaTaskEnv, add_box

PEG_RADIUS = 0.015
PEG_HALF_LEN = 0.04
CLEARANCE = 0.003  # per side
HOLE_HALF = PEG_RADIUS + CLEARANCE
WALL_HALF = 0.015  # half thickness of the fixture walls
RIM_HEIGHT = 0.04
INSERT_DEPTH = 0.02  # peg bottom must be this far below the rim


class PegInsertEnv(FrankaTaskEnv):
    """State: proprio (9) + peg pos (3) + peg axis xy tilt (2) + hole pos (3) + peg - hole (3)."""

    instruction = "insert the peg into the hole"
    default_max_episode_steps = 150
    task_state_names = ("peg_x", "peg_y", "peg_z", "peg_tilt_x", "peg_tilt_y",
                        "hole_x", "hole_y", "hole_z", "peg_hole_dx", "peg_hole_dy", "peg_hole_dz")

    def _add_objects(self, spec: mujoco.MjSpec) -> None:
        peg = spec.worldbody.add_body()
        peg.name = "peg"
        peg.add_freejoint().name = "peg_free"
        geom = peg.add_geom()
        geom.name = "peg_geom"
        geom.type = mujoco.mjtGeom.mjGEOM_CYLINDER
        geom.size = [PEG_RADIUS, PEG_HALF_LEN, 0]
        geom.rgba = [0.2, 0.45, 0.85, 1.0]
        geom.mass = 0.06
        geom.friction = [1.0, 0.005, 0.0001]

        hole = spec.worldbody.add_body()  # static: moved by editing model.body_pos
        hole.name = "hole"
        off = HOLE_HALF + WALL_HALF
        long_half = HOLE_HALF + 2 * WALL_HALF
        color = [0.3, 0.3, 0.3, 1.0]
        h = RIM_HEIGHT / 2
        add_box(hole, "wall_px", [WALL_HALF, long_half, h], [off, 0, h], color)
        add_box(hole, "wall_nx", [WALL_HALF, long_half, h], [-off, 0, h], color)
        add_box(hole, "wall_py", [HOLE_HALF, WALL_HALF, h], [0, off, h], color)
        add_box(hole, "wall_ny", [HOLE_HALF, WALL_HALF, h], [0, -off, h], color)

    def _bind_objects(self) -> None:
        self._peg_qadr = self.model.joint("peg_free").qposadr[0]
        self._peg_body = self.model.body("peg").id
        self._hole_body = self.model.body("hole").id

    def _reset_task(self, rng: np.random.Generator) -> None:
        peg_xy = rng.uniform([0.42, -0.20], [0.60, -0.05])
        hole_xy = rng.uniform([0.42, 0.06], [0.60, 0.20])
        if rng.random() < 0.5:  # mirror so both sides of the workspace are used
            peg_xy[1], hole_xy[1] = -peg_xy[1], -hole_xy[1]
        self.model.body_pos[self._hole_body] = (hole_xy[0], hole_xy[1], 0.0)
        q = self.data.qpos
        q[self._peg_qadr:self._peg_qadr + 3] = (peg_xy[0], peg_xy[1], PEG_HALF_LEN)
        q[self._peg_qadr + 3:self._peg_qadr + 7] = (1.0, 0.0, 0.0, 0.0)

    def peg_pos(self) -> np.ndarray:
        return self.data.xpos[self._peg_body].copy()

    def hole_pos(self) -> np.ndarray:
        return self.data.xpos[self._hole_body].copy()

    def _task_state(self) -> np.ndarray:
        peg, hole = self.peg_pos(), self.hole_pos()
        axis = self.data.xmat[self._peg_body].reshape(3, 3)[:, 2]
        return np.concatenate([peg, axis[:2], hole, peg - hole])

    def _is_success(self) -> bool:
        peg, hole = self.peg_pos(), self.hole_pos()
        bottom = peg[2] - PEG_HALF_LEN
        inside = np.all(np.abs(peg[:2] - hole[:2]) < HOLE_HALF)
        return bool(inside and bottom < RIM_HEIGHT - INSERT_DEPTH)


class PegInsertDynamicEnv(PegInsertEnv):
    """PegInsert whose hole fixture is displaced mid-episode (the dynamic precision task).

    At a random step in ``shift_window`` the fixture jumps ``shift_range`` metres in a random
    horizontal direction — more than the 3 mm clearance, so a peg aimed at the old hole lands
    on the rim. The shift is visible only in observations taken after it (hole position in
    the state), which is what a fresh mid-inference observation provides and a stale chunk
    does not. No shift once the peg is inside the hole.
    """

    instruction = "insert the peg into the hole"
    shift_window = (25, 55)  # control steps
    shift_range = (0.005, 0.009)  # metres

    def _reset_task(self, rng: np.random.Generator) -> None:
        super()._reset_task(rng)
        self.shift_step = int(rng.integers(*self.shift_window))
        angle = rng.uniform(-np.pi, np.pi)
        self.shift = rng.uniform(*self.shift_range) * np.array([np.cos(angle), np.sin(angle), 0.0])
        self.shifted = False

    def _after_physics(self) -> None:
        if self.shifted or self.elapsed_steps != self.shift_step:
            return
        peg, hole = self.peg_pos(), self.hole_pos()
        if np.all(np.abs(peg[:2] - hole[:2]) < HOLE_HALF + WALL_HALF) and peg[2] - PEG_HALF_LEN < RIM_HEIGHT:
            return  # already entering the hole: moving the walls would cut through the peg
        self.model.body_pos[self._hole_body] += self.shift
        self.shifted = True
        mujoco.mj_kinematics(self.model, self.data)
