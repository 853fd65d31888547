"""Replay, n-step targets, residual networks and the anchored learner."""

import math

import numpy as np
import pytest
import torch

from arli.policies.residual import EnsembleCritic, ResidualActor, compose_action
from arli.rl.collect import Intervention
from arli.rl.config import InterventionSpec, LearnerConfig
from arli.rl.learner import ResidualLearner
from arli.rl.replay import NStepAccumulator, ReplayBuffer, mixed_batch

D, M = 6, 2


def _push(acc, reward, terminated=False, truncated=False, tag=""):
    s = np.full(D, reward)
    return acc.push(s, np.zeros(M), np.zeros(M), reward, s + 100, np.ones(M), terminated, truncated, tag)


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
    with pytest.raises(ValueError, match="NaN"):
        buf.add({**tr, "ret": float("nan")})
    assert len(buf) == 4


def test_zero_initial_residual():
    actor = ResidualActor(D, M)
    s = torch.randn(32, D)
    assert torch.all(actor(s) == 0)
    base = torch.rand(32, M) * 2 - 1
    torch.testing.assert_close(compose_action(base, actor(s), 0.3), base)


def test_compose_clips_to_the_action_range():
    out = compose_action(np.array([0.9, -0.9]), np.array([1.0, -1.0]), 0.3)
    np.testing.assert_allclose(out, [1.0, -1.0])


def test_batched_ensemble_equals_separate_heads():
    critic = EnsembleCritic(D, M, heads=3, hidden=16)
    s, a = torch.randn(5, D), torch.randn(5, M)
    q = critic(s, a)
    x = torch.cat([s, a], -1)
    for e in range(3):
        h = torch.relu(torch.nn.functional.layer_norm(x @ critic.l1.weight[e] + critic.l1.bias[e], (16,)))
        h = torch.relu(torch.nn.functional.layer_norm(h @ critic.l2.weight[e] + critic.l2.bias[e], (16,)))
        torch.testing.assert_close(q[e], (h @ critic.l3.weight[e] + critic.l3.bias[e]).squeeze(-1))


def _anchor_setup(**overrides):
    """A learner and an anchor buffer whose actions are the base shifted by (0.3, -0.2)."""
    cfg = LearnerConfig(**{"batch_size": 64, "hidden": 32, "critic_warmup_updates": 0, "policy_delay": 1,
                           "anchor_ratio": 1.0, "anchor_weight": 10.0, "actor_lr": 1e-3,
                           "residual_scale": 0.5, **overrides})
    learner = ResidualLearner(cfg, D, M, seed=0)
    anchor = ReplayBuffer(512, D, M)
    rng = np.random.default_rng(0)
    for _ in range(256):
        s, b = rng.normal(size=D), rng.uniform(-0.5, 0.5, M)
        anchor.add({"state": s, "base": b, "action": b + np.array([0.3, -0.2]), "ret": 0.0,
                    "next_state": s, "next_base": b, "discount": 0.0})
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
    cfg = LearnerConfig(batch_size=16, hidden=16, critic_warmup_updates=20, policy_delay=1, q_weight=1.0)
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
