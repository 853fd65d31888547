"""The ``env`` group: which MuJoCo task a command runs and at what control period."""

from __future__ import annotations

from dataclasses import dataclass

from arli.errors import require


@dataclass
class EnvConfig:
    name: str = "peg_insert"  # pick_cube | peg_insert | peg_insert_dynamic | robosuite_lift (or a gym id)
    dt: float = 0.05  # control period (s), the robot's too
    image_size: int = 0  # 0 = state only; > 0 renders (S, S, 3) images (MUJOCO_GL=egl)
    max_episode_steps: int | None = None  # None = the task's default

    def validate(self) -> None:
        from sim_envs.registry import TASKS, task_name  # noqa: PLC0415 - the tasks load MuJoCo

        try:
            task_name(self.name)
        except ValueError:
            require(False, "env.name", f"one of {sorted(TASKS)}", self.name)
        require(self.dt > 0 and abs(self.dt / 0.005 - round(self.dt / 0.005)) < 1e-6,
                "env.dt", "a positive multiple of 0.005 s", self.dt)
        require(self.image_size >= 0, "env.image_size", "an integer >= 0", self.image_size)
        require(self.max_episode_steps is None or self.max_episode_steps > 0,
                "env.max_episode_steps", "null or > 0", self.max_episode_steps)
