"""Chunk scheduler: asynchronous / synchronous chunk execution with switch strategies.

Timeline (DESIGN.md §2), async: at ``t0`` the observation is captured and a request sent;
steps ``t0 .. t0+d-1`` keep executing the previous chunk (the committed prefix); the new
chunk lands at ``t0+d`` and execution continues at its slot ``d``. Sync: the robot holds
for ``d`` steps, then executes slots ``0 .. s-1``.

Invariants enforced here (and property-tested): an action is only ever taken from the slot
scheduled for the current step (``slot = step - chunk.start_step``), so a late chunk skips
its stale slots instead of executing them late, and no slot runs twice; when no chunk
covers the current step the scheduler executes the hold action, never a stale one.

The scheduler is clock-agnostic: the caller says which step it is, sends requests when
``should_request`` says so and calls ``deliver`` when a reply arrives (after ``d`` steps
of sim time, or whenever a real reply comes in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from arli.errors import require
from arli.latency import to_delay_steps
from arli.types import ActionChunk, ChunkRequest, Observation, StepInfo

Mode = Literal["async", "sync"]
Strategy = Literal["naive", "blend", "rtc"]
MODES = ("async", "sync")
STRATEGIES = ("naive", "blend", "rtc")  # how an asynchronous run switches to the next chunk
EXECUTIONS = ("sync", *STRATEGIES)  # a run's chunking.strategy: sync = synchronous execution
HoldFn = Callable[[np.ndarray | None], np.ndarray]


@dataclass
class ChunkingConfig:
    """How base chunks execute: the ``chunking`` group of every command that builds a
    scheduler. The chunk size H is the policy's; the delay the scheduler plans for comes from
    the latency settings unless ``planned_delay_steps`` says it (a robot measures latency,
    it cannot know it in advance)."""

    strategy: str = "naive"  # sync | naive | blend | rtc
    execute_horizon: int = 8  # s, clamped into [d, H - d] for asynchronous execution
    blend_steps: int = 4  # blend: steps of the cross-fade
    planned_delay_steps: int | None = None  # d the scheduler plans for; null = the latency model's maximum
    min_delay_steps: int | None = None  # no reply lands earlier; null = the latency model's minimum

    def validate(self) -> None:
        require(self.strategy in EXECUTIONS, "chunking.strategy", f"one of {EXECUTIONS}", self.strategy)
        require(self.execute_horizon >= 1, "chunking.execute_horizon", ">= 1", self.execute_horizon)
        require(self.blend_steps >= 1, "chunking.blend_steps", ">= 1", self.blend_steps)
        for name in ("planned_delay_steps", "min_delay_steps"):
            value = getattr(self, name)
            require(value is None or value >= 0, f"chunking.{name}", "null or >= 0", value)
        if self.planned_delay_steps is not None and self.min_delay_steps is not None:
            require(self.min_delay_steps <= self.planned_delay_steps, "chunking.min_delay_steps",
                    f"<= chunking.planned_delay_steps ({self.planned_delay_steps})", self.min_delay_steps)


def delay_bounds(cfg: ChunkingConfig, max_latency_s: float, min_latency_s: float, dt: float) -> tuple[int, int]:
    """(planned, minimum) delay in steps: ``cfg``'s where it sets them, else the latency model's."""
    planned = cfg.planned_delay_steps if cfg.planned_delay_steps is not None else to_delay_steps(max_latency_s, dt)
    low = cfg.min_delay_steps if cfg.min_delay_steps is not None else to_delay_steps(min_latency_s, dt)
    return planned, min(low, planned)


def make_scheduler(cfg: ChunkingConfig, chunk_size: int, action_dim: int, delay_steps: int,
                   min_delay_steps: int = 0, strategy: str | None = None) -> ChunkScheduler:
    """The scheduler every call site builds: ``cfg``'s strategy (or ``strategy``), the
    planned delay capped at H // 2 for asynchronous execution (a longer reply is a spike the
    runtime holds through and counts), s clamped into [d, H - d], the gripper-keeping hold."""
    strategy = cfg.strategy if strategy is None else strategy
    require(strategy in EXECUTIONS, "chunking.strategy", f"one of {EXECUTIONS}", strategy)
    if strategy == "sync":
        return ChunkScheduler(chunk_size, cfg.execute_horizon, action_dim, "sync", "naive",
                              delay_steps, cfg.blend_steps, hold=gripper_hold(action_dim),
                              min_delay_steps=min(min_delay_steps, delay_steps))
    d = min(delay_steps, chunk_size // 2)
    horizon = min(max(cfg.execute_horizon, d), chunk_size - d)
    return ChunkScheduler(chunk_size, horizon, action_dim, "async", strategy, d, cfg.blend_steps,
                          hold=gripper_hold(action_dim), min_delay_steps=min(min_delay_steps, d))


def gripper_hold(action_dim: int = 5) -> HoldFn:
    """Hold for our delta-action tasks: no motion, keep the gripper command (the last entry)."""
    return make_hold(action_dim, absolute_dims=(action_dim - 1,))


def make_hold(action_dim: int, absolute_dims: tuple[int, ...] = ()) -> HoldFn:
    """Hold action for delta-action robots: zero motion, absolute dims (gripper) kept.

    Returns f(last_action (m,) | None) -> (m,).
    """

    def hold(last: np.ndarray | None) -> np.ndarray:
        out = np.zeros(action_dim, dtype=np.float32)
        if last is not None and absolute_dims:
            out[list(absolute_dims)] = last[list(absolute_dims)]
        return out

    return hold


def validate_horizon(chunk_size: int, execute_horizon: int, max_delay_steps: int, mode: str) -> None:
    """Raise ValueError unless ``d_max <= s <= H - d_max`` (async) / ``1 <= s <= H`` (sync)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not 1 <= execute_horizon <= chunk_size:
        raise ValueError(f"execute_horizon must be in [1, chunk_size={chunk_size}], got {execute_horizon}")
    if max_delay_steps < 0:
        raise ValueError(f"delay_steps must be >= 0, got {max_delay_steps}")
    if mode == "async":
        lo, hi = max_delay_steps, chunk_size - max_delay_steps
        if not lo <= execute_horizon <= hi:
            raise ValueError(
                f"async execution needs delay_steps <= execute_horizon <= chunk_size - delay_steps; "
                f"with chunk_size={chunk_size} and max delay_steps={max_delay_steps} "
                + (f"execute_horizon must be in [{lo}, {hi}]" if lo <= hi else
                   f"no execute_horizon works: use chunk_size >= {2 * max_delay_steps}")
                + f", got {execute_horizon}"
            )


@dataclass
class _InFlight:
    request: ChunkRequest
    expected_arrival: int


class ChunkScheduler:
    """Decides which base action runs at every control step.

    Args:
        chunk_size: H, actions per chunk.
        execute_horizon: s, actions executed per chunk before the next request.
        action_dim: m.
        mode: "async" or "sync".
        strategy: "naive" (switch), "blend" (linear cross-fade over ``blend_steps``) or
            "rtc" (switch; requests carry the committed prefix for the policy's guidance).
        max_delay_steps: bound on d used to validate ``execute_horizon``.
        hold: hold-action function (see ``make_hold``).
        committed_len: K, length of the committed block in ``StepInfo`` (default H).
        min_delay_steps: lower bound on d. A request not yet sent cannot land before it, so
            the steps up to the next request + ``min_delay_steps`` - 1 are committed too.
    """

    def __init__(
        self,
        chunk_size: int,
        execute_horizon: int,
        action_dim: int,
        mode: Mode = "async",
        strategy: Strategy = "naive",
        max_delay_steps: int = 0,
        blend_steps: int = 4,
        hold: HoldFn | None = None,
        committed_len: int | None = None,
        min_delay_steps: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if blend_steps < 1:
            raise ValueError(f"blend_steps must be >= 1, got {blend_steps}")
        validate_horizon(chunk_size, execute_horizon, max_delay_steps, mode)
        if not 0 <= min_delay_steps <= max_delay_steps:
            raise ValueError(f"min_delay_steps must be in [0, max_delay_steps={max_delay_steps}], "
                             f"got {min_delay_steps}")
        self.min_delay_steps = min_delay_steps
        self.chunk_size, self.execute_horizon, self.action_dim = chunk_size, execute_horizon, action_dim
        self.mode, self.strategy = mode, strategy
        self.max_delay_steps, self.blend_steps = max_delay_steps, blend_steps
        self.hold = hold or make_hold(action_dim)
        self.committed_len = committed_len or chunk_size
        self.reset()

    def reset(self) -> None:
        self.active: ActionChunk | None = None
        self.previous: ActionChunk | None = None  # blended out after a switch
        self.switch_step = -1  # step at which ``active`` took over
        self.in_flight: _InFlight | None = None
        self.next_request_step = 0
        self.last_request_step = -1
        self.last_request_obs: Observation | None = None
        self.last_delay_steps = 0
        self._next_request_id = 0
        self._last_step = -1
        self._last_action: np.ndarray | None = None
        self._last_slot: tuple[int, int] = (-1, -1)
        self.starved_steps = 0

    # -- requests ----------------------------------------------------------------------
    def should_request(self, step: int) -> bool:
        """Whether the observation of ``step`` should be sent for a new chunk."""
        if self.in_flight is not None:
            return False
        if self.mode == "sync":
            return self.active is None or step >= self.active.start_step + self.execute_horizon
        return step >= self.next_request_step

    def make_request(self, observation: Observation, step: int, delay_steps: int) -> ChunkRequest:
        """Register a request sent at ``step`` expected to take ``delay_steps`` steps.

        The committed prefix (d, m) holds the actions that will execute at steps
        step .. step+d-1 whatever the new chunk says.
        """
        if self.in_flight is not None:
            raise RuntimeError("a request is already in flight; wait for it (should_request)")
        if delay_steps < 0:
            raise ValueError(f"delay_steps must be >= 0, got {delay_steps}")
        prefix = guidance = None
        if self.mode == "async" and self.strategy == "rtc":
            prefix = self._rollout(step, delay_steps, self._last_action)
            tail = []  # what the active chunk planned beyond the prefix, over the overlap
            for k in range(delay_steps, self.chunk_size - self.execute_horizon):
                planned = self._chunk_action(self.active, step + k)
                if planned is None:
                    break
                tail.append(planned)
            guidance = np.concatenate([prefix, np.stack(tail)]).astype(np.float32) if tail else prefix
        request = ChunkRequest(self._next_request_id, step, observation, delay_steps, prefix, guidance,
                               self.execute_horizon)
        self._next_request_id += 1
        self.in_flight = _InFlight(request, step + delay_steps)
        self.last_request_step = step
        self.last_request_obs = observation
        self.last_delay_steps = delay_steps
        self.next_request_step = step + self.execute_horizon
        return request

    def deliver(self, request_id: int, actions: np.ndarray, step: int, meta: dict | None = None) -> bool:
        """A chunk (H, m) for ``request_id`` arrived before control step ``step`` runs.

        Returns False (chunk dropped) if it answers no in-flight request or all of its
        slots are already in the past.
        """
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (self.chunk_size, self.action_dim):
            raise ValueError(
                f"chunk must have shape (chunk_size={self.chunk_size}, action_dim={self.action_dim}), "
                f"got {actions.shape}"
            )
        if not np.all(np.isfinite(actions)):
            raise ValueError("chunk contains NaN/inf actions; refusing to schedule it")
        flight = self.in_flight
        if flight is None or flight.request.request_id != request_id:
            return False
        self.in_flight = None
        t0 = flight.request.t0
        start = t0 if self.mode == "async" else step
        self.last_delay_steps = step - t0
        if start + self.chunk_size <= step:  # every slot is stale
            return False
        if self.mode == "sync":
            # the next request comes s actions after the chunk starts
            self.next_request_step = start + self.execute_horizon
        chunk = ActionChunk(actions, request_id, t0, start, dict(meta or {}), flight.request.observation)
        self.previous, self.active, self.switch_step = self.active, chunk, step
        return True

    def cancel(self) -> None:
        """Give up the in-flight request (timed out, or never sent): the next step may
        request again; a late reply to it is then ignored by ``deliver``."""
        if self.in_flight is not None:
            self.next_request_step = self.in_flight.request.t0
        self.in_flight = None

    def abort(self) -> None:
        """The inference server is gone: drop the in-flight request and the active chunk.
        The robot holds from this step until a new chunk lands (requested at once)."""
        self.in_flight = self.active = self.previous = None
        self.next_request_step = 0

    # -- execution ---------------------------------------------------------------------
    def _chunk_action(self, chunk: ActionChunk | None, step: int) -> np.ndarray | None:
        if chunk is None:
            return None
        slot = chunk.slot_for(step)
        return chunk.actions[slot] if 0 <= slot < chunk.chunk_size else None

    def _scheduled(self, step: int, last: np.ndarray | None = None) -> np.ndarray:
        """Action that will run at ``step`` if no new chunk lands before it. (m,)

        ``last``: the action executed just before (what a hold keeps the gripper at).
        """
        last = self._last_action if last is None else last
        if self.mode == "sync" and self.in_flight is not None:
            return self.hold(last)
        new = self._chunk_action(self.active, step)
        if new is None:
            return self.hold(last)
        if self.strategy == "blend" and self.previous is not None:
            k = step - self.switch_step
            old = self._chunk_action(self.previous, step)
            if old is not None and 0 <= k < self.blend_steps:
                w = (k + 1) / (self.blend_steps + 1)
                return ((1.0 - w) * old + w * new).astype(np.float32)
        return new

    def _rollout(self, start: int, count: int, last: np.ndarray | None) -> np.ndarray:
        """Scheduled actions for steps start .. start+count-1, holds chained. (count, m)"""
        out = np.zeros((count, self.action_dim), np.float32)
        for k in range(count):
            out[k] = last = self._scheduled(start + k, last)
        return out

    def _certain_until(self, step: int) -> int:
        """First step after ``step`` whose action may still change (a chunk could land)."""
        if self.in_flight is not None:
            return self.in_flight.expected_arrival
        if self.mode == "sync":
            return self.next_request_step if self.active is not None else step + 1
        # the next request is sent at next_request_step and lands min_delay_steps later at the
        # earliest: until then the active chunk (or the hold) runs whatever the residual does
        return max(self.next_request_step, step + 1) + self.min_delay_steps

    def step(self, step: int) -> StepInfo:
        """Action for control step ``step`` (call once per step, increasing)."""
        if step <= self._last_step:
            raise RuntimeError(f"steps must increase: got {step} after {self._last_step}")
        info = self.peek(step)
        if info.starved:
            # starvation = the active chunk ran out (not the planned sync hold or first wait)
            sync_wait = self.mode == "sync" and self.in_flight is not None
            self.starved_steps += int(self.active is not None and not sync_wait)
        else:
            key = (info.chunk_id, info.index_in_chunk)
            assert key > self._last_slot, f"slot {key} executed after {self._last_slot}"
            self._last_slot = key
        self._last_step = step
        self._last_action = info.base_action
        return info

    def peek(self, step: int) -> StepInfo:
        """What ``step(step)`` would return, without advancing (e.g. the state after the
        last step of an episode, for bootstrapping)."""
        action = np.array(self._scheduled(step), dtype=np.float32)
        active = self.active
        slot = -1
        holding = (self.mode == "sync" and self.in_flight is not None) or active is None
        if not holding:
            slot = active.slot_for(step)
            if not 0 <= slot < active.chunk_size:
                holding, slot = True, -1
        K = self.committed_len
        committed = np.zeros((K, self.action_dim), np.float32)
        mask = np.zeros(K, dtype=bool)
        horizon = max(0, min(K, self._certain_until(step) - step - 1))
        committed[:horizon] = self._rollout(step + 1, horizon, action)
        mask[:horizon] = True
        flight = self.in_flight
        if flight is not None:
            until_switch = flight.expected_arrival - step
        else:
            until_switch = self.next_request_step + self.last_delay_steps - step
        return StepInfo(
            step=step,
            base_action=action,
            committed=committed,
            committed_mask=mask,
            steps_since_request=step - self.last_request_step if self.last_request_step >= 0 else -1,
            steps_until_switch=int(until_switch),
            index_in_chunk=slot,
            chunk_id=active.request_id if active is not None and slot >= 0 else -1,
            in_flight=flight is not None,
            delay_steps=self.last_delay_steps,
            starved=holding,
            request_obs=self.last_request_obs,
            chunk_obs=active.observation if slot >= 0 else None,
            chunk_actions=active.actions if slot >= 0 else None,
        )
