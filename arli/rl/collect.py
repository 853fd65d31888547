"""The robot-side step controller of finetuning: builds ARLI states, acts with the residual
(or lets the intervener act), and turns every step into n-step transitions routed to online
or anchor replay as they happen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from arli.augment import StateBuilder
from arli.rl.learner import ResidualLearner
from arli.rl.replay import NStepAccumulator, ReplayBuffer
from arli.rollout import StepController
from arli.types import StepInfo

Expert = Callable[[np.ndarray], np.ndarray]


@dataclass
class Intervention:
    """Simulated human: takes over an episode at ``after`` steps (with probability ``prob``)
    and acts with the scripted expert until the episode ends."""

    expert: Expert
    prob: float = 0.0
    after: int = 0


class ResidualController(StepController):
    """Acts ``a = clip(b + scale * r(s))`` on ARLI states; optionally learns while acting.

    train=False: deterministic residual, nothing stored (evaluation).
    """

    def __init__(self, learner: ResidualLearner, builder: StateBuilder, online: ReplayBuffer | None = None,
                 anchor: ReplayBuffer | None = None, train: bool = False,
                 intervention: Intervention | None = None, rng: np.random.Generator | None = None,
                 learn_after: int = 1000):
        self.learner, self.builder = learner, builder
        self.online, self.anchor, self.train = online, anchor, train
        self.intervention = intervention
        self.rng = rng or np.random.default_rng(0)
        self.learn_after = learn_after
        self.acc = NStepAccumulator(learner.cfg.n_step, learner.cfg.gamma)
        self.env_steps = 0
        self.intervened_steps = 0
        self.last_stats: dict[str, float] = {}
        self._pending: tuple | None = None
        self._intervene_at: int | None = None
        self.begin_episode()

    def begin_episode(self) -> None:
        """Call before every episode: clears the n-step window, draws whether the intervener
        takes this one over."""
        self.acc.reset()
        self._pending = None
        self.intervened_episode = False
        iv = self.intervention
        self._intervene_at = iv.after if iv is not None and self.rng.random() < iv.prob else None

    def act(self, t: int, obs: dict, info: StepInfo) -> np.ndarray:
        state = self.builder.build(obs["state"], info)
        if self._pending is not None:
            self._complete(state, info.base_action, terminated=False, truncated=False)
        intervening = self._intervene_at is not None and t >= self._intervene_at
        if intervening:
            action = np.asarray(self.intervention.expert(obs["state"]), np.float32)
            self.intervened_steps += 1
            self.intervened_episode = True
        else:
            residual = self.learner.residual(state, explore=self.train)
            action = self.learner.executed(info.base_action, residual)
        self._pending = [state, info.base_action.copy(), action, 0.0, "anchor" if intervening else "online"]
        return action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        self._pending[3] = reward
        if self.train:
            self.env_steps += 1
            if len(self.online) + len(self.anchor) >= self.learn_after:
                for _ in range(self.learner.cfg.utd):
                    self.last_stats = self.learner.update(self.online, self.anchor)

    def end(self, obs: dict, info: StepInfo, terminated: bool, truncated: bool) -> None:
        if self._pending is not None:
            self._complete(self.builder.build(obs["state"], info), info.base_action, terminated, truncated)

    def _complete(self, next_state, next_base, terminated: bool, truncated: bool) -> None:
        state, base, action, reward, tag = self._pending
        self._pending = None
        if not self.train:
            return
        for tr in self.acc.push(state, base, action, reward, next_state, next_base,
                                terminated, truncated, tag):
            (self.anchor if tr["tag"] == "anchor" else self.online).add(tr)
