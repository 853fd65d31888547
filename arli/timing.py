"""Where a finetuning run's time goes: physics, base inference, residual acting, the rest of
the control loop, learner updates, evaluation and checkpoints (seconds, summed)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


class TimeBudget:
    """Seconds per part. ``wrap`` times a method of one object while ``on`` (the training
    episodes' steps), so the same objects in an evaluation are not counted twice."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    def wrap(self, obj, name: str, part: str) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start

        setattr(obj, name, timed)

    @contextmanager
    def part(self, name: str, on: bool = False) -> Iterator[None]:
        """Time the block as ``name``; ``on``: the wrapped methods count inside it."""
        start, was = time.perf_counter(), self.on
        self.on = on
        try:
            yield
        finally:
            self.on = was
            self.seconds[name] += time.perf_counter() - start

    def report(self, inner: tuple[str, ...], outer: str, rest: str) -> dict[str, float]:
        """The parts, with ``rest`` = ``outer`` minus the ``inner`` parts timed inside it."""
        out = {k: round(v, 2) for k, v in self.seconds.items() if k != outer}
        out[rest] = round(self.seconds.get(outer, 0.0) - sum(self.seconds.get(k, 0.0) for k in inner), 2)
        return out
