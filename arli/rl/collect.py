"""The robot-side step controller of finetuning: builds ARLI states, acts with the residual
(or lets the intervener act), and turns every step into n-step transitions routed to online
or anchor replay as they happen."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from arli.augment import StateBuilder
from arli.rl.config import InterventionSpec
from arli.rl.learner import ResidualLearner
from arli.rl.replay import INTERVENTION, ONLINE, NStepAccumulator, ReplayBuffer
from arli.runtime.loop import StepController
from arli.types import Observation, StepInfo
from robot_drivers.teleop.base import TeleopDevice
from robot_drivers.teleop.scripted import ScriptedOperator

log = logging.getLogger("arli.collect")
DIAGNOSTICS_EVERY = 250  # updates between measured ones (TD error per source, grad norms)
Expert = Callable[[np.ndarray], np.ndarray]


@dataclass
class Intervention:
    """The online intervener, behind the device interface (``robot_drivers.teleop``).

    Settings in ``spec``. In a share ``prob`` of episodes the intervener watches; from step
    ``after`` on it acts whenever its device says the operator holds control:
    * ``device=None`` (sim): the scripted expert as ``ScriptedOperator`` in ``corrective``
      mode (HG-DAgger-style: takes over after ``patience`` steps of the robot's action
      differing from the expert's by more than ``threshold``, drives ``segment`` steps, hands
      back; as the residual improves it triggers less, like a human who stops correcting a
      good robot), or the expert for the rest of the episode in ``takeover`` mode;
    * a real device (SpaceMouse, gamepad, keyboard): the operator's take-over / hand-back.
    """

    expert: Expert | None
    spec: InterventionSpec
    device: TeleopDevice | None = None

    def __post_init__(self) -> None:
        self.spec.validate()
        if self.device is None:
            if self.expert is None:
                raise ValueError("an intervener needs a scripted expert or a device")
            s = self.spec
            self.device = ScriptedOperator(self.expert, s.threshold, s.patience, s.segment,
                                           s.judged_dims or None)
        self.begin_episode(watching=False)

    def begin_episode(self, watching: bool) -> None:
        self.watching = watching
        self.events: list = []
        self._reported = getattr(self, "_reported", False)
        if isinstance(self.device, ScriptedOperator):
            self.device.reset()

    def decide(self, t: int, state: np.ndarray, proposed: np.ndarray) -> np.ndarray | None:
        """The intervener's action (m,) for step t, or None to let the robot act ``proposed``.
        A person's device is polled every step, so its events (``self.events``: success,
        failure, re-record, ...) are never lost; an unplugged one is reported once and the
        run goes on without it."""
        spec = self.spec
        self.events = []
        scripted = isinstance(self.device, ScriptedOperator)
        if scripted and (not self.watching or t < spec.after):
            return None
        if spec.mode == "takeover" and self.expert is not None:
            return np.asarray(self.expert(state), np.float32)
        if scripted:
            self.device.observe(state, proposed)
        command = self.device.poll()
        self.events = list(command.events)
        if not self.device.connected:
            if not self._reported:
                log.warning("intervention device %s: %s; going on without it", self.device.name,
                            self.device.status)
                self._reported = True
            return None
        self._reported = False
        if not self.watching or t < spec.after:
            return None
        return command.action() if self.device.active else None


class ResidualController(StepController):
    """Acts ``a = clip(b + scale * r(s))`` on residual states; optionally learns while acting.

    train=False: deterministic residual, nothing stored (evaluation); ``trace`` then keeps
    every step's (state, executed action, reward) for Q-vs-return diagnostics.
    ``source``: who the stored rows are credited to when the intervener acts (DEMO while
    collecting demonstrations, INTERVENTION online).
    """

    def __init__(self, learner: ResidualLearner, builder: StateBuilder, online: ReplayBuffer | None = None,
                 anchor: ReplayBuffer | None = None, train: bool = False,
                 intervention: Intervention | None = None, rng: np.random.Generator | None = None,
                 learn_after: int = 1000, trace: bool = False, sink=None):
        self.learner, self.builder = learner, builder
        self.sink = sink  # remote learner: transitions go there, no updates here
        self.online, self.anchor, self.train = online, anchor, train
        self.intervention = intervention
        self.rng = rng or np.random.default_rng(0)
        self.learn_after = learn_after
        self.acc = NStepAccumulator(learner.cfg.n_step, learner.cfg.gamma)
        self.source = INTERVENTION
        self.env_steps = 0
        self.intervened_steps = 0
        self.takeovers = 0
        self.last_stats: dict[str, float] = {}
        self.trace: list[list[tuple]] | None = [] if trace else None
        self._pending: list | None = None  # the last executed step, completed by the next state
        self._current: list | None = None  # this step's, between act and after_step
        self.intervened_episode = False
        self.last_step: dict = {}

    def begin_episode(self) -> None:
        """Before every episode (``run_episode`` calls it): clears the n-step window, draws
        whether the intervener watches this one."""
        self.acc.reset()
        self.learner.begin_episode()
        self._pending = self._current = None
        self.intervened_episode = False
        if self.trace is not None:
            self.trace.append([])
        if self.intervention is not None:
            self.intervention.begin_episode(watching=bool(self.rng.random() < self.intervention.spec.prob))

    def _may_intervene(self) -> bool:
        cap = self.intervention.spec.max_steps if self.intervention is not None else 0
        return self.intervention is not None and (cap == 0 or self.intervened_steps < cap)

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        state = self.builder.build(obs.state, info)
        action = self.learner.act(state, info.base_action, explore=self.train)
        takeover = self.intervention.decide(t, obs.state, action) if self._may_intervene() else None
        source = self.source if takeover is not None else ONLINE
        # what a recorder keeps of this step: the residual's own proposal, who acted, events
        self.last_step = {"state": state, "proposed": action, "intervened": takeover is not None,
                          "events": self.intervention.events if self.intervention is not None else []}
        if takeover is not None:
            action = takeover
            self.intervened_steps += 1
            self.intervened_episode = True
        # bookkeeping of the previous step waits until this action has been sent (after_step)
        self._current = [state, info.base_action.copy(), action, 0.0, source]
        return action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        current, self._current = self._current, None
        if self._pending is not None:  # s_t completes the previous step's transition
            if current[4] != ONLINE and self._pending[4] == ONLINE:  # the robot's step caused a takeover
                self.takeovers += 1
                self._pending[3] -= self.intervention.spec.takeover_penalty
            self._complete(current[0], current[1], terminated=False)
        self._pending = current
        self._pending[3] += reward
        if self.trace is not None:
            self.trace[-1].append((self._pending[0], self._pending[2], reward))
        if self.train:
            self.env_steps += 1
            if self.sink is None and len(self.online) + len(self.anchor) >= self.learn_after:
                for _ in range(self.learner.cfg.utd):
                    measure = self.learner.updates % DIAGNOSTICS_EVERY == 0
                    self.last_stats.update(self.learner.update(self.online, self.anchor, diagnostics=measure))

    def end(self, obs: Observation, info: StepInfo, terminated: bool, truncated: bool) -> None:
        # the state carries the episode's progress, so the time limit is part of the MDP: a
        # truncated episode has no value beyond its last step (no bootstrap through it)
        if self._pending is not None:
            self._complete(self.builder.build(obs.state, info), info.base_action, terminated or truncated)

    def _complete(self, next_state, next_base, terminated: bool) -> None:
        state, base, action, reward, source = self._pending
        self._pending = None
        if not self.train:
            return
        for tr in self.acc.push(state, base, action, reward, next_state, next_base, terminated, False, source):
            if self.sink is not None:
                self.sink.add(tr)
            else:
                (self.online if tr["source"] == ONLINE else self.anchor).add(tr)
