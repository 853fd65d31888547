"""Replay of n-step transitions (numpy ring buffer) and the n-step accumulator.

A stored transition: state s_t (D,), base action b_t (m,), executed action a_t (m,),
n-step return R (sum of gamma^i r_{t+i}), bootstrap state s_{t+k} (D,) and its base action
b_{t+k} (m,), and discount gamma^k (0 if the episode terminated inside the k steps).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

FIELDS = ("state", "base", "action", "ret", "next_state", "next_base", "discount")


class NStepAccumulator:
    """Turns per-step transitions of one episode into n-step transitions."""

    def __init__(self, n: int, gamma: float):
        if n < 1 or not 0 < gamma <= 1:
            raise ValueError(f"n_step must be >= 1 and gamma in (0, 1], got n={n}, gamma={gamma}")
        self.n, self.gamma = n, gamma
        self._window: deque = deque()

    def push(self, state, base, action, reward: float, next_state, next_base,
             terminated: bool, truncated: bool, tag: str = "") -> list[dict]:
        """Add step t; returns the n-step transitions that are complete now (each keeps the
        ``tag`` of its first step, e.g. whether an intervener chose that action)."""
        self._window.append((state, base, action, float(reward), tag))
        out: list[dict] = []
        if terminated or truncated:
            while self._window:  # flush: shorter returns, bootstrap only if not terminated
                out.append(self._emit(next_state, next_base, terminated))
        elif len(self._window) == self.n:
            out.append(self._emit(next_state, next_base, False))
        return out

    def _emit(self, next_state, next_base, terminated: bool) -> dict:
        k = len(self._window)
        ret = sum(self.gamma**i * step[3] for i, step in enumerate(self._window))
        state, base, action, _, tag = self._window.popleft()
        return {"state": state, "base": base, "action": action, "ret": ret,
                "next_state": next_state, "next_base": next_base,
                "discount": 0.0 if terminated else self.gamma**k, "tag": tag}

    def reset(self) -> None:
        self._window.clear()


class ReplayBuffer:
    """Fixed-capacity ring buffer of n-step transitions; samples torch batches."""

    def __init__(self, capacity: int, state_dim: int, action_dim: int):
        self.capacity = capacity
        shapes = {"state": (state_dim,), "base": (action_dim,), "action": (action_dim,), "ret": (),
                  "next_state": (state_dim,), "next_base": (action_dim,), "discount": ()}
        self.data = {k: np.zeros((capacity, *shape), np.float32) for k, shape in shapes.items()}
        self.size = 0
        self.cursor = 0

    def __len__(self) -> int:
        return self.size

    def add(self, transition: dict) -> None:
        for key in FIELDS:
            value = np.asarray(transition[key], np.float32)
            if not np.all(np.isfinite(value)):
                raise ValueError(f"replay: transition field {key!r} has NaN/inf; not stored")
            self.data[key][self.cursor] = value
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(0, self.size, (batch,), generator=generator).numpy()
        return {k: torch.from_numpy(v[idx]) for k, v in self.data.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**{f"data.{k}": v[: self.size] for k, v in self.data.items()},
                "meta": np.array([self.size, self.cursor, self.capacity])}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        size, cursor, capacity = (int(x) for x in state["meta"])
        if capacity != self.capacity:
            raise ValueError(f"replay capacity {self.capacity} != checkpoint's {capacity}")
        for k in self.data:
            self.data[k][:size] = state[f"data.{k}"]
        self.size, self.cursor = size, cursor


def mixed_batch(online: ReplayBuffer, anchor: ReplayBuffer, batch: int, anchor_ratio: float,
                generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Concatenate online and anchor samples; ``is_anchor`` (B,) marks the anchor rows."""
    n_anchor = int(round(batch * anchor_ratio)) if len(anchor) else 0
    n_online = batch - n_anchor if len(online) else 0
    if n_online == 0 and len(anchor):
        n_anchor = batch
    parts, flags = [], []
    if n_online:
        parts.append(online.sample(n_online, generator))
        flags.append(torch.zeros(n_online))
    if n_anchor:
        parts.append(anchor.sample(n_anchor, generator))
        flags.append(torch.ones(n_anchor))
    out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out["is_anchor"] = torch.cat(flags)
    return out
