"""Inference endpoints the runtime sends chunk requests to.

Both answer the same three questions, so the runtime loop is identical in sim and on a
robot: what delay to expect for the next request, ``submit`` a request (never blocks) and
``poll`` the replies that have arrived by control step ``step``.

* ``SimInference``: the policy runs in-process at ``submit``; its reply is released
  ``d`` steps later, ``d`` drawn from a latency model (sim time, deterministic).
* ``arli.transport.inference_client.RemoteInference``: a ZeroMQ client of ``arli serve``;
  replies arrive when they arrive (wall clock) and their latency is measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from arli.latency import LatencyModel, to_delay_steps
from arli.policies.base import BasePolicy
from arli.types import ChunkRequest, Observation


@dataclass(frozen=True)
class ChunkReply:
    """A chunk (H, m) answering ``request_id``; ``meta`` carries timing (latency_s, ...).
    ``actions`` is None when the server answered with an error (``meta["error"]``)."""

    request_id: int
    actions: np.ndarray | None
    meta: dict = field(default_factory=dict)


class InferenceEndpoint(Protocol):
    chunk_size: int
    action_dim: int

    def begin_episode(self, seed: int) -> None: ...

    def next_delay(self) -> int:
        """Delay (steps) the scheduler should assume for the request about to be sent."""

    def submit(self, request: ChunkRequest, history: list[Observation]) -> bool:
        """Send a request (with ``n_obs_steps - 1`` earlier control steps); False if it could
        not be sent (no server connected)."""

    def poll(self, step: int) -> list[ChunkReply]:
        """Replies available before control step ``step`` runs."""

    def healthy(self) -> bool:
        """Whether a server is reachable (the runtime holds while it is not)."""


def frames(history: list[Observation]) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Observations -> (state, first image | None) pairs for ``BasePolicy.set_history``."""
    return [(o.state, next(iter(o.images.values()), None)) for o in history]


class SimInference:
    """The base policy in-process, its replies delayed by a latency model in sim time."""

    def __init__(self, policy: BasePolicy, latency: LatencyModel, rng: np.random.Generator, dt: float):
        self.policy, self.latency, self.rng, self.dt = policy, latency, rng, dt
        self.chunk_size, self.action_dim = policy.chunk_size, policy.action_dim
        self.n_obs_steps = int(getattr(policy, "n_obs_steps", 1))
        self._pending: list[tuple[int, ChunkReply]] = []
        self._next_delay: int | None = None

    def begin_episode(self, seed: int) -> None:
        self.policy.reset(seed)
        self._pending.clear()

    def next_delay(self) -> int:
        if self._next_delay is None:
            self._next_delay = to_delay_steps(self.latency.sample(self.rng), self.dt)
        return self._next_delay

    def submit(self, request: ChunkRequest, history: list[Observation]) -> bool:
        d = self.next_delay()
        self._next_delay = None
        if d != request.delay_steps:
            raise RuntimeError(f"request assumed delay {request.delay_steps}, the model drew {d}")
        obs = request.observation
        self.policy.set_history(frames(history))
        actions = self.policy.predict_actions(obs.state, request.committed_prefix, d,
                                              next(iter(obs.images.values()), None), request.guidance)
        self._pending.append((request.t0 + d, ChunkReply(request.request_id, actions,
                                                         {"latency_s": d * self.dt})))
        return True

    def poll(self, step: int) -> list[ChunkReply]:
        ready = [r for due, r in self._pending if due <= step]
        self._pending = [(due, r) for due, r in self._pending if due > step]
        return ready

    def healthy(self) -> bool:
        return True
