"""The one path from an executed step to a learner update: the n-step component, the
trainer's routing and owed-update count, and the acting controller on an env with a known
reward, all small problems whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from arli.rl.config import LearnerConfig
from arli.rl.learner import ResidualLearner
from arli.rl.replay import ReplayBuffer
from arli.rl.trainer import Trainer
from arli.rl.transitions import RowLayout, TransitionBuilder
from arli.types import DEMO, INTERVENTION, ONLINE, StepRecord

D, M = 3, 2


def _rec(i, reward=0.0, source=ONLINE):
    return StepRecord(np.full(D, i, np.float32), np.zeros(M, np.float32), np.full(M, 0.1 * i, np.float32),
                      reward, source)


def test_each_step_is_completed_by_the_next_state_and_the_takeover_penalty_is_charged():
    builder = TransitionBuilder(n_step=1, gamma=0.5, takeover_penalty=0.25)
    out = []
    for i, source in enumerate([ONLINE, ONLINE, INTERVENTION, INTERVENTION, ONLINE]):
        out += builder.step(_rec(i, reward=1.0, source=source))
    out += builder.end(np.full(D, 9, np.float32), np.zeros(M, np.float32), terminal=True)
    assert [float(t.state[0]) for t in out] == [0, 1, 2, 3, 4]
    assert [float(t.next_state[0]) for t in out] == [1, 2, 3, 4, 9]  # s_{t+1} completes step t
    # the robot's step 1 led to the takeover at step 2: only it pays the penalty
    assert [t.ret for t in out] == [1.0, 0.75, 1.0, 1.0, 1.0]
    assert [t.source for t in out] == [ONLINE, ONLINE, INTERVENTION, INTERVENTION, ONLINE]
    assert [t.discount for t in out] == [0.5, 0.5, 0.5, 0.5, 0.0] and builder.takeovers == 1


def _trainer(learn_after=5, utd=2):
    cfg = LearnerConfig(hidden=16, critic_hidden=16, critic_heads=2, critic_subset=2, batch_size=4, utd=utd)
    learner = ResidualLearner(cfg, D, M, seed=0)
    return Trainer(learner, ReplayBuffer(100, D, M), ReplayBuffer(100, D, M), learn_after)


def test_the_trainer_routes_by_source_and_owes_utd_updates_per_step_once_replay_is_full_enough():
    trainer = _trainer(learn_after=5, utd=2)
    builder = TransitionBuilder(1, 0.9)
    for i in range(4):
        trainer.ingest(builder.step(_rec(i, source=DEMO)), env_steps=0)  # demonstrations: no budget
    assert (len(trainer.anchor), trainer.env_steps, trainer.owed) == (3, 0, 0)
    for i in range(4, 8):
        trainer.ingest(builder.step(_rec(i)), env_steps=1)
    # rows 4 (demo, completed at step 4) .. 7: replay reaches learn_after = 5 at step 5
    assert (len(trainer.online), len(trainer.anchor)) == (3, 4)
    assert trainer.env_steps == 4 and trainer.owed == 2 * 3
    assert trainer.run_owed(limit=4) == 4 and trainer.owed == 2 and trainer.learner.updates == 4
    assert trainer.run_owed() == 2 and trainer.owed == 0 and trainer.learner.updates == 6
    assert "critic_loss" in trainer.last_stats


def test_measured_updates_include_an_actor_step():
    """Diagnostics are taken every DIAGNOSTICS_EVERY updates; the actor steps only every
    policy_delay-th, so the measurement is carried to the next update that moves the actor
    (otherwise, with an even period, no actor statistic would ever be measured)."""
    import arli.rl.trainer as trainer_mod

    for delay in (2, 3):
        cfg = LearnerConfig(hidden=16, critic_hidden=16, critic_heads=2, critic_subset=2, batch_size=4,
                            critic_warmup_updates=3, policy_delay=delay)
        trainer = Trainer(ResidualLearner(cfg, D, M, seed=0), ReplayBuffer(100, D, M), ReplayBuffer(100, D, M), 1)
        builder = TransitionBuilder(1, 0.9)
        for i in range(12):
            trainer.ingest(builder.step(_rec(i)), env_steps=1)
        seen = []
        update = trainer.learner.update
        trainer.learner.update = lambda *a, diagnostics=False, **k: seen.append(diagnostics) or update(
            *a, diagnostics=diagnostics, **k)
        old, trainer_mod.DIAGNOSTICS_EVERY = trainer_mod.DIAGNOSTICS_EVERY, 4
        try:
            trainer.run_owed()
        finally:
            trainer_mod.DIAGNOSTICS_EVERY = old
        assert "actor_grad_norm" in trainer.last_stats and "residual_abs" in trainer.last_stats
        # call i runs update i + 1, an actor step when (i + 1) % delay == 0 past the warm-up of 3:
        # call 0 is in the warm-up (not carried); calls 4 and 8 carry on to the next actor step
        # (delay 2: 5 and 9; delay 3: 5, while call 8 is one itself)
        measured = [i for i, m in enumerate(seen) if m]
        assert measured == ([0, 4, 5, 8, 9] if delay == 2 else [0, 4, 5, 8])


def test_actor_rows_take_the_same_path_and_nan_rows_are_counted_not_stored():
    trainer, layout = _trainer(learn_after=1, utd=1), RowLayout(D, M)
    builder = TransitionBuilder(1, 0.9)
    rows = [layout.row(t) for i, s in enumerate([ONLINE, INTERVENTION, ONLINE])
            for t in builder.step(_rec(i, source=s))]
    bad = layout.row(builder.end(np.zeros(D, np.float32), np.zeros(M, np.float32), True)[0])
    bad[0] = np.nan
    assert trainer.ingest_rows(np.stack(rows + [bad])) == 2
    assert (len(trainer.online), len(trainer.anchor), trainer.rejected_rows) == (1, 1, 1)
    assert trainer.intervention_rows == 1 and trainer.env_steps == 2 and trainer.owed == 2


def test_trainer_state_round_trips():
    a, b = _trainer(), _trainer()
    builder = TransitionBuilder(1, 0.9)
    for i in range(10):
        a.ingest(builder.step(_rec(i)), env_steps=1)
    a.run_owed(limit=3)
    b.load_state_dict(a.state_dict())
    assert (b.env_steps, b.owed, b.learner.updates, len(b.online)) == (a.env_steps, a.owed, 3, len(a.online))
    a.run_owed()
    b.run_owed()
    for x, y in zip(a.learner.actor.parameters(), b.learner.actor.parameters()):
        np.testing.assert_array_equal(x.detach().numpy(), y.detach().numpy())


def test_step_rewards_line_up_with_their_actions_through_the_acting_controller():
    """A 1-D env whose reward at step t is known from the action at step t: every stored
    transition's return must be the reward of its own action (n = 1), never a neighbour's."""
    from arli.augment import StateBuilder
    from arli.chunking import ChunkScheduler
    from arli.runtime.acting import ResidualController
    from arli.runtime.clock import SimClock
    from arli.runtime.inference import SimInference
    from arli.latency import FixedLatency
    from arli.runtime.loop import run_episode
    from arli.types import Observation, PolicyRequest
    from robot_drivers.base import RobotDriver, StepResult

    class Line(RobotDriver):
        dt, state_dim, action_dim, max_episode_steps = 0.05, 1, 1, 12

        def reset(self, seed=None):
            self.t = 0
            return self.observe()

        def observe(self):
            return Observation(np.array([self.t], np.float32), self.t)

        def act(self, action):
            self.t += 1
            reward = float(action[0])  # reward = the action just executed
            return StepResult(self.observe(), reward, False, self.t >= self.max_episode_steps, False)

    class Ramp:  # base chunk: action = the step it runs at, scaled
        chunk_size, action_dim, n_obs_steps = 4, 1, 1

        def reset(self, seed=None): ...

        def infer(self, request: PolicyRequest):
            t0 = int(request.state[0])
            return (0.05 * (t0 + np.arange(4, dtype=np.float32)))[:, None]

    class Zero:  # a residual that proposes the base action as is
        action_dim = 1

        def act(self, state, base, explore):
            return np.asarray(base, np.float32).copy()

        def begin_episode(self): ...

    builder = StateBuilder("arli", 1, 1, 4, 12)
    ctl = ResidualController(Zero(), builder, train=True, transitions=TransitionBuilder(1, 0.9))
    sched = ChunkScheduler(4, 2, 1, "async", "naive", 1)
    inference = SimInference(Ramp(), FixedLatency(0.05), np.random.default_rng(0), 0.05)
    result = run_episode(Line(), inference, sched, SimClock(0.05), 0, ctl)
    out = ctl.take_transitions()
    assert result.steps == 12 and len(out) == 12
    np.testing.assert_allclose([t.ret for t in out], [float(t.action[0]) for t in out])
    assert [t.discount for t in out][-1] == 0.0 and all(t.discount == pytest.approx(0.9) for t in out[:-1])


def test_the_takeover_penalty_is_not_clipped_away_by_the_td_floor():
    """A robot step that made the intervener take over returns -penalty: with the floor at
    q_floor the critic learns that value; with the old floor 0 it could only learn 0."""
    from dataclasses import replace

    from arli.rl.config import InterventionSpec, q_floor

    spec = InterventionSpec(mode="corrective", segment=15, patience=3, takeover_penalty=0.5)
    cfg = LearnerConfig(hidden=16, critic_hidden=32, critic_heads=2, critic_subset=2, batch_size=32,
                        critic_lr=3e-3, critic_warmup_updates=10**6)
    floor = q_floor(cfg, spec, online_intervener=True)
    assert floor == pytest.approx(-0.5 / (1 - 0.99**18)) and q_floor(cfg, spec, online_intervener=False) == 0.0
    assert q_floor(cfg, replace(spec, mode="takeover"), True) == -0.5
    values = {}
    for name, q_min in (("floor", floor), ("zero", 0.0)):
        learner = ResidualLearner(replace(cfg, q_min=q_min), D, M, seed=0)
        online = ReplayBuffer(64, D, M)
        builder = TransitionBuilder(1, 0.99, takeover_penalty=0.5)
        builder.step(_rec(1, reward=0.0, source=ONLINE))
        for tr in builder.step(_rec(2, source=INTERVENTION)):  # the robot's step led to a takeover
            for _ in range(64):
                online.add({**tr, "discount": 0.0})
        for _ in range(300):
            learner.update(online, ReplayBuffer(1, D, M))
        values[name] = float(learner.q_value(np.full((1, D), 1, np.float32), np.full((1, M), 0.1, np.float32))[0])
    assert values["floor"] < -0.3 and values["zero"] > -0.05


def test_sim_plans_from_measured_latencies_never_from_the_next_one():
    """SimInference plans as the robot's client does: its first request at the initial plan,
    later ones at the 0.9 quantile of the latencies measured so far, capped at the plan the
    scheduler was built for; the delay a request really takes is drawn when it is sent."""
    from arli.latency import TraceLatency
    from arli.runtime.inference import SimInference
    from arli.types import ChunkRequest, Observation

    class Zeros:
        chunk_size, action_dim, n_obs_steps = 8, 2, 1

        def reset(self, seed=None): ...

        def infer(self, request):
            return np.zeros((8, 2), np.float32)

    trace = (0.1, 0.1, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1)  # 2 steps, one 6-step spike
    sim = SimInference(Zeros(), TraceLatency(trace), np.random.default_rng(0), 0.05, initial_delay_steps=4)
    planned, landed = [], []
    for k in range(10):
        planned.append(sim.next_delay())
        sim.submit(ChunkRequest(k, 10 * k, Observation(np.zeros(3, np.float32), 10 * k), planned[-1], None), [])
        (reply,) = sim.poll(10 * k + 10)
        landed.append(round(reply.meta["latency_s"] / 0.05))
    assert landed == [2, 2, 6, 2, 2, 2, 2, 2, 2, 2]  # drawn at the request, whatever was planned
    assert planned[0] == 4 and planned[1:3] == [2, 2]  # the spike was not known before it happened
    assert planned[3] == 4  # after it: the quantile (6 steps) capped at the scheduler's plan (4)


def test_eval_labels_the_seeds_by_what_the_run_did_with_them():
    from arli.runs import split_of
    from arli.rl.config import RunSpec

    spec = RunSpec(tune_seed=10_000, eval_episodes=30, test_seed=5_000_000, test_episodes=200)
    train = [range(100_000, 100_050)]
    assert split_of(spec, 5_000_000, 200, train) == "test" == split_of(spec, 5_000_050, 20, train)
    assert split_of(spec, 10_010, 5, train) == "tune" and split_of(spec, 100_020, 10, train) == "train"
    assert split_of(spec, 7_000_000, 50, train) == "other"
    assert split_of(spec, 4_999_990, 20, train) == "test+other"  # partly the test seeds: not "never saw"
    assert split_of(spec, 10_000, 5_000_000, train) == "test+other"  # tune, train and test seeds at once
    assert split_of(spec, 100_000_000 + 1_500, 10, [*train, range(100_001_000, 100_001_700)]) == "train"


def test_long_runs_of_neighbouring_training_seeds_share_no_episode():
    """A 200k-step run has ~1700 training episodes: seed k's later episodes get a block of their
    own instead of running into seed k + 1's first ones; the first 1000 keep their seeds."""
    from arli.rl.config import outside_training, train_episode_seed, train_seed_ranges

    assert train_episode_seed(3, 0) == 103_000 and train_episode_seed(3, 999) == 103_999
    seeds = {k: {train_episode_seed(k, i) for i in range(1_800)} for k in (0, 1, 2)}
    assert not seeds[0] & seeds[1] and not seeds[1] & seeds[2] and all(len(s) == 1_800 for s in seeds.values())
    assert set().union(*(set(r) for r in train_seed_ranges(1, 1_800))) == seeds[1]
    assert all(not outside_training(range(s, s + 1)) for s in seeds[2])
    assert outside_training(range(5_000_000, 5_000_200)) and outside_training(range(10_000, 10_030))
