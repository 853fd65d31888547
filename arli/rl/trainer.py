"""The one path from transitions to learner updates, shared by ``arli finetune`` (in process)
and ``arli learner`` (transitions from a fleet of actors).

``Trainer.ingest`` routes transitions (or rows in replay layout) to online or anchor replay
by who chose the action and counts the updates they are owed: ``learner.utd`` per
environment step once ``learn_after`` rows are in replay. ``Trainer.run_owed`` runs them.
"""

from __future__ import annotations

import numpy as np

from arli.rl.learner import ResidualLearner
from arli.rl.replay import ReplayBuffer
from arli.types import INTERVENTION, ONLINE, Transition

DIAGNOSTICS_EVERY = 250  # updates between measured ones (TD error per source, grad norms)


class Trainer:
    """Owns the learner and its two replays; counts environment steps and owed updates.

    learn_after: rows in replay (online + anchor) before the first update.
    """

    def __init__(self, learner: ResidualLearner, online: ReplayBuffer, anchor: ReplayBuffer, learn_after: int):
        self.learner, self.online, self.anchor, self.learn_after = learner, online, anchor, learn_after
        self.src_col = online.columns["source"]
        self.env_steps = 0  # online environment steps ingested (demonstrations are not counted)
        self.intervention_rows = 0
        self.rejected_rows = 0  # rows with NaN/inf, never stored
        self.owed = 0
        self.last_stats: dict[str, float] = {}
        self._actor_unmeasured = False

    def ingest(self, transitions: list[Transition], env_steps: int) -> None:
        """Transitions into replay, ``env_steps`` environment steps taken to make them."""
        for tr in transitions:
            (self.online if tr.source == ONLINE else self.anchor).add(tr)
            self.intervention_rows += int(tr.source == INTERVENTION)
        self._count(env_steps)

    def ingest_rows(self, rows: np.ndarray) -> int:
        """(N, W) rows from an actor (one per environment step); returns how many were stored."""
        rows = np.asarray(rows, np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.online.rows.shape[1]:  # an actor running another config
            raise ValueError(f"rows must have shape (N, {self.online.rows.shape[1]}), got {rows.shape}")
        if not len(rows):
            return 0
        finite = np.all(np.isfinite(rows), axis=1)
        self.rejected_rows += int((~finite).sum())
        rows = rows[finite]
        online = rows[:, self.src_col] == ONLINE
        n = self.online.add_rows(rows[online]) + self.anchor.add_rows(rows[~online])
        self.intervention_rows += int((rows[:, self.src_col] == INTERVENTION).sum())
        self._count(n)
        return n

    def _count(self, env_steps: int) -> None:
        self.env_steps += env_steps
        if len(self.online) + len(self.anchor) >= self.learn_after:
            self.owed += self.learner.cfg.utd * env_steps

    def run_owed(self, limit: int | None = None) -> int:
        """Run the owed updates (at most ``limit``); returns how many ran. Every
        ``DIAGNOSTICS_EVERY``-th is measured; ``last_stats`` holds the latest statistics."""
        n = self.owed if limit is None else min(self.owed, limit)
        learner = self.learner
        for _ in range(n):
            measure = self._actor_unmeasured or learner.updates % DIAGNOSTICS_EVERY == 0
            stats = learner.update(self.online, self.anchor, diagnostics=measure)
            self.last_stats.update(stats)
            # the actor steps every policy_delay-th update only: a measured update without one
            # passes the measurement on until an actor step is measured too
            self._actor_unmeasured = (measure and "actor_loss" not in stats
                                      and learner.updates >= learner.cfg.critic_warmup_updates)
            self.owed -= 1
        return n

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict(), "online": self.online.state_dict(),
                "anchor": self.anchor.state_dict(), "env_steps": self.env_steps, "owed": self.owed,
                "intervention_rows": self.intervention_rows, "rejected_rows": self.rejected_rows}

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])
        self.online.load_state_dict(state["online"])
        self.anchor.load_state_dict(state["anchor"])
        self.env_steps, self.owed = int(state["env_steps"]), int(state["owed"])
        self.intervention_rows, self.rejected_rows = int(state["intervention_rows"]), int(state["rejected_rows"])
