"""Timestamped records exchanged between the runtime, the scheduler and the policies.

Shapes: ``n`` = state dim, ``m`` = action dim, ``H`` = chunk_size, ``K`` = committed
block length (fixed, padded, with a validity mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Observation:
    """One observation captured at control step ``step``.

    state: (n,) float32; images: name -> (h, w, 3) uint8; timestamp: seconds (sim or wall).
    """

    state: np.ndarray
    step: int
    timestamp: float = 0.0
    images: dict[str, np.ndarray] = field(default_factory=dict)
    instruction: str = ""


@dataclass(frozen=True)
class ChunkRequest:
    """A request for the next chunk, sent at step ``t0`` with observation ``o_t0``.

    committed_prefix: (d, m) actions that execute during the inference window
    (steps t0 .. t0+d-1), given to RTC-capable policies; None for other strategies.
    delay_steps: the delay the scheduler expects (exact in sim time, an estimate on a robot).
    guidance: (L, m) what the previous chunk planned for steps t0 .. t0+L-1 over the overlap
    (L <= H - s, its first d rows are the committed prefix): RTC's soft-masked target.
    execute_horizon: the scheduler's s (RTC's soft mask spans it).
    """

    request_id: int
    t0: int
    observation: Observation
    delay_steps: int
    committed_prefix: np.ndarray | None
    guidance: np.ndarray | None = None
    execute_horizon: int | None = None

    def policy_request(self, history: tuple[Observation, ...] | list[Observation] = ()) -> "PolicyRequest":
        """What the base policy is asked (the wire carries the same fields)."""
        return PolicyRequest(self.observation, self.committed_prefix, self.delay_steps, self.guidance,
                             self.execute_horizon, tuple(history))


@dataclass(frozen=True)
class PolicyRequest:
    """One call of a base policy (``BasePolicy.infer``), in the spirit of openpi's ``infer``.

    observation: the request observation o_t0: state (n,), every camera by name
    (``images[name]`` (h, w, 3) uint8, ``observation.images.<name>`` in LeRobot's layout)
    and the task ``instruction``.
    committed_prefix: (d, m) actions that execute during inference; they fill slots 0..d-1.
    delay_steps: d (defaults to len(committed_prefix) when None).
    guidance: (L, m) the previous chunk over the overlap (RTC-capable policies only).
    execute_horizon: the scheduler's s, for RTC's soft mask (None: the policy's own).
    history: the ``n_obs_steps - 1`` control steps before the request, oldest first
    (consecutive control steps, not consecutive requests); the runtime always sends it, empty
    at an episode's first step. None: the caller keeps no history (a history-based policy
    then queues its own requests, as LeRobot's ``select_action`` does).
    """

    observation: Observation
    committed_prefix: np.ndarray | None = None
    delay_steps: int | None = None
    guidance: np.ndarray | None = None
    execute_horizon: int | None = None
    history: tuple[Observation, ...] | None = None

    @classmethod
    def of(cls, state: np.ndarray, images: dict[str, np.ndarray] | None = None, instruction: str = "",
           **fields: Any) -> "PolicyRequest":
        """A request from a bare state (n,) (and cameras), as tests and scripts build one."""
        return cls(Observation(np.asarray(state, np.float32), 0, images=dict(images or {}),
                               instruction=instruction), **fields)

    @property
    def state(self) -> np.ndarray:
        return self.observation.state

    @property
    def images(self) -> dict[str, np.ndarray]:
        return self.observation.images

    @property
    def instruction(self) -> str:
        return self.observation.instruction

    @property
    def delay(self) -> int:
        """d: ``delay_steps``, or the committed prefix's length when it is not given."""
        if self.delay_steps is not None:
            return int(self.delay_steps)
        return 0 if self.committed_prefix is None else len(self.committed_prefix)


@dataclass(frozen=True)
class ChunkReply:
    """A chunk (H, m) answering ``request_id``; ``meta`` carries timing (latency_s, ...).
    ``actions`` is None when the server answered with an error (``meta["error"]``)."""

    request_id: int
    actions: np.ndarray | None
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ActionChunk:
    """H actions; slot i is meant for control step ``start_step + i``.

    actions: (H, m) float32. ``start_step`` is t0 for asynchronous execution (the robot
    keeps moving while the chunk is computed) and t0 + d for synchronous execution.
    meta: timing and provenance (inference_s, server timestamps, policy name, ...).
    observation: the request observation o_t0 the chunk was planned from.
    """

    actions: np.ndarray
    request_id: int
    t0: int
    start_step: int
    meta: dict[str, Any] = field(default_factory=dict)
    observation: Observation | None = None

    @property
    def chunk_size(self) -> int:
        return int(self.actions.shape[0])

    def slot_for(self, step: int) -> int:
        """Chunk slot scheduled for ``step`` (may be out of range: caller checks)."""
        return step - self.start_step


@dataclass(frozen=True)
class StepInfo:
    """Everything the scheduler knows at control step ``step`` (what ARLI augments with).

    base_action: (m,) action the base policy scheduled for this step (hold action if starved).
    committed: (K, m) actions fixed for steps step+1 .. step+K, zero-padded.
    committed_mask: (K,) bool, True where ``committed`` holds a real action.
    steps_since_request: steps since the latest request was sent (-1 before the first).
    steps_until_switch: steps until the in-flight chunk lands (-1 if none in flight).
    index_in_chunk: slot of ``base_action`` in its chunk (-1 when holding).
    request_obs: observation of the latest request (o_t0), in flight or landed.
    chunk_obs: observation the executing chunk was planned from (None when holding).
    chunk_actions: (H, m) the executing chunk (None when holding).
    starved: True when the hold action ran because no chunk slot covers this step (waiting
    for the first chunk, the sync inference window, or the active chunk ran out).
    """

    step: int
    base_action: np.ndarray
    committed: np.ndarray
    committed_mask: np.ndarray
    steps_since_request: int
    steps_until_switch: int
    index_in_chunk: int
    chunk_id: int
    in_flight: bool
    delay_steps: int
    starved: bool
    request_obs: Observation | None = None
    chunk_obs: Observation | None = None
    chunk_actions: np.ndarray | None = None


SOURCES = ("online", "demo", "intervention")  # who chose an executed action
ONLINE, DEMO, INTERVENTION = range(3)


@dataclass(frozen=True)
class Decision:
    """What acting chose at control step ``step`` (``arli.runtime.acting``).

    state: (D,) the residual's ARLI state s_t; base: (m,) b_t; proposed: (m,) the residual's
    own action; action: (m,) what executes (the intervener's when it took over); source:
    ``SOURCES`` index of who chose ``action``; events: the intervention device's events.
    """

    step: int
    state: np.ndarray
    base: np.ndarray
    proposed: np.ndarray
    action: np.ndarray
    source: int = ONLINE
    events: tuple = ()

    @property
    def intervened(self) -> bool:
        return self.source != ONLINE

    def record(self, reward: float) -> "StepRecord":
        return StepRecord(self.state, self.base, self.action, float(reward), self.source)


@dataclass(frozen=True)
class StepRecord:
    """One executed step, what the n-step component builds transitions from: s_t (D,),
    b_t (m,), a_t (m,), r_t and who chose a_t (``SOURCES`` index)."""

    state: np.ndarray
    base: np.ndarray
    action: np.ndarray
    reward: float
    source: int = ONLINE


TRANSITION_FIELDS = ("state", "base", "action", "ret", "next_state", "next_base", "discount", "source")


@dataclass(frozen=True)
class Transition:
    """One n-step transition, as stored in replay and sent from actor to learner.

    state, next_state: (D,) ARLI states s_t, s_{t+k}; base, next_base: (m,) base actions
    b_t, b_{t+k}; action: (m,) executed a_t; ret: sum_i gamma^i r_{t+i} over k <= n steps;
    discount: gamma^k, 0 when the episode ended inside them; source: who chose a_t
    (``SOURCES`` index). Reads like a mapping (``tr["ret"]``, ``{**tr}``).
    """

    state: np.ndarray
    base: np.ndarray
    action: np.ndarray
    ret: float
    next_state: np.ndarray
    next_base: np.ndarray
    discount: float
    source: int = 0

    def keys(self) -> tuple[str, ...]:
        return TRANSITION_FIELDS

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)
