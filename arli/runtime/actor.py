"""The robot-side actor (``arli actor``): the runtime loop on a real clock, chunks from
``arli serve``, the ARLI residual on CPU, transitions to ``arli learner``.

The residual's definition (variant, state normalisation, network sizes) arrives with the
learner's weights, so an actor needs no copy of the base policy or of the learner config.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from arli.augment import StateBuilder
from arli.chunking import ChunkingConfig, make_scheduler
from arli.policies.residual_np import CRITIC_PREFIX, ResidualActing
from arli.rl.config import LearnerConfig
from arli.rl.transitions import RowLayout, TransitionBuilder
from arli.runtime.acting import ResidualController
from arli.runtime.clock import MonotonicClock
from arli.runtime.link import LearnerLink
from arli.runtime.loop import run_episode
from arli.types import Observation, StepInfo

log = logging.getLogger("arli.actor")


class RemoteResidualController(ResidualController):
    """``ResidualController`` whose weights come from the link, swapped in between steps, and
    whose transitions go to the link as replay rows (NaN/inf rows are not sent)."""

    def __init__(self, policy: ResidualActing, builder: StateBuilder, link: LearnerLink, train: bool = True,
                 intervention=None):
        cfg = policy.cfg
        super().__init__(policy, builder, train=train, intervention=intervention,
                         transitions=TransitionBuilder(cfg.n_step, cfg.gamma,
                                                       intervention.spec.takeover_penalty if intervention else 0.0))
        self.link, self.layout = link, RowLayout(builder.dim, policy.action_dim)
        self.version = 0
        self.done = False
        self.residual_s: list[float] = []  # state build + actor forward, per step
        self._last: tuple | None = None  # the last step's (observation, StepInfo), for warm()

    def _send(self) -> None:
        for transition in self.take_transitions():
            row = self.layout.row(transition)
            if np.all(np.isfinite(row)):
                self.link.add_row(row)

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        super().after_step(t, reward, terminated, truncated)
        self._send()

    def end(self, obs: Observation, info: StepInfo, terminated: bool, truncated: bool) -> None:
        super().end(obs, info, terminated, truncated)
        self._send()

    def swap_weights(self) -> None:
        new = self.link.take_weights()
        if new is not None:
            version, arrays, meta = new
            actor, critic = split_weights(arrays)
            self.policy.load(actor, critic, meta.get("updates"))
            self.version, self.done = version, self.done or bool(meta.get("done", False))
        self.done = self.done or self.link.learner_done

    def warm(self) -> None:
        """Before the tick, off the step's critical path: new weights in, the next exploration
        noise drawn, and the last step's state build and forward passes (the critic's too where
        it gates) repeated. After a period of sleep the code and weights are out of the caches;
        measured on this machine, a cold forward pass takes about 3x a warm one."""
        self.swap_weights()
        self.policy.prepare()
        if self._last is not None:
            self.policy.warm(self.builder.build(*self._last))

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        self.swap_weights()
        start = time.perf_counter()
        action = super().act(t, obs, info)
        self.residual_s.append(time.perf_counter() - start)
        self._last = (obs.state, info)
        return action


def residual_from_weights(arrays: dict, meta: dict, obs_dim: int, action_dim: int,
                          seed: int = 0) -> tuple[ResidualActing, StateBuilder]:
    """The actor-side residual (acting only) defined by a learner's weights message."""
    builder = StateBuilder(meta["variant"], obs_dim, action_dim, int(meta["chunk_size"]),
                           int(meta["episode_steps"]), obs_mean=np.array(arrays["obs_mean"]),
                           obs_std=np.array(arrays["obs_std"]))
    if builder.dim != int(meta["state_dim"]):
        raise ValueError(f"the learner's residual state has {meta['state_dim']} dims, this robot's builds "
                         f"{builder.dim}: actor and learner run different tasks or variants")
    known = set(LearnerConfig.__dataclass_fields__)
    cfg = LearnerConfig(**{k: v for k, v in meta["learner"].items() if k in known})
    actor, critic = split_weights(arrays)
    policy = ResidualActing(cfg, actor, action_dim, seed, critic=critic)
    policy.updates = int(meta.get("updates", 0))
    return policy, builder


def split_weights(arrays: dict) -> tuple[dict, dict | None]:
    """A weights message's arrays -> (the actor's, the critic's or None): the learner sends the
    critic's (``CRITIC_PREFIX``) where it gates by value."""
    critic = {k[len(CRITIC_PREFIX):]: v for k, v in arrays.items() if k.startswith(CRITIC_PREFIX)}
    return {k: v for k, v in arrays.items() if not k.startswith(CRITIC_PREFIX)}, critic or None


@dataclass
class ActorStats:
    episodes: int = 0
    successes: int = 0
    steps: int = 0
    spikes: int = 0
    dropped: int = 0
    server_lost_steps: int = 0
    robot_faults: int = 0


def wait_for_weights(link: LearnerLink, timeout_s: float) -> tuple[int, dict, dict]:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        w = link.take_weights()
        if w is not None:
            return w
        if not link.alive():
            raise RuntimeError("the learner link thread stopped (see the log above)")
        time.sleep(0.05)
    raise TimeoutError(f"no weights from the learner at {link.weights_addr} within {timeout_s:.0f} s; "
                       "is `arli learner` running (same curve settings)?")


def run_actor(driver, inference, link: LearnerLink, chunking: ChunkingConfig, seeds, weights_timeout_s: float = 120.0,
              max_episodes: int | None = None, on_episode=None, seed: int = 0, spin_s: float = 0.002,
              intervention=None, wrap=None) -> tuple[ActorStats, RemoteResidualController]:
    """Episodes until the learner says it is done (or ``max_episodes``).

    ``intervention``: a person's device (``arli.runtime.intervention.Intervention``) that can take
    over; their steps are sent as intervention transitions. ``wrap``: ctl -> the controller
    the loop runs (the recorder around the residual), built once the residual is known.
    """
    version, arrays, meta = wait_for_weights(link, weights_timeout_s)
    if int(meta["chunk_size"]) != int(inference.chunk_size):
        raise ValueError(f"the learner's residual expects chunks of {meta['chunk_size']} actions, the server "
                         f"sends {inference.chunk_size}: start `arli learner` with chunk_size="
                         f"{inference.chunk_size} (robot=franka) or the same base checkpoint as the server")
    learner, builder = residual_from_weights(arrays, meta, driver.state_dim, driver.action_dim, seed)
    ctl = RemoteResidualController(learner, builder, link, intervention=intervention)
    ctl.version, ctl.done = version, bool(meta.get("done", False))
    loop_ctl = wrap(ctl) if wrap is not None else ctl
    # plans for chunking.planned_delay_steps (the first requests; the endpoint then plans with
    # the measured latency's quantile, within that bound) with the served policy's chunk size
    scheduler = make_scheduler(chunking, inference.chunk_size, driver.action_dim, chunking.planned_delay_steps,
                               chunking.min_delay_steps or 0)
    clock = MonotonicClock(driver.dt, spin_s=spin_s)
    stats = ActorStats()
    for seed in seeds:
        if ctl.done or (max_episodes is not None and stats.episodes >= max_episodes):
            break
        result = run_episode(driver, inference, scheduler, clock, seed, loop_ctl)
        stats.episodes += 1
        if result.robot_fault:
            stats.robot_faults += 1
            log.error("episode %d ended by the robot: %s", stats.episodes, result.robot_fault)
        stats.successes += int(result.success)
        stats.steps += result.steps
        stats.spikes += result.spikes
        stats.dropped += result.dropped
        stats.server_lost_steps += result.server_lost_steps
        link.add_episode({"success": bool(result.success), "steps": result.steps,
                          "weights_version": ctl.version, "spikes": result.spikes,
                          "mean_delay": float(np.mean(result.delays)) if result.delays else -1.0})
        if on_episode is not None:
            on_episode(stats, result, ctl)
        ctl.swap_weights()
    return stats, ctl
