"""Acting at every control step: the ARLI state, the residual, the intervener.

``ResidualController`` is the step controller of finetuning, evaluation, recording and the
robot's actor. Each step it builds the residual's state from the observation and the
scheduler's ``StepInfo``, asks the residual for ``a = clip(b + scale * r(s))``, lets the
intervener take over, and returns a typed ``Decision``. While training, each executed step
becomes a ``StepRecord`` and the n-step component turns those into transitions, which wait in
``transitions`` for the caller (the trainer in process, the learner link on a robot). No
learning happens here. No torch import: the robot runs this.
"""

from __future__ import annotations

import numpy as np

from arli.augment import StateBuilder
from arli.interfaces import ResidualPolicy, StepController
from arli.policies.residual_np import project_numpy
from arli.rl.transitions import TransitionBuilder
from arli.runtime.intervention import Intervention
from arli.types import INTERVENTION, ONLINE, Decision, Observation, StepInfo, Transition


class ResidualController(StepController):
    """Acts with ``policy`` on ARLI states built by ``builder``.

    train: exploration on and transitions built (``transitions`` must be given);
    otherwise deterministic and nothing stored (evaluation, recording), and ``trace`` keeps
    every episode's (state (D,), executed action (m,), reward) for Q-vs-return diagnostics.
    source: who the rows are credited to when the intervener acts (DEMO while collecting
    demonstrations, INTERVENTION online).
    intervention_reach: when set, the intervener's action is projected into the residual's
    reach around the base action, ``clip(b + reach * clip((a - b) / reach, -1, 1))``: it
    corrects the running base as far as a residual with that bound could, so its rows are
    targets the residual can imitate exactly, from states the base + residual visits.
    """

    def __init__(self, policy: ResidualPolicy, builder: StateBuilder, train: bool = False,
                 transitions: TransitionBuilder | None = None, intervention: Intervention | None = None,
                 rng: np.random.Generator | None = None, trace: bool = False, source: int = INTERVENTION,
                 intervention_reach: float | None = None):
        if train and transitions is None:
            raise ValueError("a training controller needs a TransitionBuilder")
        self.policy, self.builder, self.train = policy, builder, train
        self.nstep = transitions
        self.intervention = intervention
        self.rng = rng or np.random.default_rng(0)  # whether the intervener watches an episode
        self.source = source
        self.intervention_reach = intervention_reach
        self.transitions: list[Transition] = []  # built, not yet taken
        self.intervened_steps = 0  # the intervener's steps so far (its max_steps cap counts them)
        self.intervened_episode = False
        self.trace: list[list[tuple]] | None = [] if trace else None
        self.last_decision: Decision | None = None
        self._plan_id: int | None = None  # standard: the chunk whose residual chunk is decided
        self._plan: dict[int, np.ndarray] = {}  # slot -> proposed action

    @property
    def takeovers(self) -> int:
        """Robot steps an intervener took over after."""
        return self.nstep.takeovers if self.nstep is not None else 0

    def take_transitions(self) -> list[Transition]:
        """The transitions built since the last call (oldest first)."""
        out, self.transitions = self.transitions, []
        return out

    def begin_episode(self) -> None:
        """Before every episode: clears the n-step window, draws whether the intervener
        watches this one."""
        if self.nstep is not None:
            self.nstep.begin_episode()
        self.policy.begin_episode()
        self.last_decision = None
        self._plan_id, self._plan = None, {}
        self.intervened_episode = False
        if self.trace is not None:
            self.trace.append([])
        if self.intervention is not None:
            self.intervention.begin_episode(watching=bool(self.rng.random() < self.intervention.spec.prob))

    def _may_intervene(self) -> bool:
        if self.intervention is None:
            return False
        cap = self.intervention.spec.max_steps
        return cap == 0 or self.intervened_steps < cap

    def decide(self, t: int, obs: Observation, info: StepInfo) -> Decision:
        """The decision of step t: state, the residual's proposal, what executes and who chose it."""
        state = self.builder.build(obs.state, info)
        if self.builder.variant == "standard" and info.chunk_obs is not None:
            proposed = self._from_chunk_plan(info)
        else:
            proposed = self.policy.act(state, info.base_action, explore=self.train)
        polled = self._may_intervene()
        takeover = self.intervention.decide(t, obs.state, proposed) if polled else None
        events = tuple(self.intervention.events) if polled else ()  # this step's, never a stale one
        if takeover is None:
            return Decision(t, state, info.base_action.copy(), proposed, proposed, ONLINE, events)
        if self.intervention_reach is not None:
            takeover = project_numpy(takeover, info.base_action, self.intervention_reach)
        return Decision(t, state, info.base_action.copy(), proposed, np.asarray(takeover, np.float32),
                        self.source, events)

    def _from_chunk_plan(self, info: StepInfo) -> np.ndarray:
        """``standard``: the residual chunk is decided once, at the chunk's first executed slot,
        for every remaining slot (with the weights and exploration draws of that moment), as a
        correction that travels with the base chunk would be; each slot then runs its entry."""
        if self._plan_id != info.chunk_id:
            first = info.index_in_chunk
            states = self.builder.chunk_states(info)
            self._plan = {first + k: self.policy.act(s, info.chunk_actions[first + k], explore=self.train)
                          for k, s in enumerate(states)}
            self._plan_id = info.chunk_id
        planned_base = info.chunk_actions[info.index_in_chunk]
        proposal = self._plan[info.index_in_chunk]
        if np.array_equal(info.base_action, planned_base):
            return proposal
        # the executing base differs from the planned one (blended): keep the planned correction
        return np.clip(info.base_action + (proposal - planned_base), -1.0, 1.0).astype(np.float32)

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        decision = self.decide(t, obs, info)
        if decision.intervened:
            self.intervened_steps += 1
            self.intervened_episode = True
        self.last_decision = decision
        return decision.action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        # bookkeeping waits until the action has been sent: it is off the step's critical path
        decision = self.last_decision
        if self.trace is not None:
            self.trace[-1].append((decision.state, decision.action, reward))
        if self.train:
            self.transitions.extend(self.nstep.step(decision.record(reward)))

    def end(self, obs: Observation, info: StepInfo, terminated: bool, truncated: bool) -> None:
        # the state carries the episode's progress, so the time limit is part of the MDP: a
        # truncated episode has no value beyond its last step (no bootstrap through it)
        if self.train:
            self.transitions.extend(self.nstep.end(self.builder.build(obs.state, info), info.base_action,
                                                           terminated or truncated))
