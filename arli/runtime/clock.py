"""Control-loop clocks: sim time (instant, deterministic) or a monotonic wall clock."""

from __future__ import annotations

import time
from typing import Callable


class SimClock:
    """Step t happens at t * dt; waiting costs nothing."""

    realtime = False

    def __init__(self, dt: float):
        self.dt = dt

    def start(self) -> None:
        """Nothing to align."""

    def wait(self, step: int, idle=None, warm=None) -> None:
        """Sim time: step ``step`` is due now."""

    def now(self, step: int | None = None) -> float:
        return 0.0 if step is None else step * self.dt


class MonotonicClock:
    """Fixed-rate ticks at ``start + t * dt`` on ``time.monotonic``-like ``perf_counter``.

    ``wait`` sleeps until the tick (coarse sleep, then a short spin for the last
    ``spin_s``) and records the timing error (actual - scheduled, s) of every tick. A loop
    that overruns a tick does not try to catch up by running steps back to back: the
    schedule is re-anchored so that later ticks keep their period.

    During the spin, ``warm()`` runs again and again until ``warm_margin_s`` before the
    tick, then the loop only spins. Measured on this 2-core VM: after a 48 ms sleep, the
    residual's forward pass took 106 us at p50 (277 us p99) with one warm-up call before the
    spin and 40 us (66-142 us p99) when the spin kept repeating it: one call does not bring a
    vCPU that slept back to speed.
    """

    realtime = True

    def __init__(self, dt: float, spin_s: float = 0.002, warm_margin_s: float = 0.00025):
        self.dt, self.spin_s, self.warm_margin_s = dt, spin_s, warm_margin_s
        self.t_start = time.perf_counter()
        self.errors: list[float] = []
        self.overruns = 0
        self._offset = 0  # periods skipped after overruns

    def start(self) -> None:
        self.t_start = time.perf_counter()
        self._offset = 0

    def wait(self, step: int, idle: Callable[[float], None] | None = None,
             warm: Callable[[], None] | None = None) -> None:
        """Until tick ``step``; ``idle(timeout_s)`` is called with the time to spare (an
        endpoint receives and timestamps replies in it) until the final spin, then with 0;
        ``warm()`` (the residual repeats its last state build and forward pass) runs
        throughout the spin until ``warm_margin_s`` before the tick."""
        target = self.t_start + (step + self._offset) * self.dt
        now = time.perf_counter()
        if now > target + self.dt:  # overran a whole period: re-anchor, count it
            self.overruns += 1
            self._offset = self._offset + int((now - target) // self.dt)
            target = self.t_start + (step + self._offset) * self.dt
        remaining = target - now
        while remaining > self.spin_s:
            if idle is not None:
                idle(remaining - self.spin_s)
            else:
                time.sleep(remaining - self.spin_s)
            remaining = target - time.perf_counter()
        warm_until = target - self.warm_margin_s
        while (now := time.perf_counter()) < target:
            if idle is not None:
                idle(0.0)  # replies that land while spinning are still stamped on arrival
            if warm is not None and now < warm_until:
                warm()
        self.errors.append(time.perf_counter() - target)

    def now(self, step: int | None = None) -> float:
        return time.perf_counter()
