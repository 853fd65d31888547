"""Residual actor and ensemble critic (small, CPU-friendly; run on the robot side).

Executed action: ``a_t = clip(b_t + scale * r_t, -1, 1)`` with ``r_t = tanh(actor(s_t))``
in [-1, 1]^m. The actor's last layer starts at zero, so the initial residual is exactly zero
and finetuning starts from the base policy. The critic is an ensemble of E LayerNorm MLPs
evaluated as one batched matmul per layer (no Python loop over heads). The robot's numpy
forward pass and acting are in ``residual_np`` (no torch on the robot side).
Shapes: B batch, D state dim, m action dim, E heads.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from arli.policies.residual_np import compose_numpy


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
    return compose_numpy(base, residual, scale)


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

    @torch.no_grad()
    def candidates(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q of K candidate actions per state: state (B, D), actions (K, B, m) -> (E, K, B).

        The same function as ``forward`` on the state repeated K times, for scoring only (no
        gradient). The state's part of the first layer, (B, D) @ (D, E * h), is computed once and
        shared by the K candidates: with D >> m that is most of the first layer (value gating's
        acting, backup and selection score 8-9 candidates per state). The (E, K * B, h)
        activations are normalised and rectified in place by ``_norm_relu``."""
        K, B, m = actions.shape
        w1 = self.w1.flatten(1)  # (D + m, E * h)
        d = w1.shape[0] - m
        if state.shape != (B, d):
            raise ValueError(f"candidates: state {tuple(state.shape)} for actions {tuple(actions.shape)}; expected ({B}, {d})")
        shared = torch.addmm(self.b1.reshape(-1), state, w1[:d])  # (B, E * h)
        h = torch.matmul(actions, w1[d:]).add_(shared)  # (K, B, E * h)
        h = h.view(K * B, self.heads, self.hidden).transpose(0, 1).contiguous()  # (E, K * B, h)
        h = _norm_relu(torch.baddbmm(self.l2.bias, _norm_relu(h), self.l2.weight))
        return torch.baddbmm(self.b3.unsqueeze(-1), h, self.w3.transpose(1, 2)).view(self.heads, K, B)


def _norm_relu(h: torch.Tensor) -> torch.Tensor:
    """relu(layer_norm(h)) over the last axis, no affine parameters, in place on ``h`` (..., h)
    and without autograd: torch's CPU layer_norm kernel takes about 2.7x as long on the
    candidates' (E, K * B, 128) activations as these whole-tensor passes (the same function;
    the variance is summed in another order, so results differ in the last bits)."""
    h -= h.mean(-1, keepdim=True)
    var = h.square().mean(-1, keepdim=True)
    return h.mul_(var.add_(1e-5).rsqrt_()).relu_()
