"""Residual-policy state construction — the one place that turns the scheduler's per-step
information into the residual policy's state, for every variant of DESIGN.md §2.

Variants (same learner, same data, different state):

* ``arli``: decides every step from the fresh observation o_t (mid-inference while a
  request is in flight) + base action b_t + committed actions (K, m, zero-padded) and their
  validity mask (K,) + timing (steps since request, steps until switch, index in chunk, in
  flight, delay; scaled by H).
* ``arli_no_committed``: ``arli`` without the committed block and mask.
* ``arli_no_midobs``: ``arli`` with the request observation o_t0 of the latest request in
  place of the fresh observation.
* ``standard`` (latency-unaware RL): the correction travels with the base policy's
  inference. It is a function of what the request carried — o_t0 and the base chunk
  (H, m) it produced — and of the slot index, so the whole residual chunk is fixed at the
  request and lands with the base chunk; its slots run slot-aligned (stale ones skipped by
  the scheduler). Per-step credit: every executed slot is one transition whose state is the
  chunk's decision state + the slot; committed and discarded slots never execute, so they
  earn nothing.
* ``stepwise``: o_t + b_t every step (the latency-free residual; the zero-delay reference).

Every variant also sees the episode progress t / T (T = the episode's step limit): the time
limit ends failed episodes, and a critic that cannot see time cannot value that (Pardo et
al. 2018, "Time limits in RL"). ``standard`` sees the progress at its request step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arli.types import StepInfo

VARIANTS = ("arli", "arli_no_committed", "arli_no_midobs", "standard", "stepwise")
TIMING_FEATURES = 5


@dataclass(frozen=True)
class StateLayout:
    """Slices of the state vector (docs, tests, debugging); None = not in this variant."""

    obs: slice
    base_action: slice
    committed: slice | None
    mask: slice | None
    timing: slice | None
    chunk: slice | None
    slot: slice | None
    progress: slice
    dim: int


class StateBuilder:
    """Builds the residual state (D,) for one variant.

    Args:
        variant: one of VARIANTS.
        obs_dim: n; action_dim: m; chunk_size: H (timing scale, base-chunk length).
        episode_steps: T, the episode step limit (progress scale).
        committed_len: K, committed block length (default H).
        obs_mean, obs_std: (n,) normalisation of observations (identity by default).
    """

    def __init__(self, variant: str, obs_dim: int, action_dim: int, chunk_size: int,
                 episode_steps: int = 1000, committed_len: int | None = None,
                 obs_mean: np.ndarray | None = None, obs_std: np.ndarray | None = None) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
        if episode_steps < 1:
            raise ValueError(f"episode_steps must be >= 1, got {episode_steps}")
        self.variant, self.n, self.m, self.H, self.T = variant, obs_dim, action_dim, chunk_size, episode_steps
        self.K = committed_len or chunk_size
        self.mean = np.zeros(obs_dim, np.float32) if obs_mean is None else np.asarray(obs_mean, np.float32)
        self.std = np.ones(obs_dim, np.float32) if obs_std is None else np.asarray(obs_std, np.float32)
        self.layout = self._layout()

    def _layout(self) -> StateLayout:
        pos = 0

        def take(size: int) -> slice:
            nonlocal pos
            pos += size
            return slice(pos - size, pos)

        obs, base = take(self.n), take(self.m)
        committed = mask = timing = chunk = slot = None
        if self.variant.startswith("arli"):
            if self.variant != "arli_no_committed":
                committed, mask = take(self.K * self.m), take(self.K)
            timing = take(TIMING_FEATURES)
        elif self.variant == "standard":
            chunk, slot = take(self.H * self.m), take(2)  # slot index / H, holding flag
        progress = take(1)
        return StateLayout(obs, base, committed, mask, timing, chunk, slot, progress, pos)

    @property
    def dim(self) -> int:
        return self.layout.dim

    def _norm(self, obs: np.ndarray) -> np.ndarray:
        return (np.asarray(obs, np.float32) - self.mean) / self.std

    def chunk_states(self, info: StepInfo) -> np.ndarray:
        """``standard`` only: the states of the executing chunk's slots from this step's slot
        to its end, (H - index_in_chunk, D), each with its slot and its base action: what the
        whole residual chunk is decided from, at once."""
        if self.variant != "standard" or info.chunk_obs is None:
            raise ValueError("chunk_states: only for the standard variant while a chunk slot runs")
        lay, first = self.layout, self.build(np.zeros(self.n, np.float32), info)
        slots = range(info.index_in_chunk, self.H)
        out = np.repeat(first[None], len(slots), axis=0)
        for row, j in enumerate(slots):
            out[row, lay.base_action] = info.chunk_actions[j]
            out[row, lay.slot] = (j / self.H, 0.0)
        return out

    def build(self, obs: np.ndarray, info: StepInfo) -> np.ndarray:
        """obs (n,) fresh observation, info from ``ChunkScheduler.step``/``peek`` -> (D,)."""
        lay, v = self.layout, self.variant
        out = np.zeros(lay.dim, np.float32)
        out[lay.base_action] = info.base_action
        out[lay.progress] = info.step / self.T
        if v == "standard":
            if info.chunk_obs is not None:  # a chunk slot runs: its decision state + slot
                out[lay.obs] = self._norm(info.chunk_obs.state)
                out[lay.chunk] = info.chunk_actions.reshape(-1)
                out[lay.slot] = (info.index_in_chunk / self.H, 0.0)
                out[lay.progress] = info.chunk_obs.step / self.T
            else:  # holding: nothing was decided for this step
                out[lay.slot] = (0.0, 1.0)
            return out
        if v == "arli_no_midobs":
            if info.request_obs is not None:  # before the first request there is nothing
                out[lay.obs] = self._norm(info.request_obs.state)
        else:
            out[lay.obs] = self._norm(obs)
        if lay.committed is not None:
            out[lay.committed] = info.committed[: self.K].reshape(-1)
            out[lay.mask] = info.committed_mask[: self.K]
        if lay.timing is not None:
            out[lay.timing] = (info.steps_since_request / self.H, info.steps_until_switch / self.H,
                               info.index_in_chunk / self.H, float(info.in_flight),
                               info.delay_steps / self.H)
        return out
