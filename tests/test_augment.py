"""ARLI state construction against the scheduler, under random delay sequences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arli.augment import VARIANTS, StateBuilder
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
    d_min = data.draw(st.integers(0, d_max))
    s = data.draw(st.integers(max(d_max, 1), max(H - d_max, 1)))
    delays = data.draw(st.lists(st.integers(d_min, d_max), min_size=1, max_size=20))
    sched = ChunkScheduler(H, s, M, "async", "naive", d_max, hold=make_hold(M), min_delay_steps=d_min)
    builders = {v: StateBuilder(v, N, M, H, episode_steps=60) for v in VARIANTS}
    executed, states, infos = drive(sched, delays, 60, builders)
    lay = builders["arli"].layout
    for t, (state, info) in enumerate(zip(states["arli"], infos)):
        np.testing.assert_array_equal(state[lay.obs], np.full(N, t))  # fresh observation
        np.testing.assert_array_equal(state[lay.base_action], executed[t])
        assert state[lay.progress][0] == pytest.approx(t / 60)
        committed = state[lay.committed].reshape(H, M)
        mask = state[lay.mask].astype(bool)
        assert not mask[np.argmin(mask):].any()  # the valid part is a prefix
        for k in np.flatnonzero(mask):  # every marked committed action is what executes
            if t + 1 + k < len(executed):
                np.testing.assert_allclose(committed[k], executed[t + 1 + k], atol=1e-6)
        assert not committed[~mask].any()
        ti = state[lay.timing] * H
        np.testing.assert_allclose(ti, [info.steps_since_request, info.steps_until_switch,
                                        info.index_in_chunk, float(info.in_flight) * H,
                                        info.delay_steps], atol=1e-5)
        # no_midobs sees the request observation instead of the fresh one
        stale = states["arli_no_midobs"][t][:N]
        np.testing.assert_array_equal(stale, np.full(N, info.request_obs.step))
        assert info.request_obs.step <= t
        # stepwise: fresh observation + base action + progress, nothing else
        np.testing.assert_allclose(states["stepwise"][t], np.r_[np.full(N, t), executed[t], t / 60], rtol=1e-6)
    assert states["arli_no_committed"][0].shape[0] == builders["arli"].dim - H * M - H


@settings(max_examples=40, deadline=None)
@given(H=st.integers(4, 16), data=st.data())
def test_standard_state_is_fixed_at_its_request(H, data):
    """Latency-unaware RL decides with the base request: its state at a step is a function of
    the executing chunk's request observation, the chunk and the slot, nothing fresher; and
    only slots from d on (the ones that execute) ever produce a state."""
    d_max = data.draw(st.integers(0, H // 2))
    s = data.draw(st.integers(max(d_max, 1), max(H - d_max, 1)))
    delays = data.draw(st.lists(st.integers(0, d_max), min_size=1, max_size=20))
    sched = ChunkScheduler(H, s, M, "async", "naive", d_max, hold=make_hold(M))
    builder = StateBuilder("standard", N, M, H, episode_steps=60)
    lay = builder.layout
    executed, states, infos = drive(sched, delays, 60, {"standard": builder})
    for t, (state, info) in enumerate(zip(states["standard"], infos)):
        if info.index_in_chunk < 0:
            assert state[lay.slot][1] == 1.0 and not state[lay.obs].any()
            continue
        t0 = int(state[lay.obs][0])
        assert t0 == info.chunk_obs.step <= t - info.delay_steps  # decided at the request
        assert state[lay.slot][0] * H == pytest.approx(t - t0)  # slot-aligned: slot = t - t0
        assert t - t0 >= info.delay_steps  # committed slots never execute
        chunk = state[lay.chunk].reshape(H, M)
        np.testing.assert_array_equal(chunk[t - t0], executed[t])
        assert state[lay.progress][0] == pytest.approx(t0 / 60)


def test_committed_block_reaches_the_next_request_plus_its_delay():
    """Fixed d = 3, s = 6: a request at 6 lands at 9. At step 4 (nothing in flight) the
    actions of steps 5 .. 8 are certain: the old chunk runs until the new one lands."""
    H, d = 12, 3
    sched = ChunkScheduler(H, 6, M, "async", "naive", d, hold=make_hold(M), min_delay_steps=d)
    executed, _, infos = drive(sched, [d], 12, {})
    info = infos[4]
    assert not info.in_flight
    assert int(info.committed_mask.sum()) == 4  # steps 5, 6, 7, 8
    np.testing.assert_allclose(info.committed[:4], executed[5:9])
    loose = ChunkScheduler(H, 6, M, "async", "naive", d, hold=make_hold(M))  # no lower bound on d
    _, _, infos = drive(loose, [d], 12, {})
    assert int(infos[4].committed_mask.sum()) == 1  # only step 5 is certain
    with pytest.raises(ValueError, match="min_delay_steps"):
        ChunkScheduler(H, 6, M, "async", "naive", d, min_delay_steps=d + 1)


def test_variant_validation_and_normalisation():
    with pytest.raises(ValueError, match="one of"):
        StateBuilder("delayed", N, M, 8)
    b = StateBuilder("stepwise", N, M, 8, episode_steps=10, obs_mean=np.ones(N), obs_std=2 * np.ones(N))
    sched = ChunkScheduler(8, 4, M, "async", "naive", 0, hold=make_hold(M))
    req = sched.make_request(Observation(np.zeros(N), 0), 0, 0)
    sched.deliver(req.request_id, np.ones((8, M)), 0)
    sched.step(0)
    state = b.build(np.full(N, 5.0), sched.step(1))
    np.testing.assert_allclose(state, [2, 2, 2, 1, 1, 0.1])


def test_standard_decides_its_whole_residual_chunk_at_once():
    """``standard``: the residual of every slot of a chunk comes from one decision at the
    chunk's first executed slot, with the weights of that moment (a correction that travels
    with the base chunk), from exactly the state each slot then has; ``arli`` decides each step."""
    from arli.runtime.acting import ResidualController

    class Versioned:
        """A residual whose weights change after every step: its proposals carry the version."""

        version = 0.0

        def begin_episode(self):
            pass

        def act(self, state, base, explore):
            self.seen.append(np.array(state))
            return np.full(M, self.version, np.float32)

    H = 8
    for variant in ("standard", "arli"):
        sched = ChunkScheduler(H, 4, M, "async", "naive", 2, hold=make_hold(M))
        builder = StateBuilder(variant, N, M, H, episode_steps=60)
        policy = Versioned()
        policy.seen = []
        ctl = ResidualController(policy, builder)
        ctl.begin_episode()
        _, _, infos = drive(sched, [2], 40, {})
        chunks = {}
        for t, info in enumerate(infos):
            action = ctl.act(t, Observation(np.full(N, float(t)), t), info)
            policy.version += 1.0
            if info.chunk_obs is not None:
                chunks.setdefault(info.chunk_id, []).append((t, action[0], builder.build(np.full(N, float(t)), info)))
        assert len(chunks) >= 4
        for rows in chunks.values():
            versions = {v for _, v, _ in rows}
            if variant == "standard":
                assert versions == {float(rows[0][0])}  # decided at the chunk's first executed slot
            else:
                assert len(versions) == len(rows)  # decided every step
        if variant == "standard":  # each slot's proposal came from the state that slot has
            decided = {tuple(s) for s in policy.seen}
            assert all(tuple(state) in decided for rows in chunks.values() for _, _, state in rows)
