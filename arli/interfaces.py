"""The interfaces the runtime loop is written against, at the bottom of the layers (they
import only ``arli.types``): an inference endpoint, a step controller, a residual policy.

The optional hooks are declared here with do-nothing defaults, so the loop and the recorder
call them directly instead of looking for them.
Shapes: D residual state dim, m action dim.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from arli.types import ChunkReply, ChunkRequest, Decision, Observation, StepInfo


@runtime_checkable
class InferenceEndpoint(Protocol):
    """Where chunk requests go: in-process (``SimInference``), over ZeroMQ (``RemoteInference``)
    or to an openpi policy server (``OpenPIInference``).

    n_obs_steps: observations per request the policy needs (the runtime keeps the
    ``n_obs_steps - 1`` control steps before each request as its history).
    """

    chunk_size: int
    action_dim: int
    n_obs_steps: int

    def begin_episode(self, seed: int) -> None: ...

    def next_delay(self) -> int:
        """Delay (steps) the scheduler should plan the request about to be sent for."""

    def submit(self, request: ChunkRequest, history: list[Observation]) -> bool:
        """Send a request (with ``n_obs_steps - 1`` earlier control steps); False if it could
        not be sent (no server connected)."""

    def poll(self, step: int) -> list[ChunkReply]:
        """Replies available before control step ``step`` runs."""

    def healthy(self) -> bool:
        """Whether a server is reachable (the runtime holds while it is not)."""

    def drain(self, timeout_s: float = 0.0) -> None:
        """Receive what arrives within ``timeout_s`` (the clock calls it while waiting for a tick)."""


class StepController:
    """Decides the executed action and sees the outcome of every step.

    The default executes the base action; the residual (``arli.runtime.acting``) and the
    recorders override ``act`` and see outcomes in ``after_step`` / ``end``.
    ``last_decision``: what the latest ``act`` decided, for a recorder wrapped around it
    (None for a controller that only executes the base action).
    """

    last_decision: Decision | None = None

    def begin_episode(self) -> None:
        """A new episode starts (called before its first step)."""

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        return info.base_action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        """Outcome of the action chosen by ``act`` at step t."""

    def end(self, obs: Observation, info: StepInfo, terminated: bool, truncated: bool) -> None:
        """Episode over: the final observation and what the scheduler would do next."""

    def warm(self) -> None:
        """Before the tick, off the step's critical path (new weights in, caches warmed)."""


class ResidualPolicy(Protocol):
    """What acting needs of a residual: the learner (torch) in process, ``ResidualActing``
    (numpy) on a robot. ``act``: state (D,), base action (m,) -> executed action (m,)."""

    action_dim: int

    def act(self, state: np.ndarray, base: np.ndarray, explore: bool) -> np.ndarray: ...

    def begin_episode(self) -> None:
        """Restarts the exploration process (its correlation never spans two episodes)."""
