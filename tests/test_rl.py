"""Replay, n-step targets, residual networks and the anchored learner."""

import math

import numpy as np
import pytest
import torch

from arli.errors import ConfigError
from arli.policies.residual import EnsembleCritic, ResidualActor, compose_action
from arli.policies.residual_np import NumpyEnsembleCritic, ResidualActing
from arli.runtime.intervention import Intervention
from arli.rl.config import InterventionSpec, LearnerConfig
from arli.rl.learner import GATE_PICKS, LearnerDiverged, ResidualLearner, advantage_spread
from arli.rl.replay import ReplayBuffer, mixed_batch
from arli.rl.transitions import NStepAccumulator
from arli.types import DEMO, INTERVENTION, ONLINE

D, M = 6, 2


def _push(acc, reward, terminated=False, truncated=False, source=ONLINE):
    s = np.full(D, reward)
    return acc.push(s, np.zeros(M), np.zeros(M), reward, s + 100, np.ones(M), terminated, truncated, source)


def test_n_step_targets_equal_a_hand_computed_case():
    acc = NStepAccumulator(n=3, gamma=0.5)
    assert _push(acc, 1.0) == [] and _push(acc, 2.0) == []
    (tr,) = _push(acc, 4.0)
    assert tr["ret"] == pytest.approx(1 + 0.5 * 2 + 0.25 * 4)  # r0 + g r1 + g^2 r2 = 3
    assert tr["discount"] == pytest.approx(0.125)
    np.testing.assert_array_equal(tr["state"], np.full(D, 1.0))
    np.testing.assert_array_equal(tr["next_state"], np.full(D, 104.0))  # s_{t+3}
    # termination flushes the window with shorter returns and no bootstrap
    out = _push(acc, 8.0, terminated=True)
    assert [t["ret"] for t in out] == pytest.approx([2 + 0.5 * 4 + 0.25 * 8, 4 + 0.5 * 8, 8])
    assert all(t["discount"] == 0.0 for t in out)
    # truncation flushes too, but bootstraps with gamma^k
    acc.reset()
    _push(acc, 1.0)
    out = _push(acc, 1.0, truncated=True)
    assert [t["discount"] for t in out] == pytest.approx([0.25, 0.5])


def test_n_step_window_never_spans_a_change_of_actor():
    """The residual's return must not count the intervener's actions as its own: when the
    intervener takes over at s_t, the robot's window bootstraps from s_t."""
    acc = NStepAccumulator(n=3, gamma=0.5)
    assert _push(acc, 1.0) == [] and _push(acc, 2.0) == []
    out = _push(acc, 4.0, source=INTERVENTION)  # s = 4 is where the intervener took over
    assert [t["source"] for t in out] == [ONLINE, ONLINE]
    assert [t["ret"] for t in out] == pytest.approx([1 + 0.5 * 2, 2])
    assert [t["discount"] for t in out] == pytest.approx([0.25, 0.5])
    for t in out:
        np.testing.assert_array_equal(t["next_state"], np.full(D, 4.0))
    out = _push(acc, 8.0, source=INTERVENTION) + _push(acc, 16.0, source=ONLINE)
    assert [t["source"] for t in out] == [INTERVENTION, INTERVENTION]
    assert [t["ret"] for t in out] == pytest.approx([4 + 0.5 * 8, 8])
    np.testing.assert_array_equal(out[0]["next_state"], np.full(D, 16.0))

def test_replay_ring_buffer_and_mixing():
    buf, anchor = ReplayBuffer(4, D, M), ReplayBuffer(4, D, M)
    acc = NStepAccumulator(1, 0.9)
    for r in range(6):
        for tr in _push(acc, float(r)):
            buf.add(tr)
            anchor.add({**tr, "ret": -1.0})
    assert len(buf) == 4 and sorted(buf.data["ret"].tolist()) == [2, 3, 4, 5]
    batch = mixed_batch(buf, anchor, 10, 0.3, torch.Generator().manual_seed(0))
    assert batch["is_anchor"].sum() == 3
    assert torch.all(batch["ret"][batch["is_anchor"] == 1] == -1)
    before = {k: v.copy() for k, v in buf.data.items()}
    with pytest.raises(ValueError, match="discount"):
        buf.add({**tr, "discount": float("nan")})  # the last field: nothing before it is written
    assert len(buf) == 4
    assert all(np.array_equal(before[k], buf.data[k]) for k in before)


def test_zero_initial_residual():
    actor = ResidualActor(D, M)
    s = torch.randn(32, D)
    assert torch.all(actor(s) == 0)
    base = torch.rand(32, M) * 2 - 1
    torch.testing.assert_close(compose_action(base, actor(s), 0.3), base)


def test_numpy_acting_matches_the_torch_actor():
    """The robot's numpy residual (runtime) computes what the learner's torch actor does."""
    torch.manual_seed(0)
    actor = ResidualActor(D, M, 32)
    torch.nn.init.normal_(actor.net[-1].weight, std=0.5)  # a trained, non-zero residual
    arrays = {k: v.detach().numpy() for k, v in actor.state_dict().items()}
    cfg = LearnerConfig(residual_scale=0.3, exploration_std=0.2, gate_candidates=0, actor_update="awr")  # the actor alone acts
    acting = ResidualActing(cfg, arrays, M, seed=0)
    states = torch.randn(64, D)
    base = (torch.rand(64, M) * 2 - 1).numpy()
    expected = compose_action(base, actor(states).detach().numpy(), 0.3)
    got = np.stack([acting.act(s.numpy(), b, explore=False) for s, b in zip(states, base)])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # exploring: noise of the configured std on r (before scaling), actions stay in [-1, 1]
    zero = ResidualActing(cfg, {**arrays, "net.5.weight": 0 * arrays["net.5.weight"],
                                "net.5.bias": 0 * arrays["net.5.bias"]}, M, seed=1)  # r(s) = 0
    s0, b0 = states[0].numpy(), np.zeros(M, np.float32)
    noisy = np.stack([zero.act(s0, b0, explore=True) for _ in range(2 * ResidualActing.NOISE_BLOCK + 7)])
    assert np.all(np.abs(noisy) <= 0.3 + 1e-6)
    assert abs((noisy / 0.3).std() - 0.2) < 0.02 and abs((noisy / 0.3).mean()) < 0.02
    assert len({tuple(row) for row in noisy.round(6)}) == len(noisy)  # fresh noise each step, across blocks
    edge = zero.act(s0, np.ones(M, np.float32), explore=True)
    assert np.all(edge <= 1.0)


@pytest.mark.parametrize("confidence", [0.0, 0.5])
def test_numpy_value_gating_chooses_what_the_learner_chooses(confidence):
    """The robot's numpy critic scores candidates as the torch critic does (head by head), and
    its gated acting executes the candidate of {r, 0, perturbations} that
    ``ResidualLearner.best_candidate`` picks among the same candidates (the highest mean-head Q,
    or with ``gate_confidence`` the highest lower bound of the advantage over r); before the
    critic's warm-up it acts with r; without the critic's arrays it refuses to gate."""
    cfg = LearnerConfig(residual_scale=0.3, exploration_std=0.0, gate_candidates=6, gate_std=0.5,
                        critic_warmup_updates=10, critic_heads=3, critic_hidden=32, hidden=32,
                        gate_confidence=confidence)
    learner = ResidualLearner(cfg, D, M, seed=0)
    torch.nn.init.normal_(learner.actor.net[-1].weight, std=0.5)
    arrays = {k: v.detach().numpy() for k, v in learner.actor.state_dict().items()}
    critic = {k: v.detach().numpy() for k, v in learner.critic.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    states, base = torch.randn(40, D, generator=g), torch.rand(40, M, generator=g) * 2 - 1
    acts = torch.rand(5, 40, M, generator=g) * 2 - 1
    numpy_critic = NumpyEnsembleCritic(critic)
    for i in range(3):
        np.testing.assert_allclose(numpy_critic.candidates(states[i].numpy(), acts[:, i].numpy()),
                                   learner.critic.candidates(states[i:i + 1], acts[:, i:i + 1])[:, :, 0].detach(),
                                   rtol=1e-4, atol=1e-5)
    acting = ResidualActing(cfg, arrays, M, seed=0, critic=critic)
    r = learner.actor(states).detach()
    ungated = np.stack([acting.act(s.numpy(), b.numpy(), explore=False) for s, b in zip(states, base)])
    np.testing.assert_allclose(ungated, compose_action(base, r, 0.3).numpy(), atol=1e-5)  # before the warm-up
    acting.load(arrays, critic, updates=10)
    assert acting.gated_steps == 0  # ungated steps are not counted
    chosen, picks = 0, np.zeros(len(GATE_PICKS), np.int64)
    for s, b, r_i in zip(states, base, r):
        acting.prepare()
        noise = acting._gate_noise[acting._next].copy()
        got = acting.act(s.numpy(), b.numpy(), explore=False)
        cands = torch.cat([r_i[None], torch.zeros(1, M), (r_i[None] + torch.as_tensor(noise)).clamp(-1, 1)])[:, None]
        want, _ = learner.best_candidate(s[None], b[None], cands)
        np.testing.assert_allclose(got, compose_action(b[None], want, 0.3)[0].numpy(), atol=1e-5)
        chosen += int(not torch.equal(want[0], r_i))
        picks[min(int(learner.best_index(s[None], b[None], cands)[0][0]), len(GATE_PICKS) - 1)] += 1
    assert chosen > 10  # the critic overrules r on many states: the comparison is not trivial
    # the robot counts the choices as the learner makes them (its stats.json carries them)
    np.testing.assert_array_equal(acting.gate_picks, picks)
    assert acting.gated_steps == len(states) and acting.overruled_steps == chosen
    with pytest.raises(ValueError, match="value gating .* acts through the critic"):
        ResidualActing(cfg, arrays, M)
    with pytest.raises(ValueError, match="came without the critic's"):
        acting.load(arrays, None)


def test_a_confident_gate_leaves_pi_only_where_the_heads_agree():
    """``gate_confidence`` k: a candidate replaces pi(s) (the first) only where the mean over
    heads of its advantage minus k times their std is the highest and positive; k = 0 is the
    highest mean-head Q."""
    learner = ResidualLearner(LearnerConfig(critic_heads=4, gate_confidence=1.0), D, M, seed=0)
    # (E=4, K=3, B=3), every head with its own offset (0, 0.4, 0.8, 1.2) on pi(s)'s Q: on row 0
    # candidate 1 is better by 0.1 in every head; on row 1 candidate 2 is better on average (+0.05)
    # but the heads disagree (+0.4, -0.2, -0.1, +0.1); on row 2 candidate 1's Q is 0.61 in every head
    # (no spread of its own Q, but advantages from +0.61 to -0.59, mean +0.01: not chosen)
    offset = torch.tensor([0.0, 0.4, 0.8, 1.2])[:, None]
    q = offset.expand(4, 3).clone()[:, :, None].repeat(1, 1, 3)
    q[:, 1, 0] += 0.1
    q[:, 2, 1] += torch.tensor([0.4, -0.2, -0.1, 0.1])
    q[:, 1, 2] = 0.61
    assert learner.choose(q).tolist() == [1, 0, 0]
    # the spread is the sample std over heads: advantages (0.1, 0.1, 0.1, 0.3), mean 0.15, std 0.1
    # (0.087 with ddof 0): at k = 1.6 the bound is -0.01, not +0.011
    q2 = torch.zeros(4, 2, 1)
    q2[:, 1, 0] = torch.tensor([0.1, 0.1, 0.1, 0.3])
    learner.cfg.gate_confidence = 1.6
    assert learner.choose(q2).tolist() == [0]
    learner.cfg.gate_confidence = 0.0
    assert learner.choose(q).tolist() == [1, 2, 1]
    with pytest.raises(ConfigError, match="gate_confidence"):
        LearnerConfig(critic_heads=1, critic_subset=1, gate_confidence=1.0).validate()


def test_gated_acting_without_exploration_is_a_function_of_the_state():
    """Evaluating a value-gated learner: the same state gives the same action whatever was drawn
    before (an evaluated episode replays, as its video does), and it draws nothing from the
    training stream (an evaluation's cadence changes no training); exploring draws from it."""
    cfg = LearnerConfig(residual_scale=0.3, exploration_std=0.1, gate_candidates=8, gate_std=0.5,
                        critic_warmup_updates=0, critic_hidden=32, hidden=32)
    learner = ResidualLearner(cfg, D, M, seed=0)
    learner.updates = 1  # past the warm-up: the critic chooses
    torch.nn.init.normal_(learner.actor.net[-1].weight, std=0.5)
    g = np.random.default_rng(0)
    states, bases = g.normal(size=(30, D)).astype(np.float32), g.uniform(-1, 1, (30, M)).astype(np.float32)
    before = learner.generator.get_state()
    first = np.stack([learner.act(s, b, explore=False) for s, b in zip(states, bases)])
    assert torch.equal(learner.generator.get_state(), before)  # the training stream untouched
    learner.act(states[0], bases[0], explore=True)  # training acting draws from it...
    assert not torch.equal(learner.generator.get_state(), before)
    again = np.stack([learner.act(s, b, explore=False) for s, b in reversed(list(zip(states, bases)))])[::-1]
    np.testing.assert_array_equal(first, again)  # ...and evaluation still replays, in any order
    pi = compose_action(torch.as_tensor(bases), learner.actor(torch.as_tensor(states)).detach(), 0.3).numpy()
    assert (np.abs(first - pi).max(1) > 1e-6).sum() > 5  # the critic overrules pi on many states
    # the gate's count says what executed: pi(s) where the action is pi's, the base where it is b
    learner.gate_picks[:] = 0
    acted = np.stack([learner.act(s, b, explore=False) for s, b in zip(states, bases)])
    at_pi, at_base = np.abs(acted - pi).max(1) < 1e-6, np.abs(acted - bases).max(1) < 1e-6
    assert dict(zip(GATE_PICKS, learner.gate_picks.tolist())) == {
        "pi": at_pi.sum(), "base": at_base.sum(), "perturbed": len(states) - at_pi.sum() - at_base.sum()}
    learner.gating = False
    learner.act(states[0], bases[0], explore=False)
    assert learner.gate_picks.sum() == len(states)  # ungated acting is not counted


def test_a_reverted_start_acts_ungated_and_a_loaded_learner_gated_again():
    """The end guard's deployed start acts alone (as it was judged before RL), even with a
    trained critic; a learner loaded from a checkpoint acts gated again."""
    cfg = LearnerConfig(gate_candidates=8, gate_std=0.5, critic_warmup_updates=0, critic_hidden=32, hidden=32)
    learner = ResidualLearner(cfg, D, M, seed=0)
    torch.nn.init.normal_(learner.actor.net[-1].weight, std=0.5)
    learner.actor_start.load_state_dict(learner.actor.state_dict())
    learner.updates = 1
    g = np.random.default_rng(1)
    states, bases = g.normal(size=(20, D)).astype(np.float32), g.uniform(-1, 1, (20, M)).astype(np.float32)
    pi = compose_action(torch.as_tensor(bases), learner.actor_start(torch.as_tensor(states)).detach(), 0.3).numpy()
    gated = np.stack([learner.act(s, b, explore=False) for s, b in zip(states, bases)])
    assert (np.abs(gated - pi).max(1) > 1e-6).any()  # the critic overrules the actor somewhere
    saved = learner.state_dict()
    learner.revert_to_start()
    alone = np.stack([learner.act(s, b, explore=False) for s, b in zip(states, bases)])
    np.testing.assert_allclose(alone, pi, atol=1e-6)
    learner.load_state_dict(saved)
    np.testing.assert_array_equal(np.stack([learner.act(s, b, explore=False) for s, b in zip(states, bases)]), gated)


def _exploration_episodes(acting, episodes: int, length: int) -> np.ndarray:
    """Executed actions (episodes, length, M) of an acting object whose residual is zero
    (base 0, residual scale 1: the action is the exploration noise itself)."""
    s, b = np.zeros(D, np.float32), np.zeros(M, np.float32)
    out = []
    for _ in range(episodes):
        acting.begin_episode()
        out.append([acting.act(s, b, explore=True) for _ in range(length)])
    return np.asarray(out)


def _lag1(x: np.ndarray) -> float:
    """Lag-1 autocorrelation within episodes of x (episodes, length, M)."""
    return float(np.corrcoef(x[:, 1:].ravel(), x[:, :-1].ravel())[0, 1])


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_exploration_noise_is_ar1_within_an_episode_on_both_acting_paths(rho):
    """learner.exploration_corr: the learner's torch acting and the robot's numpy acting draw
    the same process: marginal std exploration_std, lag-1 correlation rho inside an episode,
    and none across the episode boundary (begin_episode restarts it)."""
    cfg = LearnerConfig(residual_scale=1.0, exploration_std=0.2, exploration_corr=rho, gate_candidates=0,
                        actor_update="awr")
    learner = ResidualLearner(cfg, D, M, seed=0)  # zero-initialised residual: r(s) = 0
    arrays = {k: v.detach().numpy() for k, v in learner.actor.state_dict().items()}
    for acting in (learner, ResidualActing(cfg, arrays, M, seed=0)):
        x = _exploration_episodes(acting, episodes=150, length=40)
        assert abs(x.std() - 0.2) < 0.02, type(acting)
        assert abs(_lag1(x) - rho) < 0.06, (type(acting), _lag1(x))
        across = np.corrcoef(x[1:, 0].ravel(), x[:-1, -1].ravel())[0, 1]  # last step -> next episode's first
        assert abs(across) < 0.15, (type(acting), across)


def test_differenced_exploration_keeps_the_running_sum_bounded_on_both_acting_paths():
    """learner.exploration_differenced: e_t = (xi_t - xi_{t-1}) / sqrt(2) on the learner's torch
    acting and the robot's numpy acting alike: marginal std exploration_std, lag-1 correlation
    -1/2, and a running sum (where delta actions integrate into the hand's target) whose spread
    stays at std / sqrt(2) at every step, where white noise's grows as std sqrt(t)."""
    length = 60
    cfg = LearnerConfig(residual_scale=1.0, exploration_std=0.2, exploration_differenced=True, gate_candidates=0,
                        actor_update="awr")
    learner = ResidualLearner(cfg, D, M, seed=0)  # zero-initialised residual: r(s) = 0
    arrays = {k: v.detach().numpy() for k, v in learner.actor.state_dict().items()}
    for acting in (learner, ResidualActing(cfg, arrays, M, seed=0)):
        x = _exploration_episodes(acting, episodes=300, length=length)
        assert abs(x[:, 1:].std() - 0.2) < 0.02, type(acting)
        assert abs(_lag1(x) + 0.5) < 0.06, (type(acting), _lag1(x))
        walk = x.cumsum(axis=1)
        for t in (0, 10, length - 1):
            assert abs(walk[:, t].std() - 0.2 / np.sqrt(2)) < 0.02, (type(acting), t, walk[:, t].std())
    white = _exploration_episodes(ResidualLearner(LearnerConfig(residual_scale=1.0, exploration_std=0.2), D, M),
                                  episodes=300, length=length).cumsum(axis=1)
    assert white[:, -1].std() > 4 * 0.2 / np.sqrt(2)  # ~0.2 sqrt(60) = 1.5: the walk a white process takes


def test_one_exploration_process_at_a_time():
    with pytest.raises(ValueError, match=r"run\.learner\.exploration_differenced: expected false while"):
        LearnerConfig(exploration_corr=0.5, exploration_differenced=True).validate()


def test_compose_clips_to_the_action_range():
    out = compose_action(np.array([0.9, -0.9]), np.array([1.0, -1.0]), 0.3)
    np.testing.assert_allclose(out, [1.0, -1.0])


def test_batched_ensemble_equals_separate_heads():
    critic = EnsembleCritic(D, M, heads=3, hidden=16)
    s, a = torch.randn(5, D), torch.randn(5, M)
    q = critic(s, a)
    x = torch.cat([s, a], -1)
    for e in range(3):  # each head written out by hand from its own weights
        h = torch.relu(torch.nn.functional.layer_norm(x @ critic.w1[:, e] + critic.b1[e], (16,)))
        h = torch.relu(torch.nn.functional.layer_norm(h @ critic.l2.weight[e] + critic.l2.bias[e], (16,)))
        torch.testing.assert_close(q[e], h @ critic.w3[e, 0] + critic.b3[e])
    # a subset of heads (the TD target's pair) is those heads' rows
    torch.testing.assert_close(critic(s, a, torch.tensor([2, 0])), q[[2, 0]])


def test_candidate_scoring_shares_the_state_and_equals_the_plain_forward():
    """EnsembleCritic.candidates computes the state's first-layer part once for K candidates:
    every candidate's Q must equal the plain forward on (s, a_k), head by head."""
    critic = EnsembleCritic(D, M, heads=3, hidden=16)
    s, acts = torch.randn(5, D), torch.randn(4, 5, M)
    q = critic.candidates(s, acts)
    assert q.shape == (3, 4, 5)
    for k in range(4):
        torch.testing.assert_close(q[:, k], critic(s, acts[k]), rtol=1e-5, atol=1e-5)


def _anchor_setup(**overrides):
    """A learner and an anchor buffer whose actions are the base shifted by (0.3, -0.2)."""
    cfg = LearnerConfig(**{"batch_size": 64, "hidden": 32, "critic_hidden": 32, "critic_warmup_updates": 0,
                           "policy_delay": 1, "anchor_ratio": 1.0, "anchor_weight": 10.0, "actor_lr": 1e-3,
                           "residual_scale": 0.5, "q_weight": 0.0, **overrides})
    learner = ResidualLearner(cfg, D, M, seed=0)
    anchor = ReplayBuffer(512, D, M)
    rng = np.random.default_rng(0)
    for _ in range(256):
        s, b = rng.normal(size=D), rng.uniform(-0.5, 0.5, M)
        anchor.add({"state": s, "base": b, "action": b + np.array([0.3, -0.2]), "ret": 0.0,
                    "next_state": s, "next_base": b, "discount": 0.0, "source": DEMO})
    data = {k: torch.from_numpy(v[:256]) for k, v in anchor.data.items()}

    def gap():
        with torch.no_grad():
            a = compose_action(data["base"], learner.actor(data["state"]), cfg.residual_scale)
        return (a - data["action"]).abs().mean().item()

    return learner, anchor, gap


def test_anchor_term_pulls_toward_anchor_actions():
    learner, anchor, gap = _anchor_setup()
    online = ReplayBuffer(512, D, M)
    before = gap()
    for _ in range(300):
        learner.update(online, anchor)
    assert before == pytest.approx(0.25, abs=1e-6)  # zero residual: off by (0.3, 0.2)
    assert gap() < 0.3 * before


def test_anchor_pretraining_clones_anchor_actions_and_syncs_the_target():
    learner, anchor, gap = _anchor_setup(pretrain_lr=3e-3)
    assert math.isnan(learner.pretrain_actor(anchor, 0))  # nothing done
    assert gap() == pytest.approx(0.25, abs=1e-6)
    loss = learner.pretrain_actor(anchor, 400)
    assert gap() < 0.2 * 0.25 and loss < 0.01
    for p, tp in zip(learner.actor.parameters(), learner.actor_target.parameters()):
        assert torch.equal(p, tp)  # bootstrapping starts from the pretrained actor
    critic = [p.clone() for p in learner.critic.parameters()]
    learner.pretrain_actor(anchor, 5)
    assert all(torch.equal(a, b) for a, b in zip(critic, learner.critic.parameters()))
    assert learner.updates == 0  # pretraining is not part of the RL update count


def test_critic_warmup_keeps_the_actor_still():
    cfg = LearnerConfig(batch_size=16, hidden=16, critic_hidden=16, critic_warmup_updates=20, policy_delay=1,
                        q_weight=1.0, buffer_size=64)
    learner = ResidualLearner(cfg, D, M)
    buf = ReplayBuffer(64, D, M)
    for i in range(32):
        buf.add({"state": np.full(D, i / 32), "base": np.zeros(M), "action": np.ones(M), "ret": 1.0,
                 "next_state": np.zeros(D), "next_base": np.zeros(M), "discount": 0.9})
    w0 = [p.clone() for p in learner.actor.parameters()]
    for _ in range(20):
        learner.update(buf, ReplayBuffer(8, D, M))
    assert all(torch.equal(a, b) for a, b in zip(w0, learner.actor.parameters()))
    learner.update(buf, ReplayBuffer(8, D, M))
    assert any(not torch.equal(a, b) for a, b in zip(w0, learner.actor.parameters()))


def _expert(state):
    return np.array([0.5, -0.5], np.float32)


def test_corrective_intervener_takes_short_segments_after_sustained_deviation():
    iv = Intervention(_expert, InterventionSpec(prob=1.0, after=2, mode="corrective", threshold=0.6,
                                                patience=3, segment=4))
    iv.begin_episode(watching=True)
    far, near = np.array([-0.5, -0.5]), np.array([0.4, -0.4])
    acts = [iv.decide(t, np.zeros(D), far) is not None for t in range(12)]
    # steps 0-1: before ``after``; 2, 3 deviate; at 4 patience is reached -> 4 steps of control
    assert acts == [False] * 4 + [True] * 4 + [False, False, True, True]
    iv.begin_episode(watching=True)
    assert all(iv.decide(t, np.zeros(D), near) is None for t in range(20))  # agrees: no takeover
    deviating_once = [far if t % 3 == 0 else near for t in range(20)]
    assert all(iv.decide(t, np.zeros(D), a) is None for t, a in enumerate(deviating_once))
    iv.begin_episode(watching=False)
    assert all(iv.decide(t, np.zeros(D), far) is None for t in range(20))


def test_takeover_intervener_acts_from_its_step_to_the_end():
    iv = Intervention(_expert, InterventionSpec(prob=1.0, after=3, mode="takeover"))
    iv.begin_episode(watching=True)
    out = [iv.decide(t, np.zeros(D), np.zeros(M)) for t in range(6)]
    assert [o is not None for o in out] == [False] * 3 + [True] * 3
    np.testing.assert_array_equal(out[-1], _expert(None))
    for bad in ({"mode": "sometimes"}, {"patience": 0}, {"threshold": -0.1}):
        with pytest.raises(ValueError, match=f"intervention.{next(iter(bad))}"):
            Intervention(_expert, InterventionSpec(**bad))


# -- the critic recovers a known Q, and the actor climbs it (toy MDP) ----------------------
C = np.array([0.3, -0.2], np.float32)  # the best executed action at s1


def _q1(a):
    """Reward (and Q) at the last step: 1 - ||a - C||^2 / 4, in [0, 1] for a in [-1, 1]^2."""
    return 1.0 - ((a - C) ** 2).sum(-1) / 4.0


def _toy_mdp(gamma=0.9):
    """Two steps. s0 -> s1 with reward 0 whatever a0; s1 terminal with reward _q1(a1).
    States: a random context (D-1,) + a phase flag. Base action b1 = 0 at s1.
    With the residual held at zero, Q(s1, a) = _q1(a) and Q(s0, a) = gamma * _q1(0)."""
    rng = np.random.default_rng(1)
    buf = ReplayBuffer(4096, D, M)
    for _ in range(2048):
        ctx = rng.normal(size=D - 1)
        s0, s1 = np.append(ctx, 0.0), np.append(ctx, 1.0)
        a0, a1 = rng.uniform(-1, 1, M), rng.uniform(-1, 1, M)
        buf.add({"state": s0, "base": np.zeros(M), "action": a0, "ret": 0.0, "next_state": s1,
                 "next_base": np.zeros(M), "discount": gamma})
        buf.add({"state": s1, "base": np.zeros(M), "action": a1, "ret": _q1(a1), "next_state": s1,
                 "next_base": np.zeros(M), "discount": 0.0})
    return buf


def _toy_learner(**overrides):
    cfg = LearnerConfig(**{"batch_size": 128, "hidden": 64, "critic_hidden": 64, "critic_heads": 2,
                           "critic_subset": 2, "gamma": 0.9, "target_noise": 0.0, "tau": 0.05,
                           "critic_lr": 1e-3, "critic_warmup_updates": 10**9, "anchor_ratio": 0.0,
                           "gate_candidates": 0, "backup_candidates": 0, "actor_update": "awr",  # TD3's backup
                           **overrides})
    return ResidualLearner(cfg, D, M, seed=0)


def test_critic_recovers_the_known_q_of_a_toy_mdp():
    buf, empty = _toy_mdp(), ReplayBuffer(8, D, M)
    learner = _toy_learner()
    for _ in range(1500):
        learner.update(buf, empty)
    rng = np.random.default_rng(7)
    ctx = rng.normal(size=(200, D - 1)).astype(np.float32)
    a = rng.uniform(-1, 1, (200, M)).astype(np.float32)
    q1 = learner.q_value(np.c_[ctx, np.ones(200)], a)
    q0 = learner.q_value(np.c_[ctx, np.zeros(200)], a)
    assert np.abs(q1 - _q1(a)).mean() < 0.05  # immediate reward, action-dependent
    assert np.abs(q0 - 0.9 * _q1(np.zeros(M))).mean() < 0.05  # bootstrapped through pi = 0


def test_actor_q_gradient_moves_the_residual_uphill():
    """Sign and scale of the policy gradient: with the Q term alone, the executed action at
    s1 moves to the critic's argmax C, and Q(s, pi(s)) rises."""
    buf, empty = _toy_mdp(), ReplayBuffer(8, D, M)
    learner = _toy_learner(critic_warmup_updates=1500, actor_lr=1e-3, q_weight=1.0, anchor_weight=0.0,
                           q_filter=False, residual_scale=1.0, policy_delay=1, actor_update="dpg")
    ctx = np.random.default_rng(3).normal(size=(100, D - 1)).astype(np.float32)
    s1 = torch.from_numpy(np.c_[ctx, np.ones(100)].astype(np.float32))

    def gap():
        with torch.no_grad():
            return (compose_action(torch.zeros(100, M), learner.actor(s1), 1.0) - torch.from_numpy(C)).norm(dim=-1).mean().item()

    for _ in range(1500):
        learner.update(buf, empty)
    before = gap()
    assert before == pytest.approx(float(np.linalg.norm(C)), abs=1e-5)  # residual still zero
    for _ in range(600):
        learner.update(buf, empty)
    assert gap() < 0.3 * before


def _bad_anchor(rng):
    """Anchor rows at s1 whose action (-0.9, 0.9) is far from the best C."""
    anchor = ReplayBuffer(4096, D, M)
    for _ in range(512):
        s1 = np.append(rng.normal(size=D - 1), 1.0)
        bad = np.array([-0.9, 0.9])
        anchor.add({"state": s1, "base": np.zeros(M), "action": bad, "ret": _q1(bad), "next_state": s1,
                    "next_base": np.zeros(M), "discount": 0.0, "source": DEMO})
    return anchor


def test_awr_follows_the_advantage_and_anchor_and_start_weights_hold_it():
    """actor_update=awr (the default): with the anchor rows' weight at 0, regression onto the
    online rows' uniformly random actions, weighted by exp(A / T), walks the executed action at
    s1 to the critic's argmax C; with q_weight = 0 (the BC control) the same update walks it to
    the anchor's bad action instead; with start_weight > 0 after anchor pretraining onto the
    bad action, the trust region keeps the actor near that start, and once it has faded
    (``start_decay_updates``) the actor walks to C as without it."""
    buf, anchor = _toy_mdp(), _bad_anchor(np.random.default_rng(5))
    ctx = np.random.default_rng(3).normal(size=(100, D - 1)).astype(np.float32)
    s1 = torch.from_numpy(np.c_[ctx, np.ones(100)].astype(np.float32))

    def executed(learner):
        with torch.no_grad():
            return compose_action(torch.zeros(100, M), learner.actor(s1), 1.0).mean(0).numpy()

    common = dict(critic_warmup_updates=1500, actor_lr=1e-3, residual_scale=1.0, policy_delay=1,
                  anchor_ratio=0.5, actor_update="awr", awr_temperature=0.05)
    rl = _toy_learner(q_weight=1.0, anchor_weight=0.0, **common)
    bc = _toy_learner(q_weight=0.0, anchor_weight=1.0, **common)
    # trust region: pretrained onto the bad anchor action, then held there against the pull
    held = _toy_learner(q_weight=1.0, anchor_weight=0.0, start_weight=10.0, pretrain_lr=1e-3, **common)
    held.pretrain_actor(anchor, 1000)
    # the same trust region fading over 500 updates after the warm-up: held at first, then free
    faded = _toy_learner(q_weight=1.0, anchor_weight=0.0, start_weight=10.0, start_decay_updates=500,
                         pretrain_lr=1e-3, **common)
    faded.pretrain_actor(anchor, 1000)
    bad = np.array([-0.9, 0.9])
    assert np.linalg.norm(executed(held) - bad) < 0.15
    weight_online, start_weights = {}, []
    for name, learner in (("rl", rl), ("bc", bc), ("held", held), ("faded", faded)):
        for i in range(2500):
            weight_online[name] = learner.update(buf, anchor).get("weight_online")
            if name == "faded" and i + 1 in (1500, 1750, 2000):
                start_weights.append(learner.start_weight())
    assert start_weights == [10.0, 5.0, 0.0] and held.start_weight() == 10.0
    assert np.linalg.norm(executed(faded) - C) < 0.15  # free once the trust region has faded
    assert np.linalg.norm(executed(rl) - C) < 0.15  # started 0.36 away, at 0
    # anchor_weight = 0: anchor rows carry no weight at all; the control: only anchor rows do
    assert weight_online == {"rl": 1.0, "bc": 0.0, "held": 1.0, "faded": 1.0}
    assert np.linalg.norm(executed(bc) - bad) < 0.15
    # the same pull as rl's, but the start term keeps it within a quarter of the way to C
    assert np.linalg.norm(executed(held) - bad) < 0.25 * np.linalg.norm(bad - C)


def test_q_filter_keeps_bc_only_where_the_anchor_is_better():
    """Anchor actions at s1 are worse than zero (far from C): the filter drops their BC pull."""
    buf, anchor = _toy_mdp(), _bad_anchor(np.random.default_rng(5))
    learner = _toy_learner(critic_warmup_updates=1500, anchor_ratio=0.5, q_weight=1.0, anchor_weight=1.0,
                           q_filter=True, policy_delay=1, actor_update="dpg")
    for _ in range(1500):
        learner.update(buf, anchor)
    stats = learner.update(buf, anchor)
    assert stats["anchor_kept"] < 0.05


def test_select_update_and_value_gating_follow_the_critic():
    """actor_update=select: the actor regresses onto the critic's best nearby candidate, so
    the executed action at s1 walks to C; value gating picks a candidate at least as good as
    pi's; with q_weight = 0 the same update is plain BC on anchor rows."""
    buf, empty = _toy_mdp(), ReplayBuffer(8, D, M)
    learner = _toy_learner(critic_warmup_updates=1500, actor_lr=1e-3, residual_scale=1.0, policy_delay=1,
                           actor_update="select", gate_candidates=8, gate_std=0.3, exploration_std=0.0)
    ctx = np.random.default_rng(3).normal(size=(100, D - 1)).astype(np.float32)
    s1 = np.c_[ctx, np.ones(100)].astype(np.float32)

    def gap():
        with torch.no_grad():
            return (learner.actor(torch.from_numpy(s1)) - torch.from_numpy(C)).norm(dim=-1).mean().item()

    for _ in range(1500):
        learner.update(buf, empty)
    before = gap()
    for _ in range(600):
        learner.update(buf, empty)
    assert gap() < 0.3 * before
    # gating: the executed action's Q is never below the actor's own (pi is a candidate)
    learner2 = _toy_learner(gate_candidates=16, gate_std=0.5, exploration_std=0.0, residual_scale=1.0)
    for _ in range(1500):
        learner2.update(buf, empty)  # critic only: the actor stays at zero residual
    learner2.cfg.critic_warmup_updates = 0  # gating acts once the warm-up is over
    gated = np.stack([learner2.act(s, np.zeros(M, np.float32), explore=False) for s in s1])
    q_gated = learner2.q_value(s1, gated)
    q_pi = learner2.q_value(s1, np.zeros((100, M), np.float32))
    assert np.all(q_gated >= q_pi - 1e-6)
    # ... and lands nearer the true optimum C than the base action (0) does (on ~0.3 of the states
    # no candidate beats the base by the critic, so the mean gap is ~0.7 of the base's)
    assert np.linalg.norm(gated - C, axis=-1).mean() < 0.8 * np.linalg.norm(C)
    # a critic that has had no update does not choose, even with no warm-up: pi(s) acts (what
    # the start guard evaluates before RL starts)
    fresh = _toy_learner(gate_candidates=16, gate_std=0.5, exploration_std=0.0, residual_scale=1.0,
                         critic_warmup_updates=0)
    executed = np.stack([fresh.act(s, np.zeros(M, np.float32), explore=False) for s in s1[:20]])
    with torch.no_grad():
        own = fresh.actor(torch.as_tensor(np.asarray(s1[:20]), dtype=torch.float32)).clamp(-1, 1).numpy()
    np.testing.assert_allclose(executed, own, atol=1e-6)


def _executed_at_s1(learner):
    ctx = np.random.default_rng(3).normal(size=(100, D - 1)).astype(np.float32)
    s1 = torch.from_numpy(np.c_[ctx, np.ones(100)].astype(np.float32))
    with torch.no_grad():
        return compose_action(torch.zeros(100, M), learner.actor(s1), 1.0).mean(0).numpy()


def test_consistent_awr_and_the_uniform_control():
    """awr_advantage=q (Q(s, a) - Q(s, pi(s)), the same online heads on both sides) walks the
    executed action at s1 to the critic's argmax C even with the bad anchor rows in every
    batch; awr_weights=uniform regresses onto every row alike, so it lands between the
    random online actions (mean 0) and the anchor's bad action, far from C."""
    buf, anchor = _toy_mdp(), _bad_anchor(np.random.default_rng(5))
    common = dict(critic_warmup_updates=1500, actor_lr=1e-3, residual_scale=1.0, policy_delay=1,
                  anchor_ratio=0.5, actor_update="awr", awr_temperature=0.05)
    consistent = _toy_learner(awr_advantage="q", anchor_weight=0.0, **common)
    uniform = _toy_learner(awr_weights="uniform", **common)
    stats = {}
    for name, learner in (("consistent", consistent), ("uniform", uniform)):
        for _ in range(2500):
            stats[name] = learner.update(buf, anchor)
    assert np.linalg.norm(_executed_at_s1(consistent) - C) < 0.15
    bad = np.array([-0.9, 0.9])
    # every row weighs 1: at s1 the anchor rows (half the batch, all at s1) outnumber the
    # online rows (a quarter: half the online rows are at s0) 2:1, so the target is 2/3 bad
    assert np.linalg.norm(_executed_at_s1(uniform) - 2 * bad / 3) < 0.1
    assert stats["uniform"]["weight_online"] == pytest.approx(0.5, abs=0.1)
    assert stats["uniform"]["advantage"] == 0.0


def test_anchor_bc_fades_out_after_the_warm_up():
    """anchor_decay_updates: the anchor rows' weight is anchor_weight through the critic
    warm-up, falls linearly to 0 over the next anchor_decay_updates updates, and then the
    critic alone steers (dpg): the executed action reaches C despite the bad anchor; without
    the fade, the same run stays pulled toward the anchor."""
    buf, anchor = _toy_mdp(), _bad_anchor(np.random.default_rng(5))
    common = dict(critic_warmup_updates=1500, actor_lr=1e-3, residual_scale=1.0, policy_delay=1,
                  anchor_ratio=0.5, actor_update="dpg", q_weight=1.0, anchor_weight=1.0)
    fading = _toy_learner(anchor_decay_updates=400, **common)
    kept = _toy_learner(anchor_decay_updates=0, **common)
    weights = []
    for i in range(3000):
        fading.update(buf, anchor)
        kept.update(buf, anchor)
        if i + 1 in (1500, 1700, 1900, 3000):
            weights.append(fading.anchor_weight())
    assert weights == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert kept.anchor_weight() == 1.0
    gap_fading = np.linalg.norm(_executed_at_s1(fading) - C)
    assert gap_fading < 0.15
    assert np.linalg.norm(_executed_at_s1(kept) - C) > 2 * gap_fading


def test_best_candidate_is_the_mean_head_argmax_and_returns_its_heads_q():
    """The chosen residual is the candidate whose composed action has the highest mean-head Q
    (checked against scoring each candidate with the plain forward), and the Q it returns per
    head is the critic's at that choice (what the max-Q backup reuses)."""
    learner = _toy_learner(critic_heads=4, critic_subset=2)
    g = torch.Generator().manual_seed(3)
    s, base = torch.randn(32, D, generator=g), torch.rand(32, M, generator=g) - 0.5
    cands = learner.candidates(torch.rand(32, M, generator=g) - 0.5, 8, 0.5)
    chosen, q = learner.best_candidate(s, base, cands)
    scale = learner.cfg.residual_scale
    plain = torch.stack([learner.critic(s, compose_action(base, c, scale)).mean(0) for c in cands])  # (K, B)
    torch.testing.assert_close(chosen, cands[plain.argmax(0), torch.arange(32)])
    torch.testing.assert_close(q, learner.critic(s, compose_action(base, chosen, scale)), rtol=1e-5, atol=1e-5)
    assert (chosen != cands[0]).any(-1).any()  # the choice is not always pi's own residual


def test_max_q_backup_values_what_a_gated_actor_would_do():
    """backup_candidates: s0's target bootstraps through the best of candidates around pi'(s1)
    (pi' = 0 here), so Q(s0) rises above gamma * Q(s1, 0) toward gamma * max_a Q(s1, a) = 0.9,
    where the TD3 backup recovers gamma * _q1(0) exactly."""
    buf, empty = _toy_mdp(), ReplayBuffer(8, D, M)
    plain = _toy_learner()
    maxq = _toy_learner(backup_candidates=16, gate_std=0.5)
    for _ in range(1500):
        plain.update(buf, empty)
        maxq.update(buf, empty)
    ctx = np.random.default_rng(7).normal(size=(200, D - 1)).astype(np.float32)
    s0, a = np.c_[ctx, np.zeros(200)], np.zeros((200, M), np.float32)
    td3 = 0.9 * float(_q1(np.zeros(M)))
    assert abs(plain.q_value(s0, a).mean() - td3) < 0.03
    # the best reachable bootstrap is 0.9 * 1 = 0.9, 0.029 above TD3's: max-Q finds part of it
    assert maxq.q_value(s0, a).mean() > plain.q_value(s0, a).mean() + 0.005
    assert maxq.q_value(s0, a).mean() < 0.9 + 0.02


def test_the_max_q_backup_reuses_the_chosen_candidates_q_for_the_same_target():
    """The backup takes its target heads' Q from the choice's scoring instead of a second
    target forward: the same TD targets, so the same critic after an update, as a learner
    forced to recompute them (same seed, same batches), with a head subset of 2 of 4."""
    buf, empty = _toy_mdp(), ReplayBuffer(8, D, M)
    reused, recomputed = (_toy_learner(backup_candidates=8, gate_std=0.5, critic_heads=4, critic_subset=2)
                          for _ in range(2))
    plain_choice = recomputed.best_candidate
    chosen = []

    def recompute(*args, **kwargs):  # the choice alone: the backup then evaluates it afresh
        choice = plain_choice(*args, **kwargs)[0]
        chosen.append(choice)
        return choice, None

    recomputed.best_candidate = recompute
    for _ in range(5):
        reused.update(buf, empty)
        recomputed.update(buf, empty)
    assert len(chosen) == 5 and all((c != 0).any() for c in chosen)
    for a, b in zip(reused.critic.parameters(), recomputed.critic.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    fresh = _toy_learner(backup_candidates=8, gate_std=0.5, critic_heads=4, critic_subset=2)
    assert any((a != p).any() for a, p in zip(reused.critic.parameters(), fresh.critic.parameters()))


def test_grad_clip_bounds_the_step_direction_norm_and_reports_the_norm_before_it():
    """grad_clip: the critic's flat gradient is rescaled to at most grad_clip before the step;
    the diagnostics report the norm before clipping (what says whether the clip is active)."""
    buf, empty = _toy_mdp(), ReplayBuffer(8, D, M)
    free, clipped = _toy_learner(), _toy_learner(grad_clip=1e-3)
    free_norm = free.update(buf, empty, diagnostics=True)["critic_grad_norm"]
    reported = clipped.update(buf, empty, diagnostics=True)["critic_grad_norm"]
    assert free_norm > 1e-2
    assert reported == pytest.approx(free_norm, rel=1e-5)  # same seed, same batch: the unclipped norm
    # the gradient the optimiser stepped with (left in the flat buffer) is the clipped one
    assert float(torch.linalg.vector_norm(clipped.critic_flat.grad)) == pytest.approx(1e-3, rel=1e-3)


def test_awr_only_settings_are_refused_for_other_actor_updates():
    with pytest.raises(Exception, match="run.learner.awr_advantage"):
        LearnerConfig(actor_update="dpg", awr_advantage="td").validate()
    with pytest.raises(Exception, match="run.learner.awr_weights"):
        LearnerConfig(awr_weights="sometimes").validate()


def test_divergence_stops_with_a_clear_error():
    cfg = LearnerConfig(batch_size=8, hidden=8, critic_hidden=8, buffer_size=64)
    learner = ResidualLearner(cfg, D, M)
    buf = ReplayBuffer(64, D, M)
    for _ in range(16):
        buf.add({"state": np.full(D, 1e30), "base": np.zeros(M), "action": np.zeros(M), "ret": 0.0,
                 "next_state": np.zeros(D), "next_base": np.zeros(M), "discount": 0.0})
    with pytest.raises(LearnerDiverged, match="critic diverged"):
        for _ in range(5):
            learner.update(buf, ReplayBuffer(8, D, M))



def test_q_bounded_values_the_action_the_regression_target_stands_for():
    """awr_advantage=q values an anchor row at its recorded action, even one beyond the bound
    (an expert's); q_bounded at b + scale * clip((a - b) / scale), the action its regression
    target r_data makes, as Q(s, pi(s)) is valued at an action the residual can reach."""
    rows = {"state": torch.zeros(4, D), "base": torch.zeros(4, M), "action": torch.full((4, M), 0.9),
            "is_anchor": torch.ones(4)}
    valued = {}
    for mode in ("q", "q_bounded"):
        learner = _toy_learner(actor_update="awr", awr_advantage=mode, residual_scale=0.3)
        seen = []
        forward = learner.critic.forward
        learner.critic.forward = lambda s, a, f=forward: seen.append(a.detach().clone()) or f(s, a)
        learner._awr_step(rows, torch.zeros(4), diagnostics=False)
        # the first call values pi(s) (within the bound), the second the data's side
        assert seen[0].abs().max() <= 0.3 + 1e-6
        valued[mode] = seen[1]
    assert torch.allclose(valued["q"], torch.full((4, M), 0.9))
    assert torch.allclose(valued["q_bounded"], torch.full((4, M), 0.3))


def test_advantage_spread_says_when_awr_weights_follow_critic_noise():
    """The AWR diagnostics: uniform weights have an effective sample size of the whole batch,
    one dominant weight of about one row; heads that disagree by more than the rows differ
    give a signal-to-noise ratio below 1, heads that agree one far above it."""
    B, E = 64, 4
    adv = torch.linspace(-0.01, 0.01, B)
    uniform = advantage_spread(adv, None, torch.ones(B), 20.0)
    assert uniform["awr_weight_ess"] == pytest.approx(1.0) and uniform["awr_weight_clipped"] == 0.0
    assert "advantage_snr" not in uniform  # the TD advantage has no per-head values
    one = torch.full((B,), 1e-6)
    one[3] = 20.0
    peaked = advantage_spread(adv, None, one, 20.0)
    assert peaked["awr_weight_ess"] == pytest.approx(1 / B, rel=1e-3) and peaked["awr_weight_clipped"] == 1 / B
    g = torch.Generator().manual_seed(0)
    noisy = adv[None] + 0.1 * torch.randn(E, B, generator=g)
    agreeing = adv[None] + 1e-4 * torch.randn(E, B, generator=g)
    assert advantage_spread(adv, noisy, torch.ones(B), 20.0)["advantage_snr"] < 0.2
    assert advantage_spread(adv, agreeing, torch.ones(B), 20.0)["advantage_snr"] > 10
    assert advantage_spread(adv, noisy, torch.ones(B), 20.0)["advantage_abs_p50"] == pytest.approx(
        adv.abs().median().item())


def test_awr_diagnostics_reach_the_update_stats():
    """A measured AWR step reports the advantage spread its weights came from."""
    learner = _toy_learner(actor_update="awr", critic_warmup_updates=0, policy_delay=1)
    rows = {"state": torch.randn(8, D), "base": torch.zeros(8, M), "action": torch.rand(8, M) * 0.2,
            "is_anchor": torch.zeros(8)}
    stats = learner._awr_step(rows, torch.zeros(8), diagnostics=True)
    assert 0 < stats["awr_weight_ess"] <= 1 and stats["advantage_snr"] >= 0 and stats["advantage_head_std"] > 0
    assert "awr_weight_ess" not in learner._awr_step(rows, torch.zeros(8), diagnostics=False)


def test_measure_awr_reads_a_checkpoint_without_changing_the_run():
    """measure_awr samples with its own generator: a run measured mid-way draws the same
    batches afterwards as one never measured. The TD advantage cannot be measured from replay."""
    buf = ReplayBuffer(256, D, M)
    rng = np.random.default_rng(0)
    for _ in range(64):
        buf.add({"state": rng.normal(size=D), "base": np.zeros(M), "action": rng.uniform(-0.2, 0.2, M),
                 "ret": 1.0, "next_state": rng.normal(size=D), "next_base": np.zeros(M), "discount": 0.0})
    a, b = (_toy_learner(actor_update="awr", awr_advantage="q") for _ in range(2))
    spread = a.measure_awr(buf, rows=128)
    assert 0 < spread["awr_weight_ess"] <= 1 and spread["advantage_head_std"] > 0
    assert torch.equal(a.generator.get_state(), b.generator.get_state())
    with pytest.raises(ValueError, match="awr_advantage=td"):
        _toy_learner(actor_update="awr", awr_advantage="td").measure_awr(buf)


def test_cql_presses_the_gates_best_candidate_down_to_the_data():
    """Data that only ever tried the base action at s1 (reward 0.5 there): an untouched critic
    extrapolates, and the best of the gate's candidates around pi(s) = 0 scores above the
    data's own action; the CQL gap on those candidates takes that excess away, and Q of the
    data's action stays at its return."""
    rng = np.random.default_rng(2)
    buf, empty = ReplayBuffer(2048, D, M), ReplayBuffer(8, D, M)
    for _ in range(1024):
        s1 = np.append(rng.normal(size=D - 1), 1.0)
        buf.add({"state": s1, "base": np.zeros(M), "action": rng.normal(0, 0.02, M), "ret": 0.5,
                 "next_state": s1, "next_base": np.zeros(M), "discount": 0.0})
    s1 = np.c_[rng.normal(size=(200, D - 1)), np.ones(200)].astype(np.float32)

    def excess(**overrides):
        learner = _toy_learner(gate_candidates=8, gate_std=0.5, residual_scale=1.0, **overrides)
        for _ in range(800):
            stats = learner.update(buf, empty)
        with torch.no_grad():
            s = torch.from_numpy(s1)
            cands = learner.candidates(learner.actor(s), 8, 0.5)
            q = learner.critic.candidates(s, compose_action(torch.zeros(200, M), cands, 1.0)).mean(0)  # (K, B)
        return (q.max(0).values - q[0]).mean().item(), q[0].mean().item(), stats

    plain, _, plain_stats = excess()
    cql, q_data, stats = excess(cql_weight=1.0)
    # the gap pairs each row's candidates with that row's state: the same number from the
    # per-candidate scoring the gate uses, on the same draws
    learner = _toy_learner(gate_candidates=8, gate_std=0.5, residual_scale=1.0, cql_weight=1.0)
    for _ in range(50):
        learner.update(buf, empty)
    b = mixed_batch(buf, empty, 64, 0.0, torch.Generator().manual_seed(5))
    q = learner.critic(b["state"], b["action"])
    draws = learner.generator.get_state()
    gap = learner._cql_gap(b, q).item()
    learner.generator.set_state(draws)
    with torch.no_grad():
        cands = learner.candidates(learner.actor(b["state"]), 8, 0.5)
        q_c = learner.critic.candidates(b["state"], compose_action(b["base"], cands, 1.0))  # (E, K, B)
        expected = (0.003 * torch.logsumexp(q_c / 0.003, dim=1) - q).mean().item()
    assert gap == pytest.approx(expected, abs=1e-5)
    assert plain > 0.01 and cql < 0.3 * plain, (plain, cql)
    assert abs(q_data - 0.5) < 0.05 and "cql_gap" in stats and "cql_gap" not in plain_stats
    with pytest.raises(ConfigError, match="run.learner.cql_weight"):
        LearnerConfig(cql_weight=1.0, gate_candidates=0, actor_update="awr").validate()
