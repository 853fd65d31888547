"""LeRobot's own training entry point (`lerobot-train`) on state-only demos made by
`arli collect-demos`: proprioception in observation.state, the object state in
observation.environment_state, as LeRobot's ACT and Diffusion expect. The trained ACT
checkpoint then runs through our adapter on the full sim state."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from arli.demos import collect_demos
from arli.types import PolicyRequest
from sim_envs import make_env

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
LEROBOT_TRAIN = str(Path(os.sys.executable).parent / "lerobot-train")
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos") / "pick"
    collect_demos("pick_cube", 3, str(root))
    return root


def _train(demos, out, policy_args):
    proc = subprocess.run([LEROBOT_TRAIN, "--dataset.repo_id=arli/local", f"--dataset.root={demos}",
                           "--policy.device=cpu", "--policy.push_to_hub=false", "--steps=3", "--batch_size=4",
                           "--num_workers=0", "--wandb.enable=false", "--eval_freq=0", "--log_freq=1",
                           f"--output_dir={out}", *policy_args], capture_output=True, text=True, env=ENV, timeout=500)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    losses = [float(x) for x in re.findall(r"loss:([0-9.]+)", log)]
    assert len(losses) == 3 and np.isfinite(losses).all(), log[-2000:]
    return log


@pytest.mark.slow
def test_lerobot_trains_act_and_our_adapter_runs_it(demos, tmp_path):
    from arli.policies.load import load_base_policy  # noqa: PLC0415

    out = tmp_path / "act"
    _train(demos, out, ["--policy.type=act", "--policy.dim_model=32", "--policy.n_heads=2",
                        "--policy.dim_feedforward=32", "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
                        "--policy.chunk_size=10", "--policy.n_action_steps=10", "--save_checkpoint=true",
                        "--save_freq=3"])
    ckpt = out / "checkpoints" / "000003" / "pretrained_model"
    policy = load_base_policy(str(ckpt), task="pick up the red cube and lift it")
    assert (policy.state_dim, policy.env_dim) == (9, 8)
    obs, _ = make_env("pick_cube").reset(seed=0)
    chunk = policy.infer(PolicyRequest.of(obs["state"]))  # the full 17-d sim state, split for it
    assert chunk.shape == (10, 5) and np.isfinite(chunk).all()


@pytest.mark.slow
def test_lerobot_trains_diffusion(demos, tmp_path):
    _train(demos, tmp_path / "diffusion", ["--policy.type=diffusion", "--policy.down_dims=[32,64]",
                                           "--policy.horizon=16", "--policy.n_action_steps=8",
                                           "--policy.num_inference_steps=3", "--save_checkpoint=false"])
