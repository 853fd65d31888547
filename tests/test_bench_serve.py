"""``arli bench serve`` end to end: real ``arli serve`` processes, closed-loop robots on
loopback, the report's rows and what the servers said about batching."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from process_utils import ROOT

pytestmark = pytest.mark.timeout(300)


def test_bench_serve_reports_sequential_and_batched_rows_measured_on_real_servers(tmp_path):
    """Each (robots, mode) row is measured: the sequential server (max_batch=1) answers every
    request alone; the batched one, with two robots whose requests are always due, answers
    some of them in one forward pass (the batch size comes from the server's own replies);
    the device is the one the server said it runs on; the report's files are written."""
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "serve", "policies=[flow]", "robots=[1,2]",
                           "requests=12", "warmup=2", "image_size=32", "max_batch=4", "device=cpu",
                           f"report_dir={tmp_path}", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    speedup = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(speedup) == {"flow@1", "flow@2"} and all(v > 0 for v in speedup.values())
    report = json.loads((tmp_path / "serve.json").read_text())
    rows = {(r["mode"], r["robots"]): r for r in report["rows"]}
    assert set(rows) == {("sequential", 1), ("sequential", 2), ("batched", 1), ("batched", 2)}
    for (mode, robots), row in rows.items():
        assert row["server_policy"] == "FlowPolicy" and row["device"] == "cpu"
        assert row["max_batch"] == (1 if mode == "sequential" else 4)  # as the server's hello said
        assert row["chunks_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    assert rows[("sequential", 2)]["mean_batch"] == 1.0 and rows[("batched", 1)]["mean_batch"] == 1.0
    assert rows[("batched", 2)]["mean_batch"] > 1.0  # two robots' requests shared forward passes
    assert speedup["flow@2"] == pytest.approx(rows[("batched", 2)]["chunks_per_s"]
                                              / rows[("sequential", 2)]["chunks_per_s"])
    assert (tmp_path / "serve.png").stat().st_size > 0
    assert "| flow (FlowPolicy) | cpu | 2 | batched |" in (tmp_path / "serve.md").read_text()
