"""The real entry points with tiny budgets: collect -> pretrain -> bench base."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from arli.policies.flow import FlowPolicy
from arli.policies.load import policy_digest
from arli.types import PolicyRequest


def _arli(*args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "arli.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_pretrain_then_bench_base(tmp_path):
    ds, ckpt, rep = tmp_path / "ds", tmp_path / "ckpt", tmp_path / "reports"
    tiny = ("env=pick_cube", f"dataset_root={ds}", "steps=40", "batch_size=32", "eval_every=40",
            "eval_episodes=1", "policy.d_model=32", "policy.n_heads=2", "policy.ff_dim=64", "policy.num_steps=2")
    _arli("pretrain", *tiny, f"output_dir={ckpt}", "demos=4")
    summary = json.loads((ckpt / "pretrain_summary.json").read_text())
    assert summary["episodes"] == 4 and summary["history"][-1]["step"] == 40
    # the same seed and demos give the same base policy, initial weights included (a fresh
    # clone's `make demo` reproduces the documented base), and another seed does not
    out = _arli("pretrain", *tiny, f"output_dir={tmp_path / 'again'}", "demos=6")  # the 4 already there
    assert "holds 4 episodes, not demos=6" in out
    _arli("pretrain", *tiny, f"output_dir={tmp_path / 'seed1'}", "seed=1", "demos=4")
    weights = [(tmp_path / d / "model.safetensors").read_bytes() for d in ("ckpt", "again", "seed1")]
    assert weights[0] == weights[1] and weights[0] != weights[2]
    # the digest a sweep keys its cells on follows the weights, not the summary's wall times
    digests = [policy_digest(str(tmp_path / d)) for d in ("ckpt", "again", "seed1")]
    assert digests[0] == digests[1] != digests[2]
    assert summary["digest"] == digests[0] and summary["threads"] == 2
    assert (ckpt / "pretrain_summary.json").read_bytes() != (tmp_path / "again" / "pretrain_summary.json").read_bytes()
    policy = FlowPolicy.load(str(ckpt))
    assert policy.cfg.instruction == "pick up the red cube and lift it"
    chunk = policy.infer(PolicyRequest.of(np.zeros(policy.cfg.state_dim, np.float32)))
    assert chunk.shape == (16, 5) and np.all(np.abs(chunk) <= 1)

    out = _arli("bench", "base", "env=pick_cube", f"checkpoint={ckpt}", "episodes=2",
                "delay_steps=[0,4]", "strategies=[sync,rtc]", "trace_episodes=2", f"report_dir={rep}")
    last = json.loads(out.strip().splitlines()[-1])
    assert last["env"] == "pick_cube"
    keys = {(c["mode"], c["strategy"], c["delay_steps"]) for c in last["cells"]}
    assert keys == {("sync", "none", 0), ("async", "rtc", 0), ("sync", "none", 4), ("async", "rtc", 4)}
    assert all(c["episodes"] == 2 and 0 <= c["success"] <= 1 for c in last["cells"])
    assert json.loads((rep / "base_pick_cube.json").read_text()) == last
    assert (rep / "base_pick_cube.png").stat().st_size > 1000
    # traced episodes: one row per delay, with the comparison to the expert and the split
    assert [t["delay_steps"] for t in last["traces"]] == [0, 4]
    for t in last["traces"]:
        assert t["episodes"] == 2 and t["expert_gap"] >= 0 and t["obs_age"] >= t["delay_steps"]
    # a checkpoint of another task: one clear line, nothing written
    wrong = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "base", "env=peg_insert", f"checkpoint={ckpt}",
                            f"report_dir={tmp_path / 'wrong'}"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert wrong.returncode == 2 and "takes a 17-d state" in wrong.stderr and "20-d" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1 and not (tmp_path / "wrong").exists()
    assert "Why it fails" in (rep / "base_pick_cube.md").read_text()


def test_image_observations_flow_from_dataset_to_policy(tmp_path):
    from arli.demos import collect_demos, load_chunk_dataset
    from arli.policies.flow_config import FlowHyperparams
    from arli.pretrain import build_policy, train_flow
    from sim_envs import make_env

    collect_demos("pick_cube", 2, str(tmp_path / "ds"), seed=0, image_size=32)
    data = load_chunk_dataset(str(tmp_path / "ds"), chunk_size=8)
    assert data["images"].shape == (len(data["state"]), 1, 32, 32, 3) and data["images"].std() > 5
    policy = build_policy(data, FlowHyperparams(chunk_size=8, d_model=32, n_heads=2, ff_dim=64,
                                                num_steps=2))
    assert policy.cfg.image_size == 32 and policy.cfg.cameras == ["front"]
    train_flow(policy, data, steps=3, batch_size=8, lr=1e-3, weight_decay=0.0, seed=0)
    obs, _ = make_env("pick_cube", image_size=32).reset(seed=0)
    policy.reset(0)
    a = policy.infer(PolicyRequest.of(obs["state"], {"front": obs["images"]["front"]}))
    policy.reset(0)
    b = policy.infer(PolicyRequest.of(obs["state"], {"front": 255 - obs["images"]["front"]}))
    assert a.shape == (8, 5) and not np.allclose(a, b)  # the image is actually used
    with pytest.raises(ValueError, match=r"camera 'front' missing: this policy needs \{'front': \(32, 32, 3\)\} \(h, w, 3\) uint8, the observation has \[\]"):
        policy.infer(PolicyRequest.of(obs["state"]))
    with pytest.raises(ValueError, match=r"camera 'front' must be a \(32, 32, 3\) uint8 image"):
        policy.infer(PolicyRequest.of(obs["state"], {"front": np.zeros((24, 24, 3), np.uint8)}))


def test_a_mistyped_checkpoint_is_an_error_not_a_pretraining(tmp_path):
    typo = tmp_path / "chekpoint"
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "base", "env=pick_cube", f"checkpoint={typo}"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert f"no policy at {typo}" in message and "arli pretrain env=pick_cube" in message
    assert len(message.strip().splitlines()) <= 3  # a clear line, not a traceback
    assert not typo.exists()  # nothing written
