"""Finetuning: exact resume from a checkpoint, and the real entry point improving success."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from arli.finetune import Finetuner
from arli.latency import FixedLatency
from arli.rl.config import InterventionSpec, LearnerConfig, RunSpec
from sim_envs import make_env
from sim_envs.experts import EXPERTS, ExpertChunkPolicy

# q_weight > 0 so resuming covers the critic's pull on the actor too (off by default)
TINY = LearnerConfig(batch_size=32, hidden=32, critic_heads=2, critic_warmup_updates=20, pretrain_updates=30,
                     q_weight=0.1)


def _finetuner(seed=0):
    spec = RunSpec(env_steps=400, anchor_episodes=2, intervention=InterventionSpec(prob=0.5, after=10),
                   learn_after=64, eval_every=10_000, eval_episodes=2, seed=seed, learner=TINY)
    env = make_env("pick_cube", max_episode_steps=40)
    return Finetuner(spec, env, ExpertChunkPolicy("pick_cube", 16), EXPERTS["pick_cube"],
                     FixedLatency(0.2))


def _params(ft):
    return torch.cat([p.detach().flatten() for p in
                      list(ft.learner.actor.parameters()) + list(ft.learner.critic.parameters())])


def test_checkpoint_resume_continues_identically(tmp_path):
    a = _finetuner()
    a.prepare()
    a.train(150, progress=False)
    saved_steps, saved_updates = a.controller.env_steps, a.learner.updates
    a.save(str(tmp_path / "ckpt"))
    a.train(400, progress=False)

    b = _finetuner()
    b.load(str(tmp_path / "ckpt"))
    assert (b.controller.env_steps, b.learner.updates) == (saved_steps, saved_updates)
    assert saved_steps >= 150 and saved_updates > 0
    b.train(400, progress=False)
    assert a.controller.env_steps == b.controller.env_steps
    assert a.learner.updates == b.learner.updates > 0
    torch.testing.assert_close(_params(a), _params(b), rtol=0, atol=0)
    assert len(a.online) == len(b.online) and len(a.anchor) == len(b.anchor)
    np.testing.assert_array_equal(a.online.data["ret"], b.online.data["ret"])


def test_interventions_and_anchor_data_are_routed_to_anchor_replay():
    ft = _finetuner()
    n_anchor = ft.collect_anchor()
    assert n_anchor > 0 and len(ft.online) == 0 and ft.controller.env_steps == 0
    assert ft.controller.intervened_steps == 0  # demonstrations are not online interventions
    # anchor rows carry the expert's action and the base action the scheduler had (relabel)
    data = {k: v[:n_anchor] for k, v in ft.anchor.data.items()}
    assert np.abs(data["action"] - data["base"]).max() > 0.1
    ft.train(200, progress=False)
    assert len(ft.online) > 0 and ft.controller.env_steps >= 200


def test_finetune_entry_point_improves_success(tmp_path):
    """Easy configuration, fixed seed: the expert's open-loop chunks on pick_cube fail under
    async execution at d = 4; ARLI finetuning with a small budget must do measurably better."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "arli.cli", "finetune", "env=pick_cube", "checkpoint=expert",
         "delay_steps=4", "env_steps=4000", "eval_every=2000", "eval_episodes=10",
         "final_eval_episodes=30", "anchor_episodes=10", "learn_after=300", "learner.hidden=128",
         "learner.critic_warmup_updates=200", f"output_dir={out}"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finetuned_success"] >= summary["base_success"] + 0.15, summary
    for name in ("checkpoint/trainer_state.pt", "checkpoint/residual_actor.safetensors",
                 "learning_curve.png", "config.yaml"):
        assert (out / name).exists(), name
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "tb"))


def test_corrective_interventions_are_expert_labelled_anchor_rows():
    """Base chunks fail under delay, so the intervener keeps correcting; every step it takes
    becomes one anchor transition whose action is the expert's at that state."""
    spec = RunSpec(env_steps=300, anchor_episodes=0, learn_after=10**9, eval_every=10_000, learner=TINY,
                   intervention=InterventionSpec(prob=1.0, after=0, mode="corrective", segment=5))
    env = make_env("pick_cube", max_episode_steps=60)
    ft = Finetuner(spec, env, ExpertChunkPolicy("pick_cube", 16), EXPERTS["pick_cube"], FixedLatency(0.2))
    ft.train(progress=False)
    ctl, n = ft.controller, env.observation_space["state"].shape[0]
    assert 0 < ctl.intervened_steps < ctl.env_steps  # short segments, not whole episodes
    assert len(ft.anchor) == ctl.intervened_steps and len(ft.online) == ctl.env_steps - ctl.intervened_steps
    rows = ft.anchor.data
    expert = np.stack([EXPERTS["pick_cube"](s[:n]) for s in rows["state"][: len(ft.anchor)]])
    np.testing.assert_allclose(rows["action"][: len(ft.anchor)], expert, atol=1e-6)


def test_resuming_an_older_checkpoint_fails_clearly_and_leaves_it_intact(tmp_path):
    ft = _finetuner()
    ft.save(str(tmp_path / "ckpt"))
    path = tmp_path / "ckpt" / "trainer_state.pt"
    state = torch.load(path, weights_only=False)
    del state["assisted"]  # what the previous version wrote
    torch.save(state, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="older ARLI.*start a new run"):
        _finetuner().load(str(tmp_path / "ckpt"))
    assert path.read_bytes() == before
