"""Replay of n-step transitions: a numpy ring buffer that samples torch batches.

A stored transition: state s_t (D,), base action b_t (m,), executed action a_t (m,),
n-step return R (sum of gamma^i r_{t+i}), bootstrap state s_{t+k} (D,) and its base action
b_{t+k} (m,), discount gamma^k (0 if the episode ended inside the k steps), and the
``source`` of a_t (SOURCES: the residual acting online, a demonstration, an intervention).
"""

from __future__ import annotations

import numpy as np
import torch

from arli.rl.transitions import RowLayout
from arli.types import ONLINE, TRANSITION_FIELDS, Transition

FIELDS = TRANSITION_FIELDS


class ReplayBuffer:
    """Fixed-capacity ring buffer of n-step transitions; samples torch batches.

    All fields of a transition sit in one float32 row (``rows`` (capacity, W)), and ``data``
    holds named column views of it, so a batch is one gather instead of one per field.
    """

    def __init__(self, capacity: int, state_dim: int, action_dim: int):
        self.capacity = capacity
        self.layout = RowLayout(state_dim, action_dim)
        self.columns = self.layout.columns
        self.rows = np.zeros((capacity, self.layout.width), np.float32)
        self.data = {k: self.rows[:, col] for k, col in self.columns.items()}
        self.size = 0
        self.cursor = 0

    def __len__(self) -> int:
        return self.size

    def add(self, transition: Transition | dict) -> None:
        """Store one n-step transition (``source`` defaults to ONLINE). A NaN/inf field
        rejects the whole transition before anything is written."""
        row = np.empty(self.rows.shape[1], np.float32)
        for key, col in self.columns.items():
            value = np.asarray(transition[key] if key != "source" or "source" in transition.keys()
                               else ONLINE, np.float32)
            if not np.all(np.isfinite(value)):
                raise ValueError(f"replay: transition field {key!r} has NaN/inf; not stored")
            row[col] = value
        self.rows[self.cursor] = row
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample_rows(self, batch: int, generator: torch.Generator) -> np.ndarray:
        """(batch, W) uniformly drawn rows."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(0, self.size, (batch,), generator=generator).numpy()
        return self.rows[idx]

    def fields(self, rows: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:
        """Named column views of a (B, W) batch."""
        rows = torch.from_numpy(rows) if isinstance(rows, np.ndarray) else rows
        return {k: rows[:, col] for k, col in self.columns.items()}

    def sample(self, batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return self.fields(self.sample_rows(batch, generator))

    def add_rows(self, rows: np.ndarray) -> int:
        """Append (N, W) rows in this buffer's layout (a batch from an actor); rows with a
        NaN/inf are skipped. Returns how many were stored."""
        rows = np.asarray(rows, np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.rows.shape[1]:
            raise ValueError(f"rows must have shape (N, {self.rows.shape[1]}), got {rows.shape}")
        rows = rows[np.all(np.isfinite(rows), axis=1)]
        for start in range(0, len(rows), self.capacity):
            part = rows[start:start + self.capacity]
            idx = (self.cursor + np.arange(len(part))) % self.capacity
            self.rows[idx] = part
            self.cursor = int((self.cursor + len(part)) % self.capacity)
            self.size = min(self.size + len(part), self.capacity)
        return len(rows)

    def row(self, transition: Transition | dict) -> np.ndarray:
        """One transition as a (W,) row of this layout."""
        return self.layout.row(transition)

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
    """Online rows then anchor rows (RLPD-style fixed ratio); ``is_anchor`` (B,) marks the
    anchor rows. Falls back to one source when the other is empty."""
    n_anchor = int(round(batch * anchor_ratio)) if len(anchor) else 0
    n_online = batch - n_anchor if len(online) else 0
    if n_online == 0 and len(anchor):
        n_anchor = batch
    parts = []
    if n_online:
        parts.append(online.sample_rows(n_online, generator))
    if n_anchor:
        parts.append(anchor.sample_rows(n_anchor, generator))
    out = online.fields(np.concatenate(parts) if len(parts) > 1 else parts[0])
    out["is_anchor"] = torch.cat([torch.zeros(n_online), torch.ones(n_anchor)])
    return out
