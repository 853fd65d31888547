"""``arli bench transport``'s ratio intervals: a paired block bootstrap over the rounds the
rows took turns in, the config refusing blocks of unequal size, and the command end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from arli.bench.transport import ratio_ci
from process_utils import ROOT


def test_a_ratio_that_holds_in_every_round_has_a_point_interval():
    den = np.random.default_rng(0).gamma(2.0, 0.1, 20 * 50)
    lo, hi = ratio_ci(2 * den, den, 99, rounds=20)
    assert abs(lo - 2) < 1e-9 and abs(hi - 2) < 1e-9  # same rounds drawn for both rows


def test_one_slow_round_of_one_row_widens_the_p99_interval_but_not_the_p50_one():
    rng = np.random.default_rng(1)
    den = rng.gamma(2.0, 0.1, 20 * 50)
    num = den.copy()
    num[:5] += 5.0  # a slow spell: 5 requests of round 0 only, in the numerator's row
    lo99, hi99 = ratio_ci(num, den, 99, rounds=20)
    lo50, hi50 = ratio_ci(num, den, 50, rounds=20)
    assert lo99 < 1.5 < hi99  # resamples without round 0 see no spell, with it twice see a big one
    assert hi50 - lo50 < 0.1 and lo50 <= 1.0 <= hi50 + 1e-9


def test_rounds_that_do_not_divide_the_requests_are_refused_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "transport", "requests=100", "rounds=7",
                          f"report_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "rounds: expected between 1 and requests, dividing requests" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "transport.json").exists()


def test_the_breakdown_takes_the_stub_compute_off_the_wait_and_compares_part_by_part():
    from arli.bench.transport import breakdown_us

    n = 101
    floor = np.column_stack([np.full(n, 10e-6), np.full(n, 5e-3 + 100e-6), np.full(n, 5e-6), np.zeros(n)])
    skewed = np.full(n, 20e-6)
    skewed[-10:] = 2e-3  # a few slow sends: the mean moves to ~218 µs, the median stays at 20
    ours = np.column_stack([skewed, np.full(n, 5e-3 + 160e-6), np.full(n, 9e-6), np.full(n, 12e-6)])
    b = breakdown_us(floor, ours, compute_ms=5.0)
    assert abs(b["floor"]["wait"] - 100) < 1e-6 and abs(b["ours"]["wait"] - 160) < 1e-6
    assert abs(b["ours"]["send"] - 20) < 1e-6  # the median, not the mean of a skewed part
    assert abs(b["ours_minus_floor"]["receive"] - 4) < 1e-6 and abs(b["ours"]["server_pre"] - 12) < 1e-6
    assert "server_pre" not in b["floor"] and "server_pre" not in b["ours_minus_floor"]


def test_each_round_trip_is_split_in_order_over_real_sockets(tmp_path):
    """Against the real stub server (a ZeroMQ ROUTER in its own process, 3 ms of compute):
    send, wait and receive add up to the round trip, the wait holds the compute, and the
    server's decode comes back from the reply's timing, inside the wait."""
    from arli.bench.transport import Ours, _free_port, _start

    port = _free_port()
    proc = _start("ours", port, 3.0, cwd=str(tmp_path))
    client = Ours(port, cameras=2)
    try:
        client.once(0)  # the first send waits for the connection (IMMEDIATE): not a part of any round trip
        client.parts.clear()
        took = [client.once(i) for i in range(1, 21)]
    finally:
        client.close()
        proc.kill()
        proc.wait()
    parts = np.asarray(client.parts)
    assert parts.shape == (20, 4)
    np.testing.assert_allclose(parts[:, :3].sum(axis=1), took, rtol=0, atol=1e-6)
    # the compute lies between the send's start and the reply's arrival, always; a client
    # descheduled right after its send returns can see part of it land in the send
    assert (parts[:, 0] + parts[:, 1] >= 3e-3).all()
    assert np.median(parts[:, 1]) >= 3e-3  # the wait, not the send or the receive, holds the compute
    # medians: one send or receive can meet a slow spell of a loaded VM
    assert np.median(parts[:, 0]) < 1e-3 and np.median(parts[:, 2]) < 1e-3
    assert ((parts[:, 3] > 0) & (parts[:, 3] < parts[:, 0] + parts[:, 1])).all()


@pytest.mark.slow
def test_bench_transport_json_reports_the_floor_ours_lerobot_and_three_cameras(tmp_path):
    """The command end to end at a small size: the floor, ours and LeRobot's gRPC path measured
    on real sockets in one run, the ratios computed from the percentiles it reports, the
    targets judged from those ratios, the three-camera row beside them; LeRobot's pickled
    gRPC round trip is slower than ours (the margin itself is the benchmark's, not a test's)."""
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "transport", "requests=60", "rounds=3",
                           "warmup=5", "compute_ms=1", f"report_dir={tmp_path}", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for row in ("floor", "ours", "lerobot"):
        assert 0 < out[f"{row}_p50_ms"] <= out[f"{row}_p99_ms"]
    assert out["ours_over_floor_p50"] == pytest.approx(out["ours_p50_ms"] / out["floor_p50_ms"])
    assert out["ours_over_floor_p99"] == pytest.approx(out["ours_p99_ms"] / out["floor_p99_ms"])
    assert out["ratio_p50"] == pytest.approx(out["lerobot_p50_ms"] / out["ours_p50_ms"]) and out["ratio_p50"] > 1
    assert out["targets_met"] == {"ours_p50 / floor_p50 <= 1.5": out["ours_over_floor_p50"] <= 1.5,
                                  "ours_p99 / floor_p99 <= 1.5": out["ours_over_floor_p99"] <= 1.5,
                                  "lerobot_p50 / ours_p50 >= 20": out["ratio_p50"] >= 20}
    three = out["three_cameras"]
    assert three["ours_over_floor_p50"] == pytest.approx(three["ours_p50_ms"] / three["floor_p50_ms"])
    report = json.loads((tmp_path / "transport.json").read_text())
    assert report["floor_p50_ms"] == out["floor_p50_ms"] and report["requests"] == 60
    assert set(report["ci95"]) == {"ours_over_floor_p50", "ours_over_floor_p99", "ratio_p50"}
    assert (tmp_path / "transport.md").exists() and (tmp_path / "transport.png").exists()
