"""Inference-latency models in sim time: each request draws a latency (s) -> delay_steps.

``delay_steps = ceil(latency / dt)`` (a chunk that arrives mid-step is usable from the next
step). All models are seeded through the generator passed to ``sample``. ``MeasuredLatency``
is the other side: the latencies an endpoint measured and the delay it plans from them.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from arli.errors import require

_EPS = 1e-9  # so 0.2 s / 0.05 s is 4 steps, not 5 from float round-off


def to_delay_steps(latency_s: float, dt: float) -> int:
    """Control steps a reply of ``latency_s`` seconds occupies at period ``dt``."""
    if latency_s < 0 or not math.isfinite(latency_s):
        raise ValueError(f"latency must be finite and >= 0, got {latency_s}")
    return int(math.ceil(latency_s / dt - _EPS))


class MeasuredLatency:
    """The latencies an inference endpoint measured, and the delay it plans the next request for.

    ``next_delay``: ``initial_delay_steps`` until a latency has been added, then the
    ``quantile`` of the last ``window`` latencies in steps, at most ``cap_steps`` when given.
    A robot cannot know the latency of the request it is about to send, so it plans from
    the ones it has seen. ``latencies`` (s) and ``records`` (one dict per reply) keep
    everything; ``save_trace`` writes what ``latency.kind=trace`` replays.
    """

    def __init__(self, dt: float, initial_delay_steps: int, quantile: float = 0.9, window: int = 50,
                 cap_steps: int | None = None):
        self.dt, self.initial_delay_steps, self.quantile, self.cap_steps = dt, initial_delay_steps, quantile, cap_steps
        self.latencies: list[float] = []
        self.records: list[dict] = []
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, latency_s: float, record: dict | None = None) -> None:
        self._recent.append(latency_s)
        self.latencies.append(latency_s)
        if record is not None:
            self.records.append(record)

    def next_delay(self) -> int:
        if not self._recent:
            return self.initial_delay_steps
        planned = to_delay_steps(float(np.quantile(np.asarray(self._recent), self.quantile)), self.dt)
        return planned if self.cap_steps is None else min(planned, self.cap_steps)

    def save_trace(self, path: str) -> None:
        """Measured latencies (s) as a JSON list: replay them with latency.kind=trace."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump([round(x, 6) for x in self.latencies], fh)


class PlansFromMeasured:
    """The planning half of an inference endpoint over a real link: ``next_delay``, the
    measured ``latencies`` and ``records``, and ``save_trace``, all from ``self.measured``."""

    measured: MeasuredLatency

    def next_delay(self) -> int:
        return self.measured.next_delay()

    @property
    def latencies(self) -> list[float]:
        """Seconds, every landed reply (capture of o_t0 -> reply received)."""
        return self.measured.latencies

    @property
    def records(self) -> list[dict]:
        return self.measured.records

    def save_trace(self, path: str) -> None:
        """Measured latencies (s) as a JSON list: replay them with latency.kind=trace."""
        self.measured.save_trace(path)


class LatencyModel(Protocol):
    def sample(self, rng: np.random.Generator) -> float:
        """Latency in seconds of one request."""

    def max_latency(self) -> float:
        """Upper bound (s) of ``sample``; used to validate execute_horizon."""

    def min_latency(self) -> float:
        """Lower bound (s) of ``sample``: steps before it are certain to run the old chunk."""


@dataclass(frozen=True)
class FixedLatency:
    latency_s: float

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency.seconds must be >= 0, got {self.latency_s}")

    def sample(self, rng: np.random.Generator) -> float:
        return self.latency_s

    def max_latency(self) -> float:
        return self.latency_s

    def min_latency(self) -> float:
        return self.latency_s


@dataclass(frozen=True)
class UniformLatency:
    low_s: float
    high_s: float

    def __post_init__(self) -> None:
        if not (0 <= self.low_s <= self.high_s):
            raise ValueError(f"latency needs 0 <= low <= high, got low={self.low_s}, high={self.high_s}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low_s, self.high_s))

    def max_latency(self) -> float:
        return self.high_s

    def min_latency(self) -> float:
        return self.low_s


@dataclass(frozen=True)
class LogNormalLatency:
    """Log-normal around ``median_s`` with shape ``sigma``, plus uniform ``jitter_s``,
    truncated at ``max_s`` (a real server times out; the scheduler needs a bound)."""

    median_s: float
    sigma: float
    jitter_s: float = 0.0
    max_s: float | None = None

    def __post_init__(self) -> None:
        if self.median_s <= 0 or self.sigma < 0 or self.jitter_s < 0:
            raise ValueError(
                f"lognormal latency needs median > 0, sigma >= 0, jitter >= 0; got "
                f"median={self.median_s}, sigma={self.sigma}, jitter={self.jitter_s}"
            )
        if self.max_s is not None and self.max_s < self.median_s:
            raise ValueError(f"latency.max ({self.max_s}) must be >= median ({self.median_s})")

    def sample(self, rng: np.random.Generator) -> float:
        value = self.median_s * math.exp(self.sigma * rng.standard_normal())
        value += rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0
        return min(value, self.max_latency())

    def max_latency(self) -> float:
        return self.max_s if self.max_s is not None else 4.0 * self.median_s + self.jitter_s

    def min_latency(self) -> float:
        return 0.0  # no useful lower bound on a log-normal draw


@dataclass(frozen=True)
class TraceLatency:
    """Replays recorded latencies (s) in order, looping; ``offset`` picks the start."""

    values_s: tuple[float, ...]
    offset: int = 0

    def __post_init__(self) -> None:
        if not self.values_s:
            raise ValueError("latency trace is empty")
        bad = [v for v in self.values_s if not (v >= 0 and math.isfinite(v))]
        if bad:
            raise ValueError(f"latency trace has invalid values (need finite >= 0): {bad[:5]}")
        object.__setattr__(self, "_cursor", [self.offset % len(self.values_s)])

    @classmethod
    def from_file(cls, path: str, offset: int = 0) -> "TraceLatency":
        """Read one latency in seconds per line, or a JSON list."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"latency trace file not found: {path}")
        text = open(path, encoding="utf-8").read().strip()
        try:
            if text.startswith("["):
                values: Sequence[float] = [float(v) for v in json.loads(text)]
            else:
                values = [float(line) for line in text.splitlines() if line.strip()
                          and not line.lstrip().startswith("#")]
        except ValueError as exc:
            raise ValueError(f"latency trace {path}: expected numbers in seconds ({exc})") from exc
        return cls(tuple(values), offset)

    def sample(self, rng: np.random.Generator) -> float:
        cursor = self._cursor  # type: ignore[attr-defined]
        value = self.values_s[cursor[0]]
        cursor[0] = (cursor[0] + 1) % len(self.values_s)
        return value

    def max_latency(self) -> float:
        return max(self.values_s)

    def min_latency(self) -> float:
        return min(self.values_s)


LATENCY_KINDS = ("fixed", "uniform", "lognormal", "trace")


@dataclass
class LatencyConfig:
    """The ``latency`` group: the inference latency a sim run draws from."""

    kind: str = "fixed"  # fixed | uniform | lognormal | trace
    seconds: float = 0.2  # fixed
    low: float = 0.1  # uniform
    high: float = 0.3
    median: float = 0.2  # lognormal
    sigma: float = 0.3
    jitter: float = 0.0
    max: float | None = None  # lognormal truncation; None = 4 * median + jitter
    trace_path: str = ""  # trace: one latency (s) per line, or a JSON list

    def validate(self) -> None:
        require(self.kind in LATENCY_KINDS, "latency.kind", f"one of {LATENCY_KINDS}", self.kind)
        for name in ("seconds", "low", "high", "median", "sigma", "jitter"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, f"latency.{name}", "a finite number >= 0", value)
        if self.kind == "uniform":
            require(self.low <= self.high, "latency.low", f"<= latency.high ({self.high})", self.low)
        if self.kind == "lognormal":
            require(self.median > 0, "latency.median", "> 0", self.median)
        if self.kind == "trace":
            require(bool(self.trace_path), "latency.trace_path", "a file path for kind=trace", self.trace_path)


def latency_from_config(cfg: LatencyConfig) -> LatencyModel:
    """Build a latency model from a ``LatencyConfig``."""
    if cfg.kind == "fixed":
        return FixedLatency(cfg.seconds)
    if cfg.kind == "uniform":
        return UniformLatency(cfg.low, cfg.high)
    if cfg.kind == "lognormal":
        return LogNormalLatency(cfg.median, cfg.sigma, cfg.jitter, cfg.max)
    if cfg.kind == "trace":
        return TraceLatency.from_file(cfg.trace_path)
    raise ValueError(f"latency.kind must be one of fixed|uniform|lognormal|trace, got {cfg.kind!r}")
