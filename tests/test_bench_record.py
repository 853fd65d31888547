"""``arli bench record``: the real entry point with a tiny budget writes its three report
files, times both commit paths episode by episode, and refuses bad sizes in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from process_utils import ROOT


@pytest.mark.slow
def test_bench_record_reports_save_time_per_episode_for_both_paths(tmp_path):
    out = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "record", "episodes=4", "reopen_episodes=3",
                          "frames=8", "image_size=32", f"report_dir={tmp_path}", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(summary) == {"open", "reopen"}
    report = json.loads((tmp_path / "record.json").read_text())
    assert report["cameras"] == ["front", "wrist"] and report["image_size"] == 32
    for kind, n in (("open", 4), ("reopen", 3)):
        seconds = report["paths"][kind]["seconds"]
        assert len(seconds) == n and all(s > 0 for s in seconds)
        assert report["paths"][kind]["episodes"] == n
        assert report["paths"][kind]["at_episodes_s"] == {}  # no mark (10, 100, 500) reached
    assert "| one open dataset (now) | 4 | not run | not run | not run |" in (tmp_path / "record.md").read_text()
    assert (tmp_path / "record.png").stat().st_size > 1000


def test_save_time_at_a_mark_is_the_median_of_the_saves_that_reached_it():
    from arli.bench.record import at_marks

    seconds = [1.0] * 9 + [9.0] + [2.0] * 90  # seconds[i] saved episode i + 1; one slow save at 10
    at = at_marks(seconds, (10, 100, 500))
    assert at == {"10": 1.0, "100": 2.0}  # the median ignores the one slow save; 500 not reached


def test_bench_record_refuses_a_frame_size_the_encoder_cannot_take(tmp_path):
    out = subprocess.run([sys.executable, "-m", "arli.cli", "bench", "record", "image_size=24",
                          f"report_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "image_size: expected an even size >= 32" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "record.json").exists()
