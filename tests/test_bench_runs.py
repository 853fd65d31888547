"""``arli bench runs``: several training seeds pooled on their shared test episodes."""

import json

import pytest

from arli.cli import compose
from arli.bench.runs import main
from arli.config import ConfigError


def _run(path, seed_base, final, start, base, variant="arli"):
    path.mkdir()
    split = {"split": "test", "seed_base": seed_base, "episodes": len(final)}
    (path / "eval_test.json").write_text(json.dumps({"split": split, "outcomes": {"base": base, "start": start,
                                                                                  "final": final}}))
    (path / "summary.json").write_text(json.dumps({"env": "peg_insert", "variant": variant, "regime": "rl",
                                                   "delay_steps": 8, "env_steps": 100, "wall_s": 1.0}))
    return str(path)


def test_runs_are_pooled_per_seed_and_paired(tmp_path):
    a = _run(tmp_path / "a", 5, [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0])
    b = _run(tmp_path / "b", 5, [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0])
    cfg = compose("bench_runs", [f"runs=[{a},{b}]", "name=pooled", f"report_dir={tmp_path}"])
    assert main(cfg) == 0
    report = json.loads((tmp_path / "pooled.json").read_text())
    assert report["seeds"] == 2 and report["cells"]["final"]["per_seed"] == [0.75, 0.5]
    assert report["cells"]["final"]["success"] == 0.625 and report["gains"]["final-start"]["mean"] == 0.25
    lo, hi = report["gains"]["final-base"]["ci95"]
    assert 0 < lo <= 0.625 <= hi and report["gains"]["final-base"]["verdict"] == "above"
    other = _run(tmp_path / "c", 99, [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1])
    with pytest.raises(ConfigError, match="share one test split"):
        main(compose("bench_runs", [f"runs=[{a},{other}]", f"report_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="has no eval_test.json"):
        main(compose("bench_runs", [f"runs=[{tmp_path}]", f"report_dir={tmp_path}"]))
