"""Inference endpoints the runtime sends chunk requests to.

Both answer the same questions, so the runtime loop is identical in sim and on a robot:
what delay to plan the next request for, ``submit`` a request (never blocks) and ``poll``
the replies that have arrived by control step ``step`` (``arli.interfaces.InferenceEndpoint``).

* ``SimInference``: the policy runs in-process at ``submit``; its reply is released
  ``d`` steps later, ``d`` drawn from a latency model at that moment (sim time,
  deterministic). Like the real client it plans each request from the latencies it has
  measured, never from the one the request is about to take.
* ``arli.transport.inference_client.RemoteInference``: a ZeroMQ client of ``arli serve``;
  replies arrive when they arrive (wall clock) and their latency is measured.
"""

from __future__ import annotations

import time

import numpy as np

from arli.latency import LatencyModel, MeasuredLatency, to_delay_steps
from arli.policies.base import BasePolicy
from arli.types import ChunkReply, ChunkRequest, Observation


class SimInference:
    """The base policy in-process, its replies delayed by a latency model in sim time.

    ``next_delay`` is what ``RemoteInference`` plans with: ``initial_delay_steps`` until a
    reply has landed, then the ``quantile`` of the last 50 latencies, here never above
    ``initial_delay_steps`` (default: the model's maximum; ``sim_episode`` passes the
    scheduler's bound, beyond which a reply is a spike). The delay a request really takes is
    drawn when it is sent.
    """

    def __init__(self, policy: BasePolicy, latency: LatencyModel, rng: np.random.Generator, dt: float,
                 initial_delay_steps: int | None = None, quantile: float = 0.9):
        self.policy, self.latency, self.rng, self.dt, self.quantile = policy, latency, rng, dt, quantile
        self.chunk_size, self.action_dim = policy.chunk_size, policy.action_dim
        self.n_obs_steps = int(policy.n_obs_steps)
        self.initial_delay_steps = (to_delay_steps(latency.max_latency(), dt) if initial_delay_steps is None
                                    else initial_delay_steps)
        self._planner = MeasuredLatency(dt, self.initial_delay_steps, quantile, cap_steps=self.initial_delay_steps)
        self._pending: list[tuple[int, ChunkReply]] = []

    def begin_episode(self, seed: int) -> None:
        self.policy.reset(seed)
        self._pending.clear()

    def next_delay(self) -> int:
        return self._planner.next_delay()

    def submit(self, request: ChunkRequest, history: list[Observation]) -> bool:
        latency_s = self.latency.sample(self.rng)
        d = to_delay_steps(latency_s, self.dt)
        actions = self.policy.infer(request.policy_request(history))
        self._pending.append((request.t0 + d, ChunkReply(request.request_id, actions, {"latency_s": d * self.dt})))
        self._planner.add(latency_s)
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
