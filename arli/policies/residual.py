"""Residual actor and ensemble critic (small, CPU-friendly; run on the robot side).

Executed action: ``a_t = clip(b_t + scale * r_t, -1, 1)`` with ``r_t = tanh(actor(s_t))``
in [-1, 1]^m. The actor's last layer starts at zero, so the initial residual is exactly zero
and finetuning starts from the base policy. The critic is an ensemble of E LayerNorm MLPs
evaluated as one batched matmul per layer (no Python loop over heads).
Shapes: B batch, D state dim, m action dim, E heads.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


class ResidualActor(nn.Module):
    """s (B, D) -> r (B, m) in [-1, 1]."""

    def __init__(self, state_dim: int, action_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(state_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, action_dim))
        last = self.net[-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(state))


def compose_action(base: torch.Tensor | np.ndarray, residual, scale):
    """a = clip(b + scale * r, -1, 1) for tensors or arrays (..., m)."""
    if isinstance(base, torch.Tensor):
        return torch.clamp(base + scale * residual, -1.0, 1.0)
    return np.clip(base + scale * residual, -1.0, 1.0).astype(np.float32)


class EnsembleLinear(nn.Module):
    """E independent linear layers applied as one batched matmul: (E, B, i) -> (E, B, o)."""

    def __init__(self, heads: int, fan_in: int, fan_out: int):
        super().__init__()
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = nn.Parameter(torch.empty(heads, fan_in, fan_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(heads, 1, fan_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, heads: torch.Tensor | None = None) -> torch.Tensor:
        """``heads`` (k,): evaluate only these heads; x is then (k, B, i)."""
        if heads is None:
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.baddbmm(self.bias[heads], x, self.weight[heads])


class EnsembleCritic(nn.Module):
    """Q(s, a) for E heads: s (B, D), a (B, m) -> (E, B).

    Every head sees the same input, so the first layer of all heads is one (D + m, E * h)
    matmul; the second is a batched (E, h, h) matmul, the last a batched (E, h, 1) matmul. On
    a CPU this is several times faster than a loop over heads (``arli bench learner``).
    """

    def __init__(self, state_dim: int, action_dim: int, heads: int = 4, hidden: int = 256):
        super().__init__()
        self.heads, self.hidden = heads, hidden
        fan_in = state_dim + action_dim
        bound = 1.0 / math.sqrt(fan_in)
        self.w1 = nn.Parameter(torch.empty(fan_in, heads, hidden).uniform_(-bound, bound))
        self.b1 = nn.Parameter(torch.empty(heads, hidden).uniform_(-bound, bound))
        self.l2 = EnsembleLinear(heads, hidden, hidden)
        bound = 1.0 / math.sqrt(hidden)
        self.w3 = nn.Parameter(torch.empty(heads, 1, hidden).uniform_(-bound, bound))
        self.b3 = nn.Parameter(torch.empty(heads, 1).uniform_(-bound, bound))

    def head(self, e: int, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Head ``e`` alone, written plainly (the reference the batched path is tested against)."""
        x = torch.cat([state, action], dim=-1)
        h = torch.relu(nn.functional.layer_norm(x @ self.w1[:, e] + self.b1[e], (self.hidden,)))
        h = torch.relu(nn.functional.layer_norm(h @ self.l2.weight[e] + self.l2.bias[e], (self.hidden,)))
        return (h * self.w3[e]).sum(-1) + self.b3[e]

    def forward(self, state: torch.Tensor, action: torch.Tensor,
                heads: torch.Tensor | None = None) -> torch.Tensor:
        """-> (E, B), or (k, B) for the head indices ``heads`` (k,) (the TD target's subset)."""
        w1, b1, w3, b3 = self.w1, self.b1, self.w3, self.b3
        if heads is not None:
            w1, b1, w3, b3 = w1[:, heads], b1[heads], w3[heads], b3[heads]
        k = w1.shape[1]
        x = torch.cat([state, action], dim=-1)
        h = torch.addmm(b1.reshape(-1), x, w1.reshape(x.shape[-1], -1))  # (B, k * h)
        h = h.view(-1, k, self.hidden).transpose(0, 1).contiguous()  # (k, B, h); contiguous keeps
        # the elementwise ops (and their backward) on the fast path
        h = torch.relu(nn.functional.layer_norm(h, (self.hidden,)))
        h = torch.relu(nn.functional.layer_norm(self.l2(h, heads), (self.hidden,)))
        # last layer as a batched (B, h) @ (h, 1) per head: one kernel forward and two backward,
        # where (h * w3).sum(-1) + b3 issues three elementwise passes over (k, B, h) each way
        return torch.baddbmm(b3.unsqueeze(-1), h, w3.transpose(1, 2)).squeeze(-1)  # (k, B)


class NumpyResidualActor:
    """``ResidualActor``'s forward pass in numpy, for the robot's control loop: one state
    (D,) -> r (m,) in a few microseconds, no torch dispatch, same numbers (tested).

    ``arrays``: the torch actor's state dict as numpy (keys ``net.{0,1,3,5}.*``).
    """

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.load(arrays)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        def get(key: str, transpose: bool = False) -> np.ndarray:
            a = np.asarray(arrays[key], np.float32)
            return np.ascontiguousarray(a.T if transpose else a)

        self.w1, self.b1 = get("net.0.weight", True), get("net.0.bias")
        self.g, self.beta = get("net.1.weight"), get("net.1.bias")
        self.w2, self.b2 = get("net.3.weight", True), get("net.3.bias")
        self.w3, self.b3 = get("net.5.weight", True), get("net.5.bias")
        self.hidden = self.b1.shape[0]

    def __call__(self, state: np.ndarray) -> np.ndarray:
        """state (D,) -> r (m,); float32, in-place where it saves allocations."""
        h = np.dot(np.asarray(state, np.float32), self.w1)
        h += self.b1
        h -= h.mean()
        h *= self.g * np.float32(1.0 / math.sqrt(float(np.dot(h, h)) / self.hidden + 1e-5))  # LayerNorm
        h += self.beta
        np.maximum(h, 0.0, out=h)
        h = np.dot(h, self.w2)
        h += self.b2
        np.maximum(h, 0.0, out=h)
        out = np.dot(h, self.w3)
        out += self.b3
        return np.tanh(out, out=out)


class ResidualActing:
    """What the robot needs of the learner to act: ``act(state, base, explore)`` with the
    numpy actor, Gaussian exploration on r (AR(1)-correlated within an episode when
    ``cfg.exploration_corr`` > 0, as in the learner), a = clip(b + scale * r). ``cfg``:
    LearnerConfig.

    Exploration noise is drawn in blocks by ``prepare()``, which the runtime calls before the
    tick (``warm``), so a step's critical path holds no random-number generation; clipping
    uses ufuncs with ``out=`` (``np.clip``'s Python wrapper costs more than the clip)."""

    NOISE_BLOCK = 256  # steps of exploration noise drawn at once

    def __init__(self, cfg, arrays: dict[str, np.ndarray], action_dim: int, seed: int = 0):
        self.cfg, self.action_dim = cfg, action_dim
        self.actor = NumpyResidualActor(arrays)
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.scale = np.float32(cfg.residual_scale)
        self._noise = np.empty((0, action_dim), np.float32)
        self._next = 0
        self._last_noise: np.ndarray | None = None  # the exploration process's last value (m,)

    def begin_episode(self) -> None:
        """Restarts the exploration process (its correlation never spans two episodes)."""
        self._last_noise = None

    def prepare(self) -> None:
        """Draw the next block of exploration noise (NOISE_BLOCK, m) if this one is spent."""
        if self._next >= len(self._noise):
            self._noise = np.float32(self.cfg.exploration_std) * self.rng.standard_normal(
                (self.NOISE_BLOCK, self.action_dim), np.float32)
            self._next = 0

    def act(self, state: np.ndarray, base: np.ndarray, explore: bool) -> np.ndarray:
        """state (D,), base (m,) -> executed action (m,) in [-1, 1]."""
        r = self.actor(state)
        if explore:
            self.prepare()  # a no-op unless the runtime did not call it before the tick
            noise = self._noise[self._next]
            self._next += 1
            rho = self.cfg.exploration_corr
            if rho > 0:
                if self._last_noise is not None:  # stationary AR(1): marginal std unchanged
                    noise = np.float32(rho) * self._last_noise + np.float32(math.sqrt(1 - rho * rho)) * noise
                self._last_noise = noise
            r += noise
            _clip_unit(r)
        r *= self.scale
        r += base
        return _clip_unit(r)


def _clip_unit(x: np.ndarray) -> np.ndarray:
    """In-place clip of x to [-1, 1]."""
    np.minimum(x, 1.0, out=x)
    return np.maximum(x, -1.0, out=x)
