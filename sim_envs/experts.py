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


# Teleoperator-like motion (DESIGN.md §4): speed is bounded, speeding up is bounded by the
# measured hand speed (no jumps from rest) and the approach is exponential with a slow gain,
# so an action chunk spreads its motion over many slots instead of front-loading it into
# the first few (which latency skips). Braking is not rate-limited: the measured velocity
# lags the commanded target, and braking from it would overshoot.
MAX_SPEED = 0.6  # action units (x 2 cm) per step: 0.24 m/s at 20 Hz
MAX_ACCEL = 0.1  # speed-up per step over the measured hand speed, action units
GAIN = 0.3  # fraction of the remaining distance commanded per step
POLICY_DT = 0.05  # the control period the experts were designed for


def _move(ee: np.ndarray, target: np.ndarray, vel: np.ndarray, gain: float = GAIN,
          max_speed: float = MAX_SPEED) -> np.ndarray:
    """Cartesian step toward ``target`` (3,), normalised action units, from the measured
    hand velocity ``vel`` (3,) m/s: speed min(max_speed, gain * distance, |v| + MAX_ACCEL)."""
    err = (target - ee) / _LIM.max_step_pos
    dist = float(np.linalg.norm(err))
    current = float(np.linalg.norm(vel)) * POLICY_DT / _LIM.max_step_pos
    speed = min(max_speed, gain * dist, current + MAX_ACCEL)
    return err * (speed / dist) if dist > 1e-9 else np.zeros(3)


def _yaw_action(ee_sin: float, ee_cos: float, target_yaw: float) -> float:
    err = (target_yaw - np.arctan2(ee_sin, ee_cos) + np.pi) % (2 * np.pi) - np.pi
    return float(np.clip(0.8 * err / _LIM.max_step_yaw, -1.0, 1.0))


def _action(move: np.ndarray, yaw: float, grip: float) -> np.ndarray:
    return np.concatenate([move, [yaw, grip]]).astype(np.float32)


def pick_cube_expert(state: np.ndarray) -> np.ndarray:
    """Approach above the cube, align yaw, descend, close, lift."""
    ee, width, vel = state[0:3], state[5], state[6:9]
    cube = state[9:12]
    cube_yaw = np.arctan2(state[12], state[13]) / 4.0  # in [-pi/4, pi/4] (cube symmetry)
    yaw = _yaw_action(state[3], state[4], cube_yaw)
    rel = cube - ee
    grasped = width < 0.046 and np.linalg.norm(rel) < 0.025
    if grasped:
        return _action(_move(ee, np.array([ee[0], ee[1], 0.16]), vel), 0.0, CLOSE)
    if np.linalg.norm(rel[:2]) > 0.008:
        hover = np.array([cube[0], cube[1], max(ee[2], cube[2] + 0.05)])
        if np.linalg.norm(rel[:2]) > 0.03:
            hover[2] = cube[2] + 0.08
        return _action(_move(ee, hover, vel), yaw, OPEN)
    if ee[2] - cube[2] > 0.004:
        if width < 0.07:  # fingers still closing from a failed grasp: open first
            return _action(np.zeros(3), yaw, OPEN)
        return _action(_move(ee, cube, vel), yaw, OPEN)
    return _action(_move(ee, cube, vel), 0.0, CLOSE)


def peg_insert_expert(state: np.ndarray) -> np.ndarray:
    """Grasp the peg near its top, lift it clear of the fixture, align over the hole, insert."""
    ee, width, vel = state[0:3], state[5], state[6:9]
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
            return _action(_move(ee, target, vel, max_speed=0.5), yaw, CLOSE)
        target = ee + np.array([err_xy[0], err_xy[1], -0.03])
        return _action(_move(ee, target, vel, max_speed=0.5), yaw, CLOSE)
    if np.linalg.norm(rel[:2]) > 0.006:
        hover = np.array([grasp_point[0], grasp_point[1], peg[2] + PEG_HALF_LEN + 0.06])
        if np.linalg.norm(rel[:2]) < 0.03:
            hover[2] = max(ee[2], grasp_point[2] + 0.03)
        return _action(_move(ee, hover, vel), yaw, OPEN)
    if ee[2] - grasp_point[2] > 0.004:
        if width < 0.07:
            return _action(np.zeros(3), yaw, OPEN)
        return _action(_move(ee, grasp_point, vel), yaw, OPEN)
    return _action(_move(ee, grasp_point, vel), 0.0, CLOSE)


def robosuite_lift_expert(state: np.ndarray) -> np.ndarray:
    """``pick_cube``'s phases for robosuite's Lift (same state layout), with the motion of a
    position controller: robosuite's OSC hand covers a fraction of each commanded step, so
    the pick expert's speed ramp (bounded by the measured hand speed) never gets it moving.
    Here each step commands the whole remaining distance, clipped; the lagging hand makes
    the approach smooth. A grasp counts from a 6.2 cm finger gap: robosuite's cube is 4-4.4 cm
    and the fingers close on it slightly rotated."""
    ee, width = state[0:3], state[5]
    cube = state[9:12]
    yaw = _yaw_action(state[3], state[4], np.arctan2(state[12], state[13]) / 4.0)
    rel = cube - ee

    def toward(target: np.ndarray) -> np.ndarray:
        return np.clip((target - ee) / _LIM.max_step_pos, -1.0, 1.0)

    if width < 0.062 and np.linalg.norm(rel) < 0.03:  # holding it: lift
        return _action(toward(np.array([ee[0], ee[1], 0.2])), 0.0, CLOSE)
    if np.linalg.norm(rel[:2]) > 0.01:
        hover = np.array([cube[0], cube[1], max(ee[2], cube[2] + 0.05)])
        if np.linalg.norm(rel[:2]) > 0.03:
            hover[2] = cube[2] + 0.08
        return _action(toward(hover), yaw, OPEN)
    if ee[2] - cube[2] > 0.006:
        if width < 0.07:  # fingers still closing from a failed grasp: open first
            return _action(np.zeros(3), yaw, OPEN)
        return _action(toward(cube), yaw, OPEN)
    return _action(toward(cube), 0.0, CLOSE)


EXPERTS: dict[str, ScriptedExpert] = {
    "pick_cube": pick_cube_expert,
    "peg_insert": peg_insert_expert,
    "peg_insert_dynamic": peg_insert_expert,
    "robosuite_lift": robosuite_lift_expert,
}


# -- open-loop chunking of the experts (a chunk policy for demos under latency) ------------
class _Layout:
    """Where a task's state keeps the manipulated object and its derived features."""

    def __init__(self, obj: slice, obj_width: float, rel_to_ee: slice | None = None,
                 rel_to_fixed: tuple[slice, slice] | None = None):
        self.obj, self.obj_width = obj, obj_width
        self.rel_to_ee, self.rel_to_fixed = rel_to_ee, rel_to_fixed


LAYOUTS = {
    "pick_cube": _Layout(slice(9, 12), 0.04, rel_to_ee=slice(14, 17)),
    "peg_insert": _Layout(slice(9, 12), 0.03, rel_to_fixed=(slice(17, 20), slice(14, 17))),
    "peg_insert_dynamic": _Layout(slice(9, 12), 0.03, rel_to_fixed=(slice(17, 20), slice(14, 17))),
    "robosuite_lift": _Layout(slice(9, 12), 0.04, rel_to_ee=slice(14, 17)),  # pick_cube's layout
}


def predict_state(task: str, state: np.ndarray, action: np.ndarray, dt: float = 0.05) -> np.ndarray:
    """Kinematic one-step prediction of the state (n,) under ``action`` (5,).

    Assumes the hand tracks its target, and that an object between closed fingers moves
    with the hand. Crude on purpose: it is what an open-loop planner of chunks knows.
    """
    lay = LAYOUTS[task]
    s = state.copy()
    ee = s[0:3].copy()  # a view would change with s below (and zero the velocity)
    delta = np.clip(action[:3], -1, 1) * _LIM.max_step_pos
    new_ee = np.clip(ee + delta, _LIM.low, _LIM.high)
    yaw = np.arctan2(s[3], s[4]) + np.clip(action[3], -1, 1) * _LIM.max_step_yaw
    target_width = 0.08 * (1.0 - np.clip(action[4], -1, 1)) / 2.0
    obj = s[lay.obj]
    near = np.all(np.abs(obj - ee) < np.array([0.02, 0.02, 0.03]))
    width = s[5] + np.clip(target_width - s[5], -0.03, 0.03)
    holding = near and target_width < lay.obj_width
    if holding:
        width = max(width, lay.obj_width - 0.004)
        s[lay.obj] = obj + (new_ee - ee)
    s[0:3], s[3], s[4], s[5] = new_ee, np.sin(yaw), np.cos(yaw), width
    s[6:9] = (new_ee - ee) / dt
    if lay.rel_to_ee is not None:
        s[lay.rel_to_ee] = s[lay.obj] - new_ee
    if lay.rel_to_fixed is not None:
        rel, fixed = lay.rel_to_fixed
        s[rel] = s[lay.obj] - s[fixed]
    return s
