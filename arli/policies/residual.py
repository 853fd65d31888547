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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleCritic(nn.Module):
    """Q(s, a) for E heads: s (B, D), a (B, m) -> (E, B)."""

    def __init__(self, state_dim: int, action_dim: int, heads: int = 4, hidden: int = 256):
        super().__init__()
        self.heads = heads
        self.l1 = EnsembleLinear(heads, state_dim + action_dim, hidden)
        self.l2 = EnsembleLinear(heads, hidden, hidden)
        self.l3 = EnsembleLinear(heads, hidden, 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([state, action], dim=-1).unsqueeze(0).expand(self.heads, -1, -1)
        h = torch.relu(nn.functional.layer_norm(self.l1(x), (self.l1.weight.shape[-1],)))
        h = torch.relu(nn.functional.layer_norm(self.l2(h), (self.l2.weight.shape[-1],)))
        return self.l3(h).squeeze(-1)
