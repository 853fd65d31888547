"""Inference endpoints the runtime sends chunk requests to.

Both answer the same questions, so the runtime loop is identical in sim and on a robot:
what delay to plan the next request for, ``submit`` a request (never blocks) and ``poll``
the replies that have arrived by control step ``step`` (``arli.interfaces.InferenceEndpoint``).

* ``SimInference``: the policy runs in-process at ``submit``; its reply is released
  ``d`` steps later, ``d`` drawn from a latency model (sim time, deterministic).
* ``arli.transport.inference_client.RemoteInference``: a ZeroMQ client of ``arli serve``;
  replies arrive when they arrive (wall clock) and their latency is measured.
"""

from __future__ import annotations

import time

import numpy as np

from arli.latency import LatencyModel, to_delay_steps
from arli.policies.base import BasePolicy
from arli.types import ChunkReply, ChunkRequest, Observation


class SimInference:
    """The base policy in-process, its replies delayed by a latency model in sim time."""

    def __init__(self, policy: BasePolicy, latency: LatencyModel, rng: np.random.Generator, dt: float):
        self.policy, self.latency, self.rng, self.dt = policy, latency, rng, dt
        self.chunk_size, self.action_dim = policy.chunk_size, policy.action_dim
        self.n_obs_steps = int(policy.n_obs_steps)
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
        actions = self.policy.infer(request.policy_request(history))
        self._pending.append((request.t0 + d, ChunkReply(request.request_id, actions,
                                                         {"latency_s": d * self.dt})))
        return True

    def poll(self, step: int) -> list[ChunkReply]:
        ready = [r for due, r in self._pending if due <= step]
        self._pending = [(due, r) for due, r in self._pending if due > step]
        return ready

    def healthy(self) -> bool:
        return True

    def drain(self, timeout_s: float = 0.0) -> None:
        """Nothing arrives from outside: a real-time clock waiting on this endpoint sleeps."""
        if timeout_s > 0:
            time.sleep(timeout_s)
