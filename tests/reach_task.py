"""A 1-D reach task for end-to-end learning tests (no MuJoCo, a few seconds per run).

State ``[x, g]`` (2,): move x from 0 to the goal g in U(0.3, 0.8); action (1,) in [-1, 1]
moves x by ``STEP * a``; success (reward 1, terminates) at ``|x - g| < TOL``, else the
episode ends after ``T`` steps. ``controller(bias)`` is ``clip(GAIN (g - x) + bias)``: with
a bias below 0 it settles ``-bias / GAIN`` short of the goal, so the base of
``ChunkPolicy(-0.5)`` (0.1 short, twice the tolerance) never succeeds.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from arli.policies.base import BasePolicy

STEP, GAIN, TOL, T = 0.1, 5.0, 0.05, 30


class Reach1D(gym.Env):
    dt = 0.05
    max_episode_steps = T

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x = self.g = 0.0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.g, self.t = 0.0, float(self.np_random.uniform(0.3, 0.8)), 0
        return self._obs(), {"is_success": False}

    def _obs(self) -> dict:
        return {"state": np.array([self.x, self.g], np.float32)}

    def step(self, action):
        self.x += STEP * float(np.clip(np.asarray(action, np.float64)[0], -1, 1))
        self.t += 1
        success = abs(self.x - self.g) < TOL
        return self._obs(), float(success), success, self.t >= T and not success, {"is_success": success}


def controller(bias: float):
    """The proportional reach with a constant bias: state (2,) -> action (1,)."""
    def act(state: np.ndarray) -> np.ndarray:
        return np.array([np.clip(GAIN * (state[1] - state[0]) + bias, -1, 1)], np.float32)
    return act


class ChunkPolicy(BasePolicy):
    """Chunks of ``controller(bias)`` planned open loop on exactly predicted states, the
    committed prefix kept (as the scripted experts' chunk policy does)."""

    action_dim, n_obs_steps = 1, 1

    def __init__(self, bias: float, chunk_size: int = 8):
        self.act, self.chunk_size = controller(bias), chunk_size

    def reset(self, seed: int | None = None) -> None:
        """Stateless."""

    def infer(self, request) -> np.ndarray:
        s = np.asarray(request.state, np.float64).copy()
        prefix = request.committed_prefix
        out = []
        for a in (prefix if prefix is not None else [])[: self.chunk_size]:
            out.append(np.asarray(a, np.float32))
            s[0] += STEP * float(a[0])
        while len(out) < self.chunk_size:
            out.append(self.act(s))
            s[0] += STEP * float(out[-1][0])
        return np.stack(out).astype(np.float32)
