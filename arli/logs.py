"""Log lines a misbehaving peer cannot multiply: at most ``per_window`` warnings per
``window_s``, the rest counted and said once the window closes."""

from __future__ import annotations

import logging
import time


LINES_PER_WINDOW, WINDOW_S = 20, 10.0  # a log's default budget of warning lines


class RateLimitedLog:
    """``warn(fmt, *args)`` logs through ``logger`` at most ``per_window`` times per
    ``window_s`` seconds; ``suppressed`` counts every line held back (all windows)."""

    def __init__(self, logger: logging.Logger, per_window: int = LINES_PER_WINDOW, window_s: float = WINDOW_S):
        self.logger, self.per_window, self.window_s = logger, per_window, window_s
        self.suppressed = 0
        self._start, self._logged, self._held = time.perf_counter(), 0, 0

    def warn(self, fmt: str, *args) -> bool:
        """Log one warning unless this window's budget is spent -> whether it was logged."""
        now = time.perf_counter()
        if now - self._start > self.window_s:
            self.flush()
            self._start, self._logged = now, 0
        if self._logged < self.per_window:
            self._logged += 1
            self.logger.warning(fmt, *args)
            return True
        self._held += 1
        self.suppressed += 1
        return False

    def flush(self) -> None:
        """Say how many lines the window held back (once), so none is lost without a count."""
        if self._held:
            self.logger.warning("%d more warnings like these were not logged (at most %d per %.0f s)",
                                self._held, self.per_window, self.window_s)
            self._held = 0
