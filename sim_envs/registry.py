"""Task names, gymnasium ids and one ``make_env`` that validates them."""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

# short name -> (gymnasium id, entry point)
TASKS: dict[str, tuple[str, str]] = {
    "pick_cube": ("ARLI/PickCube-v0", "sim_envs.pick_cube:PickCubeEnv"),
    "peg_insert": ("ARLI/PegInsert-v0", "sim_envs.peg_insert:PegInsertEnv"),
    "peg_insert_dynamic": ("ARLI/PegInsertDynamic-v0", "sim_envs.peg_insert:PegInsertDynamicEnv"),
    "robosuite_lift": ("ARLI/RobosuiteLift-v0", "sim_envs.robosuite_adapter:RobosuiteLiftEnv"),
}
GYM_IDS = {gym_id: name for name, (gym_id, _) in TASKS.items()}


def register_all() -> None:
    for gym_id, entry in TASKS.values():
        if gym_id not in gym.registry:
            gym.register(id=gym_id, entry_point=entry)


def task_name(name_or_id: str) -> str:
    """Canonical short name for a task name or gym id; ValueError listing valid ones."""
    if name_or_id in TASKS:
        return name_or_id
    if name_or_id in GYM_IDS:
        return GYM_IDS[name_or_id]
    raise ValueError(
        f"unknown env {name_or_id!r}; valid: {sorted(TASKS)} or ids {sorted(GYM_IDS)}"
    )


def env_class(name_or_id: str) -> type:
    module, cls = TASKS[task_name(name_or_id)][1].split(":")
    return getattr(importlib.import_module(module), cls)


def make_env(name_or_id: str, **kwargs: Any) -> gym.Env:
    """Instantiate a task by short name (``peg_insert``) or gym id (``ARLI/PegInsert-v0``)."""
    return env_class(name_or_id)(**kwargs)
