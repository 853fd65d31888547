"""ARLI state construction — the one place that turns the scheduler's per-step information
into the residual policy's state (DESIGN.md §2).

Variants (same learner, different state):
* ``arli``: fresh observation o_t + base action b_t + committed actions (K, m, zero-padded)
  + validity mask (K,) + timing (steps since request, steps until switch, index in chunk,
  in flight; scaled by H) [+ the observation the in-flight chunk was planned from].
* ``arli_no_committed``: ``arli`` without the committed block and mask.
* ``arli_no_midobs``: ``arli`` with the stale request observation o_t0 (what the big policy
  saw) in place of the fresh observation.
* ``standard``: o_t + b_t (a latency-unaware residual).

Decision modes:
* ``step``: one state per control step (``StateBuilder.build``).
* ``chunk``: one decision per chunk switch from an observation taken ``m`` steps into the
  inference window plus the actions committed after it (``ChunkDecision``); only slots that
  actually execute earn credit (``split_slots``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arli.types import StepInfo

VARIANTS = ("arli", "standard", "arli_no_committed", "arli_no_midobs")
DECISION_MODES = ("step", "chunk")


@dataclass(frozen=True)
class StateLayout:
    """Slices of the augmented state vector (for docs, tests and debugging)."""

    obs: slice
    base_action: slice
    committed: slice | None
    mask: slice | None
    timing: slice | None
    planned_obs: slice | None
    dim: int


class StateBuilder:
    """Builds the residual state (D,) for one variant.

    Args:
        variant: one of VARIANTS.
        obs_dim: n; action_dim: m; chunk_size: H (timing scale).
        committed_len: K, committed block length (default H).
        include_planned_obs: append o_t0 (zeros when nothing is in flight) to ``arli``.
        obs_mean, obs_std: (n,) normalisation of observations (identity by default).
    """

    def __init__(self, variant: str, obs_dim: int, action_dim: int, chunk_size: int,
                 committed_len: int | None = None, include_planned_obs: bool = False,
                 obs_mean: np.ndarray | None = None, obs_std: np.ndarray | None = None) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"state variant must be one of {VARIANTS}, got {variant!r}")
        self.variant, self.n, self.m, self.H = variant, obs_dim, action_dim, chunk_size
        self.K = committed_len or chunk_size
        self.planned = include_planned_obs and variant != "standard"
        self.mean = np.zeros(obs_dim, np.float32) if obs_mean is None else np.asarray(obs_mean, np.float32)
        self.std = np.ones(obs_dim, np.float32) if obs_std is None else np.asarray(obs_std, np.float32)
        self.layout = self._layout()

    def _layout(self) -> StateLayout:
        pos = 0

        def take(size: int) -> slice:
            nonlocal pos
            out = slice(pos, pos + size)
            pos += size
            return out

        obs, base = take(self.n), take(self.m)
        committed = mask = timing = planned = None
        if self.variant != "standard":
            if self.variant != "arli_no_committed":
                committed, mask = take(self.K * self.m), take(self.K)
            timing = take(4)
            if self.planned:
                planned = take(self.n + 1)
        return StateLayout(obs, base, committed, mask, timing, planned, pos)

    @property
    def dim(self) -> int:
        return self.layout.dim

    def _norm(self, obs: np.ndarray) -> np.ndarray:
        return (np.asarray(obs, np.float32) - self.mean) / self.std

    def build(self, obs: np.ndarray, info: StepInfo) -> np.ndarray:
        """obs (n,) fresh observation, info from ``ChunkScheduler.step`` -> (D,).

        ``arli_no_midobs`` uses ``info.request_obs`` (o_t0 of the latest request) instead of obs.
        """
        lay = self.layout
        out = np.zeros(lay.dim, np.float32)
        if self.variant == "arli_no_midobs":
            if info.request_obs is not None:  # before the first request there is nothing
                out[lay.obs] = self._norm(info.request_obs.state)
        else:
            out[lay.obs] = self._norm(obs)
        out[lay.base_action] = info.base_action
        if lay.committed is not None:
            out[lay.committed] = info.committed[: self.K].reshape(-1)
            out[lay.mask] = info.committed_mask[: self.K]
        if lay.timing is not None:
            out[lay.timing] = (info.steps_since_request / self.H, info.steps_until_switch / self.H,
                               info.index_in_chunk / self.H, float(info.in_flight))
        if lay.planned_obs is not None and info.planned_obs is not None:
            out[lay.planned_obs] = np.append(self._norm(info.planned_obs.state), 1.0)
        return out


# -- chunk decision mode --------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkDecision:
    """State of one chunk-level residual decision.

    obs: (n,) observation taken ``m`` steps into the inference window (step t0 + m);
    committed: (K, m) actions committed after that observation (steps t0+m .. switch-1);
    committed_mask: (K,); chunk: (H, m) the new base chunk the residual corrects.
    """

    obs: np.ndarray
    committed: np.ndarray
    committed_mask: np.ndarray
    chunk: np.ndarray

    def vector(self) -> np.ndarray:
        """Flattened decision state (n + K*m + K + H*m,)."""
        return np.concatenate([self.obs, self.committed.ravel(), self.committed_mask.astype(np.float32),
                               self.chunk.ravel()]).astype(np.float32)


def chunk_decision(obs: np.ndarray, info: StepInfo, chunk: np.ndarray) -> ChunkDecision:
    """Decision state for correcting ``chunk`` (H, m), from the observation ``obs`` taken at
    ``info.step`` (t0 + m, inside the inference window) and the actions committed after it."""
    if not info.in_flight:
        raise ValueError(f"chunk decisions are taken inside an inference window; step {info.step} has "
                         "no request in flight")
    return ChunkDecision(np.asarray(obs, np.float32), info.committed.copy(),
                         info.committed_mask.copy(), np.asarray(chunk, np.float32))


def split_slots(switch_in: int, switch_out: int, chunk_start: int, chunk_size: int) -> dict[str, range]:
    """Which slots of a corrected chunk committed / executed / were discarded.

    The chunk's slot i belongs to step ``chunk_start + i``; it ran from step ``switch_in``
    (it landed) to ``switch_out`` (the next chunk landed, exclusive). Slots before
    ``switch_in`` were committed to the previous chunk; executed slots earn reward and
    gradient; later slots were discarded at the next switch and earn neither.
    """
    first = max(0, switch_in - chunk_start)
    last = min(chunk_size, max(first, switch_out - chunk_start))
    return {"committed": range(0, first), "executed": range(first, last),
            "discarded": range(last, chunk_size)}
