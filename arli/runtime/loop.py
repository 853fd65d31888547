"""The robot runtime: one control loop, the same in sim time and on a real clock.

Every control step t::

    wait for tick t  ->  land replies  ->  maybe request a chunk (o_t)  ->  scheduler: b_t, StepInfo
    ->  controller: a_t (ARLI state -> residual, or the intervener)  ->  driver executes a_t
    ->  controller sees (r_t, done): transitions

The loop depends on three interfaces only: a ``RobotDriver`` (sim task or Franka), an
inference endpoint (in-process ``SimInference`` or the ZeroMQ ``RemoteInference``) and a
clock (``SimClock`` or ``MonotonicClock``). Safety rules that hold whatever the endpoint
does: the executed base action always comes from the slot scheduled for this step or is
the hold (``ChunkScheduler``); a request that outlives ``request_timeout_steps`` is
abandoned; while no server is reachable the robot holds from the next step on; a reply
later than the scheduler planned for (a latency spike) is used for its remaining fresh
slots, or dropped if none are left, and counted, never refused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from arli.chunking import ChunkScheduler
from arli.runtime.clock import MonotonicClock, SimClock
from arli.runtime.inference import ChunkReply, InferenceEndpoint
from arli.types import Observation, StepInfo
from robot_drivers.base import RobotDriver, RobotFault


class StepController:
    """Decides the executed action and sees the outcome of every step.

    The default executes the base action; the residual (``ResidualController``) and the
    recorders override ``act`` and collect transitions in ``after_step`` / ``end``.
    """

    def begin_episode(self) -> None:
        """A new episode starts (called before its first step)."""

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        return info.base_action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        """Outcome of the action chosen by ``act`` at step t."""

    def end(self, obs: Observation, info: StepInfo, terminated: bool, truncated: bool) -> None:
        """Episode over: the final observation and what the scheduler would do next."""


@dataclass
class EpisodeResult:
    success: bool
    steps: int
    requests: int
    starved_steps: int
    delays: list[int] = field(default_factory=list)  # per landed reply: arrival step - t0
    spikes: int = 0  # replies later than the scheduler's planned maximum delay
    dropped: int = 0  # replies whose every slot was already in the past
    abandoned: int = 0  # requests given up after request_timeout_steps
    failed: int = 0  # requests the server answered with an error (re-requested at once)
    server_lost_steps: int = 0  # steps held because no inference server was reachable
    robot_fault: str = ""  # why the robot ended the episode early (connection lost, ...)
    request_log: list[dict] = field(default_factory=list)  # one entry per landed reply


def run_episode(driver: RobotDriver, inference: InferenceEndpoint, scheduler: ChunkScheduler,
                clock: SimClock | MonotonicClock, seed: int, controller: StepController | None = None,
                request_timeout_steps: int | None = None) -> EpisodeResult:
    """One episode of the control loop; returns what happened (success, delays, faults)."""
    ctl = controller or StepController()
    obs = driver.reset(seed)
    inference.begin_episode(seed)
    scheduler.reset()
    ctl.begin_episode()
    history: deque[Observation] = deque(maxlen=max(int(getattr(inference, "n_obs_steps", 1)) - 1, 0))
    result = EpisodeResult(False, 0, 0, 0)
    timeout = request_timeout_steps or 10 * scheduler.chunk_size

    def land(step: int) -> None:
        for reply in inference.poll(step):
            _land(scheduler, reply, step, result)

    clock.start()
    t, done, terminated, truncated = 0, False, False, False
    try:
        while not done:
            clock.wait(t, getattr(inference, "drain", None), getattr(ctl, "warm", None))
            obs = driver.observe()  # o_t, captured at the tick
            land(t)  # replies that arrived during the last period switch in first
            flight = scheduler.in_flight
            if not inference.healthy():
                if scheduler.active is not None or flight is not None:
                    scheduler.abort()  # hold now: the plan's future is gone with its server
                result.server_lost_steps += 1
            elif flight is not None and t - flight.request.t0 > timeout:
                scheduler.cancel()
                result.abandoned += 1
            if inference.healthy() and scheduler.should_request(t):
                request = scheduler.make_request(obs, t, inference.next_delay())
                if inference.submit(request, list(history)):
                    result.requests += 1
                    land(t)  # d = 0 in sim time: available before this step runs
                else:
                    scheduler.cancel()
            info = scheduler.step(t)
            action = ctl.act(t, obs, info)
            if history.maxlen:
                history.append(obs)
            step = driver.act(action)
            ctl.after_step(t, step.reward, step.terminated, step.truncated)
            obs, terminated, truncated = step.observation, step.terminated, step.truncated
            result.success = step.success
            t += 1
            done = terminated or truncated
    except RobotFault as exc:  # the robot is gone: end the episode cleanly, keep its data
        result.robot_fault = str(exc)
        terminated, truncated = False, True
    land(t)
    ctl.end(obs, scheduler.peek(t), terminated, truncated)
    result.steps, result.starved_steps = t, scheduler.starved_steps
    return result


def _land(scheduler: ChunkScheduler, reply: ChunkReply, step: int, result: EpisodeResult) -> None:
    flight = scheduler.in_flight
    if flight is None or flight.request.request_id != reply.request_id:
        return  # an abandoned request's late answer
    if reply.actions is None:  # the server could not answer it: give it up, request again
        scheduler.cancel()
        result.failed += 1
        return
    delay = step - flight.request.t0
    accepted = scheduler.deliver(reply.request_id, reply.actions, step, reply.meta)
    result.delays.append(delay)
    result.spikes += int(delay > scheduler.max_delay_steps)
    result.dropped += int(not accepted)
    result.request_log.append({"request_id": reply.request_id, "t0": flight.request.t0,
                               "assumed_delay": flight.request.delay_steps, "delay_steps": delay,
                               "accepted": accepted, **{k: v for k, v in reply.meta.items()
                                                        if isinstance(v, (int, float))}})
