"""From executed steps to n-step transitions, in numpy (the robot side builds them too).

``TransitionBuilder`` is the one component that turns a stream of ``StepRecord`` s into
n-step ``Transition`` s, in process and on a robot alike: it completes each step with the
next step's state, charges the takeover penalty to the robot's step an intervener took
over after, and keeps a window per actor (``NStepAccumulator``). ``RowLayout`` is the flat
float32 row a transition travels and is stored as.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from arli.types import ONLINE, StepRecord, Transition


class NStepAccumulator:
    """Turns per-step transitions of one episode into n-step transitions.

    A window never spans a change of who acts (residual <-> demonstrator/intervener): the
    residual's n-step target must not count the intervener's actions as its own, and an
    intervention segment's return is the intervener's. When the actor changes, the window
    is flushed and bootstraps from the state where the other one took over.
    """

    def __init__(self, n: int, gamma: float):
        if n < 1 or not 0 < gamma <= 1:
            raise ValueError(f"n_step must be >= 1 and gamma in (0, 1], got n={n}, gamma={gamma}")
        self.n, self.gamma = n, gamma
        self._window: deque = deque()

    def push(self, state, base, action, reward: float, next_state, next_base,
             terminated: bool, truncated: bool, source: int = ONLINE) -> list[Transition]:
        """Add step t (its action chosen by ``source``); returns the n-step transitions that
        are complete now. ``truncated`` without ``terminated`` bootstraps."""
        out: list[Transition] = []
        if self._window and self._window[0][4] != source:
            while self._window:  # actor changed at s_t: bootstrap the old window from s_t
                out.append(self._emit(state, base, False))
        self._window.append((state, base, action, float(reward), source))
        if terminated or truncated:
            while self._window:  # flush: shorter returns, bootstrap only if not terminated
                out.append(self._emit(next_state, next_base, terminated))
        elif len(self._window) == self.n:
            out.append(self._emit(next_state, next_base, False))
        return out

    def _emit(self, next_state, next_base, terminated: bool) -> Transition:
        k = len(self._window)
        ret = sum(self.gamma**i * step[3] for i, step in enumerate(self._window))
        state, base, action, _, source = self._window.popleft()
        return Transition(state, base, action, ret, next_state, next_base,
                          0.0 if terminated else self.gamma**k, source)

    def reset(self) -> None:
        self._window.clear()


class TransitionBuilder:
    """StepRecords of one episode at a time -> n-step transitions.

    A step's transition needs the next state, so step t is completed when step t + 1
    arrives (``step``) or the episode ends (``end``). ``takeover_penalty`` is subtracted
    from the reward of a robot step that an intervener took over after (HIL-SERL-style);
    ``takeovers`` counts those steps.
    """

    def __init__(self, n_step: int, gamma: float, takeover_penalty: float = 0.0):
        self.acc = NStepAccumulator(n_step, gamma)
        self.takeover_penalty = takeover_penalty
        self.takeovers = 0
        self._pending: StepRecord | None = None

    def begin_episode(self) -> None:
        self.acc.reset()
        self._pending = None

    def step(self, record: StepRecord) -> list[Transition]:
        """Step t's record (its reward known); returns the transitions complete now."""
        out: list[Transition] = []
        pending = self._pending
        if pending is not None:  # s_t completes the previous step's transition
            reward = pending.reward
            if record.source != ONLINE and pending.source == ONLINE:  # the robot's step caused a takeover
                self.takeovers += 1
                reward -= self.takeover_penalty
            out = self.acc.push(pending.state, pending.base, pending.action, reward, record.state,
                                record.base, False, False, pending.source)
        self._pending = record
        return out

    def end(self, next_state: np.ndarray, next_base: np.ndarray, terminal: bool) -> list[Transition]:
        """Episode over at s_T (D,), b_T (m,). ``terminal``: no bootstrap beyond the last step
        (the state carries the episode's progress, so the time limit is part of the MDP)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        return self.acc.push(pending.state, pending.base, pending.action, pending.reward, next_state,
                             next_base, terminal, False, pending.source)


class RowLayout:
    """Columns of a transition in one float32 row (W,): state, base, action, ret, next_state,
    next_base, discount, source (scalars take one column)."""

    def __init__(self, state_dim: int, action_dim: int):
        widths = {"state": state_dim, "base": action_dim, "action": action_dim, "ret": 0,
                  "next_state": state_dim, "next_base": action_dim, "discount": 0, "source": 0}
        self.columns: dict[str, slice | int] = {}
        pos = 0
        for key, width in widths.items():  # width 0 = a scalar column
            self.columns[key] = slice(pos, pos + width) if width else pos
            pos += max(width, 1)
        self.width = pos

    def row(self, transition: Transition | dict) -> np.ndarray:
        """One transition as a (W,) row."""
        row = np.empty(self.width, np.float32)
        for key, col in self.columns.items():
            row[col] = np.asarray(transition[key], np.float32)
        return row
