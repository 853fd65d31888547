"""``arli bench learner``: the same update math in both learners, and the report's shape."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from arli.bench.learner import ReferenceLearner, filled_buffers
from arli.rl.config import LearnerConfig
from arli.rl.learner import ResidualLearner


def test_reference_and_ours_compute_the_same_critic_loss():
    """Same weights, same batch, same target heads: the CleanRL-style reference and the
    batched ensemble give the same TD loss, so the speed comparison is like for like."""
    cfg = LearnerConfig(critic_heads=3, critic_subset=3, critic_hidden=16, hidden=16, batch_size=32,
                        target_noise=0.0, critic_warmup_updates=10**6)
    D, m = 12, 3
    online, anchor = filled_buffers(D, m, 64, 0)
    ours, ref = ResidualLearner(cfg, D, m), ReferenceLearner(cfg, D, m)
    with torch.no_grad():  # copy our heads into the reference's per-head Sequentials
        for e, (c, ct) in enumerate(zip(ref.critics, ref.critics_target)):
            for net, src in ((c, ours.critic), (ct, ours.critic_target)):
                net[0].weight.copy_(src.w1[:, e].T)
                net[0].bias.copy_(src.b1[e])
                net[3].weight.copy_(src.l2.weight[e].T)
                net[3].bias.copy_(src.l2.bias[e, 0])
                net[6].weight.copy_(src.w3[e])
                net[6].bias.copy_(src.b3[e])
        ref.actor.load_state_dict(ours.actor.state_dict())
    b = {k: v.clone() for k, v in online.sample(32, torch.Generator().manual_seed(0)).items()}
    s, a = b["state"], b["action"]
    torch.testing.assert_close(ref.q_all(ref.critics, s, a), ours.critic(s, a), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_bench_learner_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "learner", "--json", "seconds=0.2",
                           "shapes=[[32,2,16],[64,10,32]]", f"report_dir={tmp_path}"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"device", "updates_per_s", "reference_updates_per_s", "ratio"} and out["device"] == "cpu"
    assert out["updates_per_s"] > 0 and out["reference_updates_per_s"] > 0
    # the ratio of the unrounded rates, rounded to 2 decimals; the rates shown are rounded to 1
    ours, ref = out["updates_per_s"], out["reference_updates_per_s"]
    assert abs(out["ratio"] - ours / ref) <= 0.005 + ours / ref * (0.05 / ours + 0.05 / ref) + 1e-9
    report = json.loads((tmp_path / "learner.json").read_text())
    assert report["dispatch_floor_ms"] > 0 and report["gflop_per_update"] > 0
    md = (tmp_path / "learner.md").read_text()
    assert "What bounds it" in md
    # the sweep ran the first row's learner (no candidates scored), and its heading says so
    assert "The learner of the first row (TD3 backup, acting with pi: no candidates scored) with other sizes" in md
    # the size sweep: one row per requested shape, the bigger one doing more work per update
    rows = report["sweep"]
    assert [(r["batch_size"], r["critic_heads"], r["critic_hidden"]) for r in rows] == [(32, 2, 16), (64, 10, 32)]
    assert rows[1]["gflop_per_update"] > rows[0]["gflop_per_update"] > 0 and all(r["updates_per_s"] > 0 for r in rows)
    assert not (tmp_path / "learner_cuda.json").exists()


@pytest.mark.parametrize("shapes, expected", [("[[256,4]]", "batch, critic heads, critic hidden"),
                                              ("[[256,1,128]]", "critic heads >= 2"),
                                              ("[[0,4,128]]", "integer >= 1")])
def test_bench_learner_refuses_a_bad_shape_naming_the_field(shapes, expected):
    from arli.cli import compose
    from arli.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"shapes.*{expected}"):
        compose("bench_learner", [f"shapes={shapes}"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_bench_learner_on_cuda_writes_its_own_report(tmp_path):
    """Where a GPU exists: the bench runs both learners there and writes learner_cuda.*, never
    overwriting the CPU report."""
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "learner", "--json", "seconds=0.2",
                           "device=cuda", "shapes=[[1024,10,256]]", f"report_dir={tmp_path}"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "learner_cuda.json").read_text())
    assert report["device"] == "cuda" and report["updates_per_s"] > 0 and report["sweep"][0]["updates_per_s"] > 0
    assert not (tmp_path / "learner.json").exists()


def _cuda_payload() -> dict:
    return {"device": "cuda", "device_name": "NVIDIA H200", "updates_per_s": 215.9, "reference_updates_per_s": 125.1,
            "ratio": 1.73, "gflop_per_update": 0.316, "achieved_gflop_s": 68.3, "matmul_peak_gflop_s": 51041.4,
            "dispatch_floor_ms": 4.14, "update_ms": 4.63, "state_dim": 127, "batch_size": 256, "critic_heads": 4,
            "critic_hidden": 128, "actor_hidden": 128, "threads": 2,
            "sweep": [{"batch_size": 1024, "critic_heads": 10, "critic_hidden": 256, "updates_per_s": 178.5,
                       "update_ms": 5.6, "gflop_per_update": 3.1, "achieved_gflop_s": 553.0}]}


def test_report_only_rewrites_the_markdown_from_the_committed_json(tmp_path):
    """A GPU report can be re-rendered on a machine without one: the Markdown is a function of
    the JSON alone, the JSON is left as it was, and nothing is measured."""
    from arli.bench.learner import main
    from arli.cli import compose

    (tmp_path / "learner_cuda.json").write_text(json.dumps(_cuda_payload(), indent=1))
    before = (tmp_path / "learner_cuda.json").read_text()
    assert main(compose("bench_learner", ["report_only=true", "device=cuda", f"report_dir={tmp_path}"])) == 0
    md = (tmp_path / "learner_cuda.md").read_text()
    assert md.startswith("# Learner update speed on NVIDIA H200")
    assert "| ours (default `LearnerConfig`) | 215.9 |" in md and "| 1024 | 10 x 256 | 178.5 |" in md
    assert "per-update host work" in md and "Target >= 150" not in md  # the CPU target is not a GPU's
    assert (tmp_path / "learner_cuda.json").read_text() == before  # byte for byte
    assert not (tmp_path / "learner.md").exists()  # the CPU report is never touched by a GPU one


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_report_only_reads_reports_written_before_the_newer_keys(tmp_path, device):
    """A report from before ``device``, ``device_name``, ``sweep`` and ``command`` were recorded
    (as the committed CPU one): the file the device names is rewritten, under its own title,
    without a sweep table, and no other report appears."""
    from arli.bench.learner import main, report_name
    from arli.cli import compose

    old = {k: v for k, v in _cuda_payload().items() if k not in ("device", "device_name", "sweep")}
    name = report_name(device)
    (tmp_path / f"{name}.json").write_text(json.dumps(old))
    assert main(compose("bench_learner", ["report_only=true", f"device={device}", f"report_dir={tmp_path}"])) == 0
    md = (tmp_path / f"{name}.md").read_text()
    assert md.startswith("# Learner update speed\n" if device == "cpu" else "# Learner update speed on cuda\n")
    assert ("Target >= 150" in md) == (device == "cpu") and "Bigger critics" not in md and "the sweep" not in md
    assert "| ratio | 1.73x |" in md  # the recorded ratio, not one re-derived from rounded rates
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.json", f"{name}.md"]


def test_report_only_without_a_report_or_with_device_auto_is_refused(tmp_path):
    from arli.bench.learner import main
    from arli.cli import compose
    from arli.errors import ConfigError

    with pytest.raises(ConfigError, match=r"report_only: no report at .*learner_cuda.json.*device=cuda"):
        main(compose("bench_learner", ["report_only=true", "device=cuda", f"report_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"device.*cpu or cuda\[:i\] with report_only=true"):
        compose("bench_learner", ["report_only=true", "device=auto"])
    with pytest.raises(ConfigError, match=r"report_dir.*the folder holding the report"):
        compose("bench_learner", ["report_only=true", "report_dir="])
