"""The scripted expert as a chunk policy (open-loop chunks planned on predicted states).

Lives on the ``arli`` side so that ``sim_envs`` never imports ``arli`` (dependencies point
one way: the method uses the tasks, the tasks know nothing of the method).
"""

from __future__ import annotations

import numpy as np

from arli.policies.base import BasePolicy
from arli.types import PolicyRequest
from sim_envs.experts import EXPERTS, predict_state


class ExpertChunkPolicy(BasePolicy):
    """Chunk policy that plans H actions open-loop by rolling the expert on predicted states.

    With a committed prefix (RTC) it plans from the state predicted after the prefix and
    returns the prefix in slots 0..d-1, so the chunk is consistent with what executes.
    """

    def __init__(self, task: str, chunk_size: int, action_dim: int = 5):
        if task not in EXPERTS:
            raise ValueError(f"no scripted expert for task {task!r}; choose from {sorted(EXPERTS)}")
        self.task, self.chunk_size, self.action_dim = task, chunk_size, action_dim
        self.expert = EXPERTS[task]

    def reset(self, seed: int | None = None) -> None:
        """Stateless."""

    def infer(self, request: PolicyRequest) -> np.ndarray:
        """request (state (n,), committed prefix) -> actions (H, 5); cameras are not used."""
        s = np.asarray(request.state, dtype=np.float64)
        prefix = request.committed_prefix
        out = []
        for a in (prefix if prefix is not None else [])[: self.chunk_size]:
            out.append(np.asarray(a, np.float32))
            s = predict_state(self.task, s, a)
        while len(out) < self.chunk_size:
            a = self.expert(s)
            out.append(a)
            s = predict_state(self.task, s, a)
        return np.stack(out).astype(np.float32)
