"""MuJoCo Franka tasks (gymnasium API). Importing this package registers the gym ids."""

from sim_envs.registry import GYM_IDS, TASKS, make_env, register_all, task_name

register_all()

__all__ = ["GYM_IDS", "TASKS", "make_env", "register_all", "task_name"]
