"""The ``env`` group: which MuJoCo task a command runs, at what control period, and which
cameras it renders."""

from __future__ import annotations

from dataclasses import dataclass, field

from arli.errors import require


@dataclass
class EnvConfig:
    name: str = "peg_insert"  # pick_cube | peg_insert | peg_insert_dynamic | robosuite_lift (or a gym id)
    dt: float = 0.05  # control period (s), the robot's too
    image_size: int = 0  # 0 = state only (nothing rendered); > 0 renders (S, S, 3) per camera (MUJOCO_GL=egl)
    cameras: list[str] = field(default_factory=lambda: ["front"])  # rendered when image_size > 0: front, wrist
    max_episode_steps: int | None = None  # None = the task's default

    def render_kwargs(self) -> dict:
        """``make_env`` keywords for this config's cameras (``{}`` when state only)."""
        return {"image_size": self.image_size, "cameras": list(self.cameras)} if self.image_size else {}

    def validate(self) -> None:
        from sim_envs.franka import CAMERAS  # noqa: PLC0415 - the tasks load MuJoCo
        from sim_envs.registry import TASKS, task_name  # noqa: PLC0415

        try:
            task_name(self.name)
        except ValueError:
            require(False, "env.name", f"one of {sorted(TASKS)}", self.name)
        require(self.dt > 0 and abs(self.dt / 0.005 - round(self.dt / 0.005)) < 1e-6,
                "env.dt", "a positive multiple of 0.005 s", self.dt)
        require(self.image_size >= 0, "env.image_size", "an integer >= 0", self.image_size)
        cams = list(self.cameras)
        require(all(c in CAMERAS for c in cams) and len(set(cams)) == len(cams), "env.cameras",
                f"distinct names from {list(CAMERAS)}", cams)
        require(bool(cams) or not self.image_size, "env.cameras",
                "at least one camera when env.image_size > 0 (or env.image_size=0 for state only)", cams)
        require(self.max_episode_steps is None or self.max_episode_steps > 0,
                "env.max_episode_steps", "null or > 0", self.max_episode_steps)
