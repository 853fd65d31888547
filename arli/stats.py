"""Intervals for success rates measured over training seeds x evaluation episodes.

A cell is measured as outcomes (S, N): S training seeds, each evaluated on the same N test
episodes (the same episode seeds for every seed and every policy compared). The 95% interval
is a two-level bootstrap: resample the training seeds, then the episodes, so both sources of
variance count. A comparison of two policies on the same episodes is paired: the same
resampled episode indices are used for both, so what the seeds share cancels.
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_SAMPLES = 4000


def _as_matrix(outcomes) -> np.ndarray:
    x = np.asarray(outcomes, dtype=np.float64)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"outcomes must be (seeds, episodes), got shape {x.shape}")
    return x


def _resampled_means(diff: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """Means of ``samples`` two-level bootstrap resamples of ``diff`` (S, N)."""
    rng = np.random.default_rng(seed)
    S, N = diff.shape
    out = np.empty(samples)
    for start in range(0, samples, 256):  # blocks of resamples keep memory at (256, S, N)
        k = min(256, samples - start)
        seeds = rng.integers(0, S, (k, S))
        # one resampled episode set per resample, shared by its seeds: the episodes are common
        episodes = rng.integers(0, N, (k, 1, N)).repeat(S, axis=1)
        out[start:start + k] = np.take_along_axis(diff[seeds], episodes, axis=2).mean(axis=(1, 2))
    return out


def success_ci(outcomes, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """95% interval of the mean success of ``outcomes`` (S, N) in {0, 1}."""
    x = _as_matrix(outcomes)
    means = _resampled_means(x, samples, seed)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def gain_ci(after, before, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
            level: float = 0.95) -> tuple[float, float]:
    """95% interval of mean(after) - mean(before), paired: (S, N) outcomes of two policies on
    the same training seeds and test episodes (``before`` may be (1, N) or (N,): one policy
    that does not depend on the training seed, such as the base alone)."""
    a, b = _as_matrix(after), _as_matrix(before)
    if b.shape[0] == 1 and a.shape[0] > 1:
        b = np.repeat(b, a.shape[0], axis=0)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes must have the same (seeds, episodes), got {a.shape} and {b.shape}")
    means = _resampled_means(a - b, samples, seed)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def verdict(ci: tuple[float, float], threshold: float = 0.0) -> str:
    """'above' when the whole interval is above ``threshold``, 'below' when it is below,
    'unresolved' when it straddles it."""
    lo, hi = ci
    return "above" if lo > threshold else "below" if hi < threshold else "unresolved"
