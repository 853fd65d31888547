import json

import numpy as np
import pytest

from arli.latency import (FixedLatency, LogNormalLatency, TraceLatency, UniformLatency,
                          to_delay_steps)


def test_delay_steps_rounding():
    assert to_delay_steps(0.2, 0.05) == 4
    assert to_delay_steps(0.201, 0.05) == 5
    assert to_delay_steps(0.0, 0.05) == 0
    with pytest.raises(ValueError):
        to_delay_steps(-0.1, 0.05)


def test_fixed():
    rng = np.random.default_rng(0)
    assert {FixedLatency(0.15).sample(rng) for _ in range(10)} == {0.15}
    with pytest.raises(ValueError, match="seconds"):
        FixedLatency(-1.0)


def test_uniform_statistics():
    rng = np.random.default_rng(0)
    x = np.array([UniformLatency(0.1, 0.3).sample(rng) for _ in range(20000)])
    assert x.min() >= 0.1 and x.max() <= 0.3
    assert x.mean() == pytest.approx(0.2, abs=0.003)
    assert x.std() == pytest.approx(0.2 / np.sqrt(12), rel=0.03)
    with pytest.raises(ValueError, match="low <= high"):
        UniformLatency(0.3, 0.1)


def test_lognormal_statistics_and_truncation():
    rng = np.random.default_rng(0)
    model = LogNormalLatency(0.15, 0.3, jitter_s=0.0, max_s=10.0)
    x = np.array([model.sample(rng) for _ in range(20000)])
    assert np.median(x) == pytest.approx(0.15, rel=0.02)
    assert np.log(x).std() == pytest.approx(0.3, rel=0.03)
    capped = LogNormalLatency(0.15, 1.0, jitter_s=0.02, max_s=0.3)
    y = np.array([capped.sample(rng) for _ in range(5000)])
    assert y.max() <= 0.3 and (y == 0.3).mean() > 0.1
    with pytest.raises(ValueError):
        LogNormalLatency(0.15, 0.3, max_s=0.1)


def test_trace_replays_in_order_and_loops(tmp_path):
    lines = tmp_path / "trace.txt"
    lines.write_text("# header\n0.1\n0.25\n\n0.05\n")
    js = tmp_path / "trace.json"
    js.write_text(json.dumps([0.1, 0.25, 0.05]))
    rng = np.random.default_rng(0)
    for path in (lines, js):
        model = TraceLatency.from_file(str(path))
        assert [model.sample(rng) for _ in range(5)] == [0.1, 0.25, 0.05, 0.1, 0.25]
        assert model.max_latency() == 0.25


def test_trace_bad_input(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1\nfast\n")
    with pytest.raises(ValueError, match="expected numbers"):
        TraceLatency.from_file(str(bad))
    with pytest.raises(FileNotFoundError):
        TraceLatency.from_file(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="invalid"):
        TraceLatency((0.1, -0.2))


def test_measured_latency_plans_from_the_recent_quantile(tmp_path):
    from arli.latency import MeasuredLatency

    measured = MeasuredLatency(0.05, initial_delay_steps=4, quantile=0.9, window=10)
    assert measured.next_delay() == 4  # nothing measured yet
    for latency in [0.5] * 10 + [0.06] * 10:  # the slow start leaves the 10-reply window
        measured.add(latency, {"latency_s": latency})
    assert measured.next_delay() == 2 and len(measured.latencies) == len(measured.records) == 20
    for _ in range(3):
        measured.add(0.31)
    assert measured.next_delay() == 7  # the 0.9 quantile of seven 0.06 s and three 0.31 s is 0.31 s
    capped = MeasuredLatency(0.05, initial_delay_steps=3, cap_steps=3)
    capped.add(1.0)
    assert capped.next_delay() == 3
    path = tmp_path / "trace.json"
    measured.save_trace(str(path))
    assert TraceLatency.from_file(str(path)).values_s == tuple(measured.latencies)
