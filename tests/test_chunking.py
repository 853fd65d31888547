"""Scheduler timeline properties under random delay sequences (property-based)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arli.chunking import ChunkScheduler, make_hold, validate_horizon
from arli.types import Observation

M = 2  # action dim: [request_id, slot] encoded in the chunk itself


def _chunk(request_id: int, H: int) -> np.ndarray:
    """Actions that name their own (request id, slot)."""
    return np.stack([np.full(H, request_id, np.float32), np.arange(H, dtype=np.float32)], axis=1)


def drive(sched: ChunkScheduler, delays: list[int], steps: int):
    """Sim-time loop: request, deliver after d steps, execute; returns the trace."""
    pending, executed, infos, requests = [], [], [], []
    it = iter(delays)
    def land(t):
        for arrival, rid in [p for p in pending if p[0] <= t]:
            pending.remove((arrival, rid))
            sched.deliver(rid, _chunk(rid, sched.chunk_size), t)

    for t in range(steps):
        land(t)  # replies that arrived during the last period come first
        if sched.should_request(t):
            d = next(it, delays[-1])
            req = sched.make_request(Observation(np.zeros(1), t), t, d)
            requests.append(req)
            pending.append((t + d, req.request_id))
            land(t)  # d = 0: the reply is there before the step runs
        info = sched.step(t)
        infos.append(info)
        executed.append(info.base_action.copy())
    return np.stack(executed), infos, requests


HOLD = make_hold(M)


@settings(max_examples=150, deadline=None)
@given(
    H=st.integers(4, 20),
    data=st.data(),
    strategy=st.sampled_from(["naive", "rtc", "blend"]),
)
def test_async_timeline_properties(H, data, strategy):
    d_max = data.draw(st.integers(0, H // 2))
    s = data.draw(st.integers(d_max, H - d_max).filter(lambda v: v >= 1))
    delays = data.draw(st.lists(st.integers(0, d_max), min_size=1, max_size=30))
    sched = ChunkScheduler(H, s, M, "async", strategy, d_max, blend_steps=2, hold=HOLD)
    executed, infos, requests = drive(sched, delays, 80)

    # 1. every step runs the slot scheduled for it, never a stale or repeated one
    seen = set()
    for info in infos:
        if info.index_in_chunk >= 0:
            key = (info.chunk_id, info.index_in_chunk)
            assert key not in seen
            seen.add(key)
            if strategy != "blend":
                np.testing.assert_array_equal(info.base_action, [info.chunk_id, info.index_in_chunk])
                req = requests[info.chunk_id]
                assert info.index_in_chunk == info.step - req.t0  # async: slot i <-> t0 + i
                assert info.index_in_chunk >= req.delay_steps  # stale slots never execute
        else:
            assert info.starved
    # 2. committed block = what really executes next (only certain actions are marked)
    for info in infos:
        for k in np.flatnonzero(info.committed_mask):
            t = info.step + 1 + k
            if t < len(executed):
                np.testing.assert_array_equal(info.committed[k], executed[t])
        n_valid = int(info.committed_mask.sum())
        assert info.committed_mask[:n_valid].all()  # valid entries form a prefix of the block
        assert not info.committed[n_valid:].any()  # padding is zero
    # 3. the committed prefix of each request is exactly what ran during its inference window
    for req in requests:
        if req.committed_prefix is not None:
            window = executed[req.t0:req.t0 + req.delay_steps]
            np.testing.assert_array_equal(req.committed_prefix[: len(window)], window)
    # 4. with s <= H - d_max the robot is never starved once the first chunk landed
    first = next(i for i, info in enumerate(infos) if not info.starved)
    assert not any(info.starved for info in infos[first:])
    assert sched.starved_steps == 0


@settings(max_examples=50, deadline=None)
@given(H=st.integers(2, 16), data=st.data())
def test_async_with_zero_delay_equals_sync(H, data):
    s = data.draw(st.integers(1, H))
    a, _, _ = drive(ChunkScheduler(H, s, M, "async", "naive", 0, hold=HOLD), [0], 60)
    b, _, _ = drive(ChunkScheduler(H, s, M, "sync", "naive", 0, hold=HOLD), [0], 60)
    np.testing.assert_array_equal(a, b)


def test_sync_holds_during_inference_then_runs_from_slot_zero():
    sched = ChunkScheduler(8, 4, M, "sync", "naive", 3, hold=HOLD)
    executed, infos, _ = drive(sched, [3], 20)
    assert all(infos[t].starved for t in range(3))
    np.testing.assert_array_equal(executed[3:7], _chunk(0, 8)[:4])
    assert all(infos[t].starved for t in range(7, 10))  # next inference window
    np.testing.assert_array_equal(executed[10:14], _chunk(1, 8)[:4])


def test_timing_features():
    sched = ChunkScheduler(8, 4, M, "async", "naive", 2, hold=HOLD)
    _, infos, _ = drive(sched, [2], 12)
    # request at 0 lands at 2; next request at 4 lands at 6
    assert [i.in_flight for i in infos[:7]] == [True, True, False, False, True, True, False]
    assert infos[4].steps_until_switch == 2 and infos[5].steps_until_switch == 1
    assert infos[5].steps_since_request == 1
    assert infos[5].in_flight and infos[5].request_obs.step == 4
    assert [i.index_in_chunk for i in infos[2:8]] == [2, 3, 4, 5, 2, 3]


def test_late_chunk_skips_stale_slots_and_fully_stale_chunk_is_dropped():
    sched = ChunkScheduler(4, 2, M, "async", "naive", 2, hold=HOLD)
    req = sched.make_request(Observation(np.zeros(1), 0), 0, 1)
    assert not sched.deliver(req.request_id, _chunk(0, 4), 4)  # all 4 slots in the past
    assert sched.step(4).starved
    req = sched.make_request(Observation(np.zeros(1), 5), 5, 1)
    assert sched.deliver(req.request_id, _chunk(1, 4), 7)  # one step later than expected
    info = sched.step(7)
    assert info.index_in_chunk == 2  # slot for step 7, not slot 1 executed late


def test_chunk_running_out_is_counted_as_starvation():
    sched = ChunkScheduler(4, 4, M, "async", "naive", 0, hold=HOLD)
    req = sched.make_request(Observation(np.zeros(1), 0), 0, 0)
    sched.deliver(req.request_id, _chunk(0, 4), 0)
    for t in range(4):
        assert not sched.step(t).starved
    sched.make_request(Observation(np.zeros(1), 4), 4, 3)  # late reply: steps 4..6 uncovered
    assert all(sched.step(t).starved for t in (4, 5, 6))
    assert sched.starved_steps == 3


def test_deliver_rejects_bad_chunks():
    sched = ChunkScheduler(4, 2, M, "async", "naive", 1, hold=HOLD)
    req = sched.make_request(Observation(np.zeros(1), 0), 0, 1)
    with pytest.raises(ValueError, match="shape"):
        sched.deliver(req.request_id, np.zeros((3, M)), 1)
    bad = _chunk(0, 4)
    bad[2, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        sched.deliver(req.request_id, bad, 1)
    assert not sched.deliver(99, _chunk(0, 4), 1)  # answers no in-flight request


def test_blend_is_continuous_at_the_switch():
    H = 8
    chunk = lambda v: np.full((H, M), v, np.float32)  # noqa: E731
    out = {}
    for strategy in ("naive", "blend"):
        sched = ChunkScheduler(H, 4, M, "async", strategy, 1, blend_steps=3, hold=HOLD)
        acts = []
        for t in range(9):
            if sched.should_request(t):
                req = sched.make_request(Observation(np.zeros(1), t), t, 1)
            if t in (1, 5):
                sched.deliver(req.request_id, chunk(0.0 if t == 1 else 1.0), t)
            acts.append(sched.step(t).base_action[0])
        out[strategy] = np.array(acts)
    assert np.max(np.abs(np.diff(out["naive"][1:]))) == pytest.approx(1.0)
    assert np.max(np.abs(np.diff(out["blend"][1:]))) <= 0.26


@pytest.mark.parametrize("H,s,d,msg", [
    (8, 6, 3, r"execute_horizon must be in \[3, 5\]"),
    (8, 2, 3, r"execute_horizon must be in \[3, 5\]"),
    (8, 4, 5, "no execute_horizon works: use chunk_size >= 10"),
    (8, 9, 0, r"in \[1, chunk_size=8\]"),
])
def test_impossible_execute_horizon_is_a_clear_error(H, s, d, msg):
    with pytest.raises(ValueError, match=msg):
        validate_horizon(H, s, d, "async")


def test_peek_matches_step_and_changes_nothing():
    sched = ChunkScheduler(8, 4, M, "async", "naive", 2, hold=make_hold(M, absolute_dims=(1,)))
    executed, infos, _ = drive(sched, [2], 12)
    state = (sched._last_step, sched._last_slot, sched.starved_steps)
    peeked = sched.peek(12)
    assert (sched._last_step, sched._last_slot, sched.starved_steps) == state
    stepped = sched.step(12)
    np.testing.assert_array_equal(peeked.base_action, stepped.base_action)
    np.testing.assert_array_equal(peeked.committed, stepped.committed)
    assert peeked.request_obs is not None and peeked.request_obs.step == 8


def test_holds_keep_the_gripper_in_committed_and_prefix():
    """Absolute dims (the gripper) are held at the last value through chained holds."""
    hold = make_hold(M, absolute_dims=(1,))
    sched = ChunkScheduler(4, 2, M, "async", "rtc", 2, hold=hold)
    req = sched.make_request(Observation(np.zeros(1), 0), 0, 0)
    sched.deliver(req.request_id, _chunk(0, 4), 0)
    for t in range(3):
        sched.step(t)
    # chunk 0 covers steps 0..3; steps 4, 5 would be holds keeping slot 3's value (3.0)
    req = sched.make_request(Observation(np.zeros(1), 3), 3, 3)
    np.testing.assert_array_equal(req.committed_prefix[:, 1], [3.0, 3.0, 3.0])
    info = sched.step(3)
    np.testing.assert_array_equal(info.committed[:2, 1], [3.0, 3.0])
