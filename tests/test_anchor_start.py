"""``arli bench anchor-start``: each point is exactly the start ``arli finetune`` would make
with that pretraining lr and update count, however many points were measured before it."""

from dataclasses import replace

import torch

from arli.bench.anchor_start import aggregate, pretraining_restarter
from arli.finetune import Finetuner
from arli.latency import FixedLatency
from arli.policies.expert import ExpertChunkPolicy
from arli.rl.config import LearnerConfig, RunSpec
from sim_envs import make_env
from sim_envs.experts import EXPERTS

TINY = LearnerConfig(batch_size=32, hidden=32, critic_hidden=32, critic_heads=2, pretrain_updates=0)


def _prepared(learner: LearnerConfig) -> Finetuner:
    spec = RunSpec(env_steps=100, anchor_episodes=2, eval_episodes=1, guard_episodes=1, seed=3, learner=learner)
    ft = Finetuner(spec, make_env("pick_cube", max_episode_steps=40), ExpertChunkPolicy("pick_cube", 16),
                   EXPERTS["pick_cube"], FixedLatency(0.2))
    ft.prepare()
    return ft


def _actor(ft: Finetuner) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in ft.learner.actor.parameters()])


def test_a_restarted_pretraining_equals_prepare_with_those_settings():
    bench = _prepared(TINY)
    restart = pretraining_restarter(bench)
    zero = _actor(bench).clone()
    restart(1e-3, 40)  # an earlier point moves the actor and the generator...
    assert not torch.equal(_actor(bench), zero)
    restart(1e-4, 25)  # ...and the next point starts from scratch all the same
    direct = _prepared(replace(TINY, pretrain_lr=1e-4, pretrain_updates=25))
    torch.testing.assert_close(_actor(bench), _actor(direct), rtol=0, atol=0)
    restart(1e-4, 0)
    torch.testing.assert_close(_actor(bench), zero, rtol=0, atol=0)


def test_points_average_over_seeds_per_delay_lr_and_updates():
    rows = [{"delay_steps": 4, "seed": s, "pretrain_lr": 1e-4, "updates": 500, "success": v}
            for s, v in ((0, 0.8), (1, 0.9), (2, 1.0))]
    rows.append({"delay_steps": 0, "seed": 0, "pretrain_lr": 1e-4, "updates": 500, "success": 0.5})
    points = {(p["delay_steps"], p["updates"]): p for p in aggregate(rows)}
    assert abs(points[(4, 500)]["success_mean"] - 0.9) < 1e-9 and points[(4, 500)]["per_seed"] == {0: 0.8, 1: 0.9, 2: 1.0}
    assert points[(0, 500)]["success_mean"] == 0.5 and points[(0, 500)]["success_std"] == 0.0


def test_points_are_kept_apart_per_demonstrator():
    rows = [{"delay_steps": 8, "seed": s, "demonstrations": m, "pretrain_lr": 1e-4, "updates": 2000, "success": v}
            for s in (0, 1) for m, v in (("expert", 0.4 + 0.1 * s), ("bounded", 0.7 + 0.1 * s))]
    points = {p["demonstrations"]: p for p in aggregate(rows)}
    assert set(points) == {"expert", "bounded"}
    assert abs(points["bounded"]["success_mean"] - 0.75) < 1e-9 and points["expert"]["per_seed"] == {0: 0.4, 1: 0.5}
