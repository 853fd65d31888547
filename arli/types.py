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
    """

    request_id: int
    t0: int
    observation: Observation
    delay_steps: int
    committed_prefix: np.ndarray | None
    guidance: np.ndarray | None = None


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
    planned_obs: observation the in-flight chunk was planned from (None if none in flight).
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
    planned_obs: Observation | None = None
    request_obs: Observation | None = None
    chunk_obs: Observation | None = None
    chunk_actions: np.ndarray | None = None


TRANSITION_FIELDS = ("state", "base", "action", "ret", "next_state", "next_base", "discount", "source")


@dataclass(frozen=True)
class Transition:
    """One n-step transition, as stored in replay and sent from actor to learner.

    state, next_state: (D,) ARLI states s_t, s_{t+k}; base, next_base: (m,) base actions
    b_t, b_{t+k}; action: (m,) executed a_t; ret: sum_i gamma^i r_{t+i} over k <= n steps;
    discount: gamma^k, 0 when the episode ended inside them; source: who chose a_t
    (``arli.rl.replay.SOURCES`` index). Reads like a mapping (``tr["ret"]``, ``{**tr}``).
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
