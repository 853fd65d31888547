"""The three roles on a (simulated) Franka, as real processes: `arli serve` with a LeRobot
ACT checkpoint, `arli learner robot=franka`, `arli actor robot=franka` driving franky-sim over
the libfranka protocol and recording every episode. Nothing is mocked but the arm's physics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from lerobot_utils import save_lerobot_policy
from process_utils import ROOT, franky_sim_server, free_ports, running

pytest.importorskip("franky")
pytestmark = pytest.mark.timeout(420)


@pytest.mark.slow
def test_serve_learner_actor_on_a_franka_record_and_learn(tmp_path):
    act = tmp_path / "act"
    save_lerobot_policy("act", act, 9, 5, chunk_size=10, n_action_steps=10, dim_model=32, n_heads=2,
                        dim_feedforward=32, n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    p_server, p_learner, p_weights = free_ports(3)
    transport = [f"transport.server=tcp://127.0.0.1:{p_server}", f"transport.learner=tcp://127.0.0.1:{p_learner}",
                 f"transport.weights=tcp://127.0.0.1:{p_weights}"]
    host = f"127.0.{os.getpid() % 250 + 1}.20"
    out = tmp_path / "run"
    out.mkdir()
    with franky_sim_server(host), \
            running(["serve", "env=pick_cube", f"checkpoint={act}", *transport], out / "serve.log"), \
            running(["learner", "robot=franka", "env=pick_cube", "chunk_size=10", "run.anchor_episodes=0",
                     "run.env_steps=100000", "run.learn_after=30", "run.learner.pretrain_updates=0",
                     "run.learner.critic_warmup_updates=5", "checkpoint_every_s=1",
                     f"output_dir={out}/learner", *transport], out / "learner.log"):
        actor = subprocess.run(
            [sys.executable, "-m", "arli.cli", "actor", "robot=franka", f"franka.hostname={host}",
             "franka.realtime=false", "franka.max_episode_steps=30", "franka.home_dynamics_factor=0.6",
             "max_episodes=3", "chunking.planned_delay_steps=2", "weights_timeout_s=90", "env=pick_cube", f"record_root={out}/rec",
             f"output_dir={out}/actor", *transport],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
        time.sleep(2.5)  # a learner checkpoint after the last batch
    logs = {p.name: p.read_text()[-2000:] for p in out.glob("*.log")}
    assert actor.returncode == 0, (actor.stdout[-3000:], actor.stderr[-3000:], logs)
    stats = json.loads((out / "actor" / "stats.json").read_text())
    assert stats["episodes"] == 3 and stats["robot_faults"] == 0
    assert stats["steps"] == 90  # 30 steps each: no episode cut short
    assert stats["latency_ms"]["p50"] > 0  # chunks came from the server, measured on the robot
    # the default learner gates by value: its critic came with the weights and chose actions on the robot
    assert 0 < stats["gated_steps"] < 90 and stats["overruled_steps"] > 0
    picks = stats["gate_picks"]
    assert sum(picks.values()) == stats["gated_steps"] and picks["base"] + picks["perturbed"] == stats["overruled_steps"]
    # the learner got every step exactly once, from this actor
    service = json.loads((out / "learner" / "checkpoint" / "service.json").read_text())
    assert service["received_rows"] == 90 and len(service["episodes"]) == 3
    # stopped by a signal, as an operator stops a real arm's learner: its summary says what it got
    summary = json.loads((out / "learner" / "summary.json").read_text())
    assert summary["robot"] == "franka" and summary["finished"] is False
    assert summary["received_rows"] == 90 and len(summary["episodes"]) == 3
    assert summary["actors"] == ["actor0"] and summary["lost_rows"] == {}
    assert "finetuned_success" not in summary  # nothing evaluated in sim for a real arm
    # and the recording holds the three episodes as the robot saw them
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    ds = LeRobotDataset("arli/local", root=out / "rec")
    assert ds.meta.total_episodes == 3 and len(ds) == 90
    t = ds.hf_dataset.with_format("numpy")
    state = np.asarray(t["observation.state"])
    assert state.shape == (90, 9)
    assert np.all(state[:, 0] > 0.2) and np.all(state[:, 2] > 0.04)  # the arm stayed in its box
    assert set(np.asarray(t["chunk_slot"]).reshape(-1)) - {-1}  # base chunks were executed
