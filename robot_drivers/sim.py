"""A MuJoCo task (any gymnasium env of ``sim_envs``) behind the driver interface."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import gymnasium as gym
import numpy as np

from arli.types import Observation
from robot_drivers.base import RobotDriver, StepResult, check_action


class SimDriver(RobotDriver):
    """Wraps ``env``; ``now`` stamps observations (sim time by default: step * dt).

    In sim time the physics advances ``dt`` per ``act`` instantly; on a real clock the
    runtime's clock paces the calls at ``dt``, so the simulated robot moves in wall time.
    """

    def __init__(self, env: gym.Env, now: Callable[[], float] | None = None):
        self.env = env
        self.dt = float(getattr(env.unwrapped, "dt", 0.05))
        self.state_dim = int(env.observation_space["state"].shape[0])
        self.action_dim = int(env.action_space.shape[0])
        self.max_episode_steps = int(getattr(env.unwrapped, "max_episode_steps", 1000))
        self._now = now
        self._step = 0
        self._obs: Observation | None = None

    def _stamp(self, obs: dict) -> Observation:
        ts = self._now() if self._now is not None else self._step * self.dt
        images = dict(obs.get("images", {}))  # camera name -> (S, S, 3) uint8, as in the demos
        return Observation(np.asarray(obs["state"], np.float32), self._step, ts, images)

    def reset(self, seed: int | None = None) -> Observation:
        obs, _ = self.env.reset(seed=seed)
        self._step = 0
        self._obs = self._stamp(obs)
        return self._obs

    def observe(self) -> Observation:
        """The state after the last ``act``, stamped now (the sim stands still between
        steps, so a capture at the control tick sees exactly that state)."""
        if self._obs is None:
            raise RuntimeError("observe() before reset()")
        if self._now is not None:
            self._obs = replace(self._obs, timestamp=self._now())
        return self._obs

    def act(self, action: np.ndarray) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(check_action(action, self.action_dim))
        self._step += 1
        self._obs = self._stamp(obs)
        return StepResult(self._obs, float(reward), bool(terminated), bool(truncated),
                          bool(info.get("is_success", False)), info)

    def close(self) -> None:
        self.env.close()
