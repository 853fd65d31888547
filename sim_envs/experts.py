"""Scripted experts: closed-loop, stateless functions of the state vector.

Stateless on purpose: the same expert serves as demonstrator and as the simulated human
intervener, who must be able to take over from any state the robot is in.
Each returns an action (5,) in [-1, 1] (see ``sim_envs.base``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sim_envs.franka import CartesianLimits
from sim_envs.peg_insert import HOLE_HALF, PEG_HALF_LEN, RIM_HEIGHT

_LIM = CartesianLimits()
OPEN, CLOSE = -1.0, 1.0


class ScriptedExpert(Protocol):
    def __call__(self, state: np.ndarray) -> np.ndarray:
        """state (n,) -> action (5,)."""


def _move(ee: np.ndarray, target: np.ndarray, gain: float = 0.4, max_speed: float = 1.0):
    """Proportional Cartesian step toward ``target`` in normalised action units (3,)."""
    return np.clip(gain * (target - ee) / _LIM.max_step_pos, -max_speed, max_speed)


def _yaw_action(ee_sin: float, ee_cos: float, target_yaw: float) -> float:
    err = (target_yaw - np.arctan2(ee_sin, ee_cos) + np.pi) % (2 * np.pi) - np.pi
    return float(np.clip(0.8 * err / _LIM.max_step_yaw, -1.0, 1.0))


def _action(move: np.ndarray, yaw: float, grip: float) -> np.ndarray:
    return np.concatenate([move, [yaw, grip]]).astype(np.float32)


def pick_cube_expert(state: np.ndarray) -> np.ndarray:
    """Approach above the cube, align yaw, descend, close, lift."""
    ee, width = state[0:3], state[5]
    cube = state[9:12]
    cube_yaw = np.arctan2(state[12], state[13]) / 4.0  # in [-pi/4, pi/4] (cube symmetry)
    yaw = _yaw_action(state[3], state[4], cube_yaw)
    rel = cube - ee
    grasped = width < 0.046 and np.linalg.norm(rel) < 0.025
    if grasped:
        return _action(_move(ee, np.array([ee[0], ee[1], 0.16])), 0.0, CLOSE)
    if np.linalg.norm(rel[:2]) > 0.008:
        hover = np.array([cube[0], cube[1], max(ee[2], cube[2] + 0.05)])
        if np.linalg.norm(rel[:2]) > 0.03:
            hover[2] = cube[2] + 0.08
        return _action(_move(ee, hover), yaw, OPEN)
    if ee[2] - cube[2] > 0.004:
        if width < 0.07:  # fingers still closing from a failed grasp: open first
            return _action(np.zeros(3), yaw, OPEN)
        return _action(_move(ee, cube), yaw, OPEN)
    return _action(_move(ee, cube), 0.0, CLOSE)


def peg_insert_expert(state: np.ndarray) -> np.ndarray:
    """Grasp the peg near its top, lift it clear of the fixture, align over the hole, insert."""
    ee, width = state[0:3], state[5]
    peg, hole = state[9:12], state[14:17]
    yaw = _yaw_action(state[3], state[4], 0.0)
    grasp_point = peg + np.array([0.0, 0.0, 0.015])
    rel = grasp_point - ee
    grasped = width < 2 * HOLE_HALF and np.linalg.norm(rel) < 0.045
    if grasped:
        peg_bottom = peg[2] - PEG_HALF_LEN
        err_xy = hole[:2] - peg[:2]
        clear_height = RIM_HEIGHT + 0.015
        if np.linalg.norm(err_xy) > 0.0025:
            # Travel above the rim; only descend once aligned to within the clearance.
            dz = (clear_height + 0.01) - peg_bottom if peg_bottom < clear_height else 0.0
            target = ee + np.array([err_xy[0], err_xy[1], dz])
            return _action(_move(ee, target, gain=0.35, max_speed=0.6), yaw, CLOSE)
        target = ee + np.array([err_xy[0], err_xy[1], -0.03])
        return _action(_move(ee, target, gain=0.35, max_speed=0.6), yaw, CLOSE)
    if np.linalg.norm(rel[:2]) > 0.006:
        hover = np.array([grasp_point[0], grasp_point[1], peg[2] + PEG_HALF_LEN + 0.06])
        if np.linalg.norm(rel[:2]) < 0.03:
            hover[2] = max(ee[2], grasp_point[2] + 0.03)
        return _action(_move(ee, hover), yaw, OPEN)
    if ee[2] - grasp_point[2] > 0.004:
        if width < 0.07:
            return _action(np.zeros(3), yaw, OPEN)
        return _action(_move(ee, grasp_point), yaw, OPEN)
    return _action(_move(ee, grasp_point), 0.0, CLOSE)


EXPERTS: dict[str, ScriptedExpert] = {
    "pick_cube": pick_cube_expert,
    "peg_insert": peg_insert_expert,
}
