"""``arli bench ceiling``: the projected-expert residual obeys the learner's bound, and the
report's cells, intervals and clipped-anchor shares are consistent."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from arli.bench.ceiling import ProjectedExpert
from arli.chunking import ChunkScheduler
from arli.types import Observation
from process_utils import ROOT


def _info(base):
    sched = ChunkScheduler(4, 2, 5, "async", "naive", 0)
    req = sched.make_request(Observation(np.zeros(3), 0), 0, 0)
    sched.deliver(req.request_id, np.tile(np.asarray(base, np.float32), (4, 1)), 0)
    return sched.step(0)


def test_the_projected_expert_moves_at_most_the_bound_toward_the_expert():
    expert = lambda s: np.array([0.9, -0.9, 0.05, 0.0, 1.0], np.float32)  # noqa: E731
    info = _info([0.0, 0.0, 0.0, 0.0, -1.0])
    obs = Observation(np.zeros(3, np.float32), 0)
    bounded = ProjectedExpert(expert, 0.3, grip_authority=False).act(0, obs, info)
    np.testing.assert_allclose(bounded, [0.3, -0.3, 0.05, 0.0, -0.7], atol=1e-6)  # clipped, or the expert's
    gripped = ProjectedExpert(expert, 0.3, grip_authority=True).act(0, obs, info)
    np.testing.assert_allclose(gripped, [0.3, -0.3, 0.05, 0.0, 1.0], atol=1e-6)  # the grip is decided
    wide = ProjectedExpert(expert, 2.0, grip_authority=False).act(0, obs, info)
    np.testing.assert_allclose(wide, expert(None), atol=1e-6)  # a bound that covers the range: the expert


def test_exploration_on_the_projected_expert_walks_the_hand_only_when_white():
    """noise_std cells: the learner's exploration on the projected expert's r. Summed over an
    episode (the controller integrates the deltas), differenced noise stays at
    scale * std / sqrt(2) while white noise grows as scale * std * sqrt(T)."""
    expert = lambda s: np.zeros(5, np.float32)  # noqa: E731 - the base's own action: r = 0
    info = _info([0.0] * 5)
    obs = Observation(np.zeros(3, np.float32), 0)
    drift = {}
    for process in ("white", "differenced"):
        ctl = ProjectedExpert(expert, 0.3, grip_authority=False, noise=(process, 0.2), seed=1)
        sums = []
        for _ in range(200):
            ctl.begin_episode()
            sums.append(np.sum([ctl.act(t, obs, info) for t in range(100)], axis=0))
        drift[process] = float(np.std(sums))
    assert abs(drift["differenced"] - 0.3 * 0.2 / np.sqrt(2)) < 0.01, drift
    assert abs(drift["white"] - 0.3 * 0.2 * 10) < 0.1, drift


@pytest.mark.slow
def test_bench_ceiling_report(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "ceiling", "env=pick_cube", "checkpoint=expert",
                           "delay_steps=[0,4]", "scales=[0.1,0.3,1.0]", "run.test_episodes=4", "anchor_episodes=2",
                           "noise_std=[0.3]",
                           f"report_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ceiling_pick_cube.json").read_text())
    assert report["eval"] == {"split": "test", "seed_base": 5_000_000, "episodes": 4}
    assert len(report["cells"]) == 2 * (1 + 3 * 2)  # per delay: the base alone, 3 bounds x grip or not
    for c in report["cells"]:
        assert len(c["outcomes"]) == 4 and c["success"] == sum(c["outcomes"]) / 4
        assert c["ci95"][0] <= c["success"] <= c["ci95"][1]
    assert [c["delay_steps"] for c in report["ceiling"]] == [0, 4]  # the default bound, no grip authority
    for d in (0, 4):  # the same anchor rows judged against a wider bound: never more of them clipped
        shares = [c["share_any"] for c in report["anchor_clipping"] if c["delay_steps"] == d]
        assert len(shares) == 3 and shares == sorted(shares, reverse=True) and 0 <= shares[-1] <= shares[0] <= 1
    # exploration cells: the default bound, each process at each delay, apart from the ceiling's
    assert sorted((c["delay_steps"], c["noise"]["process"], c["noise"]["std"], c["scale"])
                  for c in report["exploration"]) == [(d, p, 0.3, 0.3) for d in (0, 4) for p in ("differenced", "white")]
    assert all(len(c["outcomes"]) == 4 for c in report["exploration"])
    md = (tmp_path / "ceiling_pick_cube.md").read_text()
    assert "| 4 | 0.3 | differenced |" in md and "'noise_std=[0.3]' anchor_episodes=2" in md
    assert (tmp_path / "ceiling_pick_cube.png").exists() and (tmp_path / "ceiling_pick_cube.md").exists()


def test_a_task_without_an_expert_gets_one_line_naming_the_tasks_that_have_one(monkeypatch, tmp_path, capsys):
    """Every task here has a scripted expert, so the refusal is reached by hiding one: it comes
    before any base is trained or any file written."""
    import sim_envs.experts
    from arli.cli import main

    without = {k: v for k, v in sim_envs.experts.EXPERTS.items() if k != "pick_cube"}
    monkeypatch.setattr(sim_envs.experts, "EXPERTS", without)
    assert main(["bench", "ceiling", "env=pick_cube", f"report_dir={tmp_path}",
                 f"checkpoint={tmp_path / 'base'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.name: pick_cube has no scripted expert" in err[0]
    assert all(name in err[0] for name in without) and list(tmp_path.iterdir()) == []
