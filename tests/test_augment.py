"""ARLI state construction against the scheduler, under random delay sequences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arli.augment import VARIANTS, StateBuilder, split_slots
from arli.chunking import ChunkScheduler, make_hold
from arli.types import Observation

N, M = 3, 2


def drive(sched, delays, steps, builders):
    """Sim-time loop recording, per step, the built states and what executed."""
    pending, executed, states, infos, obs_log = [], [], {v: [] for v in builders}, [], []
    it = iter(delays)
    rng = np.random.default_rng(0)

    def land(t):
        for arrival, rid in [p for p in pending if p[0] <= t]:
            pending.remove((arrival, rid))
            sched.deliver(rid, rng.uniform(-1, 1, (sched.chunk_size, M)), t)

    for t in range(steps):
        obs = np.full(N, float(t))  # the observation names its step
        land(t)
        if sched.should_request(t):
            d = next(it, delays[-1])
            req = sched.make_request(Observation(obs, t), t, d)
            pending.append((t + d, req.request_id))
            land(t)
        info = sched.step(t)
        for v, b in builders.items():
            states[v].append(b.build(obs, info))
        infos.append(info)
        executed.append(info.base_action)
    return np.array(executed), states, infos


@settings(max_examples=60, deadline=None)
@given(H=st.integers(4, 16), data=st.data())
def test_augmented_state_matches_the_scheduler(H, data):
    d_max = data.draw(st.integers(0, H // 2))
    s = data.draw(st.integers(max(d_max, 1), max(H - d_max, 1)))
    delays = data.draw(st.lists(st.integers(0, d_max), min_size=1, max_size=20))
    sched = ChunkScheduler(H, s, M, "async", "naive", d_max, hold=make_hold(M))
    builders = {v: StateBuilder(v, N, M, H, include_planned_obs=True) for v in VARIANTS}
    executed, states, infos = drive(sched, delays, 60, builders)
    lay = builders["arli"].layout
    for t, (state, info) in enumerate(zip(states["arli"], infos)):
        np.testing.assert_array_equal(state[lay.obs], np.full(N, t))  # fresh observation
        np.testing.assert_array_equal(state[lay.base_action], executed[t])
        committed = state[lay.committed].reshape(H, M)
        mask = state[lay.mask].astype(bool)
        for k in np.flatnonzero(mask):  # every marked committed action is what executes
            if t + 1 + k < len(executed):
                np.testing.assert_allclose(committed[k], executed[t + 1 + k], atol=1e-6)
        assert not committed[~mask].any()
        ti = state[lay.timing] * H
        np.testing.assert_allclose(ti[:3], [info.steps_since_request, info.steps_until_switch,
                                            info.index_in_chunk], atol=1e-5)
        if info.in_flight:  # o_t0 of the in-flight chunk, flagged
            assert state[lay.planned_obs][-1] == 1.0
            np.testing.assert_array_equal(state[lay.planned_obs][:N], np.full(N, info.planned_obs.step))
        # no_midobs sees the request observation instead of the fresh one
        stale = states["arli_no_midobs"][t][:N]
        np.testing.assert_array_equal(stale, np.full(N, info.request_obs.step))
        assert info.request_obs.step <= t
    assert states["standard"][0].shape == (N + M,)
    assert states["arli_no_committed"][0].shape[0] == builders["arli"].dim - H * M - H


def test_variant_validation_and_normalisation():
    with pytest.raises(ValueError, match="one of"):
        StateBuilder("delayed", N, M, 8)
    b = StateBuilder("standard", N, M, 8, obs_mean=np.ones(N), obs_std=2 * np.ones(N))
    sched = ChunkScheduler(8, 4, M, "async", "naive", 0, hold=make_hold(M))
    req = sched.make_request(Observation(np.zeros(N), 0), 0, 0)
    sched.deliver(req.request_id, np.ones((8, M)), 0)
    state = b.build(np.full(N, 5.0), sched.step(0))
    np.testing.assert_array_equal(state, [2, 2, 2, 1, 1])


def test_chunk_mode_slot_split():
    # chunk planned at t0 = 10 (slot i <-> step 10 + i), landed at 13, replaced at 19
    split = split_slots(switch_in=13, switch_out=19, chunk_start=10, chunk_size=16)
    assert list(split["committed"]) == [0, 1, 2]
    assert list(split["executed"]) == [3, 4, 5, 6, 7, 8]
    assert list(split["discarded"]) == list(range(9, 16))
    # replaced before it ever ran: nothing executed, all discarded after the committed part
    split = split_slots(13, 12, 10, 16)
    assert list(split["executed"]) == [] and list(split["discarded"])[0] == 3


def test_chunk_decision_from_mid_inference_observation():
    from arli.augment import chunk_decision

    H, d, m_into = 12, 4, 2
    sched = ChunkScheduler(H, 6, M, "async", "naive", d, hold=make_hold(M))  # requests 0, 6, 12, 18
    executed, _, infos = drive(sched, [d], 30, {})
    # request at t0 = 12 lands at 16; the decision observation is taken at 12 + m = 14
    info = infos[12 + m_into]
    new_chunk = np.full((H, M), 0.5)
    dec = chunk_decision(np.full(N, 14.0), info, new_chunk)
    n_valid = int(dec.committed_mask.sum())
    assert n_valid == d - m_into - 1  # steps 15 .. 15 (the window ends when the chunk lands at 16)
    np.testing.assert_allclose(dec.committed[:n_valid], executed[15:15 + n_valid])
    assert dec.vector().shape == (N + H * M + H + H * M,)
    with pytest.raises(ValueError, match="inference window"):
        chunk_decision(np.zeros(N), infos[17], new_chunk)
