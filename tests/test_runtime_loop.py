"""The runtime loop in sim time: latency spikes longer than a chunk are held through and
counted (never refused, never executed stale), and a recorded trace with such a spike runs."""

from __future__ import annotations

import json

import numpy as np

from arli.chunking import ChunkScheduler
from arli.latency import TraceLatency
from arli.policies.expert import ExpertChunkPolicy
from arli.chunking import ChunkingConfig, gripper_hold
from arli.rollout import evaluate_policy
from arli.runtime.clock import MonotonicClock, SimClock
from arli.runtime.inference import SimInference
from arli.runtime.loop import StepController, run_episode
from robot_drivers.sim import SimDriver
from sim_envs import make_env


class Log(StepController):
    def __init__(self):
        self.rows = []

    def act(self, t, obs, info):
        self.rows.append((t, info.starved, info.chunk_id, info.index_in_chunk))
        return info.base_action


def test_a_spike_longer_than_the_chunk_is_held_through_then_recovered():
    # request 0: 2 steps; request 1 (sent at step 8): 20 steps, longer than the chunk's 16 slots
    latency = TraceLatency((0.1, 1.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1))
    env = make_env("pick_cube", max_episode_steps=80)
    driver = SimDriver(env)
    sched = ChunkScheduler(16, 8, 5, "async", "naive", 8, hold=gripper_hold())  # d capped at H // 2
    log = Log()
    result = run_episode(driver, SimInference(ExpertChunkPolicy("pick_cube", 16), latency,
                                              np.random.default_rng(0), 0.05), sched, SimClock(0.05), 0, log)
    assert result.spikes == 1 and result.dropped == 1  # landed at step 28: all 16 slots of it are past
    by_step = {t: (starved, chunk) for t, starved, chunk, _ in log.rows}
    assert all(by_step[t][1] == 0 for t in range(2, 16))  # chunk 0 runs out at step 16 ...
    assert all(by_step[t][0] for t in range(16, 30))  # ... then the robot holds (nothing stale runs)
    assert not by_step[30][0] and by_step[30][1] == 2  # re-requested at 28, lands at 30: running again


def test_a_recorded_trace_with_spikes_runs_instead_of_being_refused(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([0.12, 0.15, 0.9, 0.14, 0.13, 0.6, 0.12]))  # max 18 steps > H - s
    latency = TraceLatency.from_file(str(trace))
    env = make_env("pick_cube")
    cell = evaluate_policy(env, ExpertChunkPolicy("pick_cube", 16), ChunkingConfig(), latency, episodes=3, seed=0)
    assert cell["delay_steps"] == 18 and cell["execute_horizon"] == 8  # planned for d <= H // 2 = 8
    assert cell["latency_spikes"] >= 1 and cell["episodes"] == 3


def test_the_spin_keeps_warming_until_its_margin_then_only_spins(monkeypatch):
    """warm() repeats through the spin (one call does not wake a slept vCPU) and stops
    warm_margin_s before the tick, so the tick itself stays punctual. On a fake clock (every
    reading advances it 0.1 ms, a sleep by its length): a loaded VM cannot make it flaky."""
    import arli.runtime.clock as clock_module  # noqa: PLC0415

    class FakeTime:
        now = 100.0

        def perf_counter(self) -> float:
            self.now += 1e-4
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds

    fake = FakeTime()
    monkeypatch.setattr(clock_module, "time", fake)
    clock = MonotonicClock(0.05, spin_s=0.004, warm_margin_s=0.001)
    calls: list[float] = []
    clock.start()
    clock.wait(1, warm=lambda: calls.append(fake.now))
    target = clock.t_start + 0.05
    assert len(calls) > 5  # repeated through the 4 ms spin, not once
    assert min(calls) >= target - 0.004 - 1e-3  # in the spin, not before the sleep
    assert max(calls) < target - 0.001 + 2e-4  # none inside the margin (one reading's step of slack)
    assert max(calls) > target - 0.001 - 5e-4  # and it warmed up to the margin
    assert 0 <= clock.errors[-1] <= 2e-4
