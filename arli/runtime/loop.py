"""The robot runtime: one control loop, the same in sim time and on a real clock.

Every control step t::

    wait for tick t  ->  land replies  ->  maybe request a chunk (o_t)  ->  scheduler: b_t, StepInfo
    ->  controller: a_t (ARLI state -> residual, or the intervener)  ->  driver executes a_t
    ->  controller sees (r_t, done)

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

from arli.chunking import ChunkScheduler
from arli.interfaces import InferenceEndpoint, StepController
from arli.runtime.clock import MonotonicClock, SimClock
from arli.types import ChunkReply, Observation
from robot_drivers.base import RobotDriver, RobotFault


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
    sim_unstable: bool = False  # the simulator reset an unstable state: the episode ended there
    request_log: list[dict] = field(default_factory=list)  # one entry per landed reply


class Episode:
    """One episode of the control loop, one control step per ``step()`` call.

    ``run_episode`` runs it to the end; a finetuning run steps it itself, so that its
    per-step loop (step, take the transitions, run the owed updates) reads top to bottom
    with this loop underneath. ``finish()`` ends the episode (the controller's ``end``).
    """

    def __init__(self, driver: RobotDriver, inference: InferenceEndpoint, scheduler: ChunkScheduler,
                 clock: SimClock | MonotonicClock, seed: int, controller: StepController | None = None,
                 request_timeout_steps: int | None = None):
        self.driver, self.inference, self.scheduler, self.clock = driver, inference, scheduler, clock
        self.ctl = controller or StepController()
        self.obs = driver.reset(seed)
        inference.begin_episode(seed)
        scheduler.reset()
        self.ctl.begin_episode()
        self.history: deque[Observation] = deque(maxlen=max(int(inference.n_obs_steps) - 1, 0))
        self.result = EpisodeResult(False, 0, 0, 0)
        self.timeout = request_timeout_steps or 10 * scheduler.chunk_size
        self.t, self.done, self.terminated, self.truncated = 0, False, False, False
        clock.start()

    def _land(self, step: int) -> None:
        for reply in self.inference.poll(step):
            _land(self.scheduler, reply, step, self.result)

    def step(self) -> bool:
        """Control step t: wait for the tick, land replies, maybe request, act, see the outcome.
        Returns whether an action was executed (False: the robot failed before it ran)."""
        t, inference, scheduler, result = self.t, self.inference, self.scheduler, self.result
        try:
            self.clock.wait(t, inference.drain, self.ctl.warm)
            obs = self.obs = self.driver.observe()  # o_t, captured at the tick
            self._land(t)  # replies that arrived during the last period switch in first
            flight = scheduler.in_flight
            if not inference.healthy():
                if scheduler.active is not None or flight is not None:
                    scheduler.abort()  # hold now: the plan's future is gone with its server
                result.server_lost_steps += 1
            elif flight is not None and t - flight.request.t0 > self.timeout:
                scheduler.cancel()
                result.abandoned += 1
            if inference.healthy() and scheduler.should_request(t):
                request = scheduler.make_request(obs, t, inference.next_delay())
                if inference.submit(request, list(self.history)):
                    result.requests += 1
                    self._land(t)  # d = 0 in sim time: available before this step runs
                else:
                    scheduler.cancel()
            info = scheduler.step(t)
            action = self.ctl.act(t, obs, info)
            if self.history.maxlen:
                self.history.append(obs)
            out = self.driver.act(action)
            self.ctl.after_step(t, out.reward, out.terminated, out.truncated)
            self.obs, self.terminated, self.truncated = out.observation, out.terminated, out.truncated
            result.success = out.success
            result.sim_unstable = bool(out.info.get("sim_unstable", False))
            self.t = t + 1
            self.done = out.terminated or out.truncated
            return True
        except RobotFault as exc:  # the robot is gone: end the episode cleanly, keep its data
            result.robot_fault = str(exc)
            self.terminated, self.truncated, self.done = False, True, True
            return False

    def finish(self) -> EpisodeResult:
        """End the episode: late replies land, the controller sees the final observation."""
        self._land(self.t)
        self.ctl.end(self.obs, self.scheduler.peek(self.t), self.terminated, self.truncated)
        self.result.steps, self.result.starved_steps = self.t, self.scheduler.starved_steps
        return self.result


def run_episode(driver: RobotDriver, inference: InferenceEndpoint, scheduler: ChunkScheduler,
                clock: SimClock | MonotonicClock, seed: int, controller: StepController | None = None,
                request_timeout_steps: int | None = None) -> EpisodeResult:
    """One episode of the control loop; returns what happened (success, delays, faults)."""
    episode = Episode(driver, inference, scheduler, clock, seed, controller, request_timeout_steps)
    while not episode.done:
        episode.step()
    return episode.finish()


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
