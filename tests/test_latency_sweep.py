"""``arli bench latency-sweep`` with a tiny budget: structure, caching, report."""

import json
import os
import subprocess
import sys

import pytest

ARGS = ["env=pick_cube", "checkpoint=expert", "budget=150", "seeds=[0,1]", "delay_steps=[4]",
        "variants=[base_naive,arli,standard_d0,bc_control,anchor_only]", "eval_episodes=2", "workers=1",
        "run.anchor_episodes=1", "run.learn_after=50", "run.learner.hidden=32", "run.learner.critic_hidden=32",
        "run.learner.batch_size=32", "run.learner.critic_warmup_updates=10", "run.learner.pretrain_updates=10"]


def _sweep(tmp_path, *extra, cache="cells.jsonl"):
    proc = subprocess.run(
        [sys.executable, "-m", "arli.cli", "bench", "latency-sweep", *ARGS,
         f"cache={tmp_path / cache}", f"report_dir={tmp_path / 'reports'}", *extra],
        capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_latency_sweep_cells_cache_and_report(tmp_path):
    out = _sweep(tmp_path)
    assert out["env"] == "pick_cube" and out["budget"] == 150 and out["regime"] == "rl"
    keys = {(c["variant"], c["delay_steps"]) for c in out["cells"]}
    assert keys == {("base_naive", 4), ("arli", 4), ("standard_d0", 0), ("bc_control", 4), ("anchor_only", 4)}
    for c in out["cells"]:
        assert c["seeds"] == 2 and 0 <= c["success_mean"] <= 1 and c["success_std"] >= 0
        assert set(c) >= {"variant", "delay_steps", "success_mean", "success_std", "seeds", "steps_to_80"}
    rows = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(r["budget"] == 150 for r in rows)
    # anchor_only never trains online: its curve is empty; bc_control and arli train
    curves = {(r["variant"], r["seed"]): r.get("curve") for r in rows}
    assert curves[("anchor_only", 0)] == [] and len(curves[("arli", 0)]) >= 1
    assert json.loads((tmp_path / "reports" / "latency_sweep.json").read_text())["cells"] == out["cells"]
    md = (tmp_path / "reports" / "latency_sweep.md").read_text()
    assert "budget=150" in md and "Expected results" in md
    verdicts = {v["claim"]: v for v in out["verdicts"]}
    assert verdicts["arli@4 > anchor_only@4"]["holds"] is not None  # both cells exist: computed
    assert verdicts["standard@4 <= arli@4 - 0.20"]["holds"] is None  # standard@4 not run
    by = {(c["variant"], c["delay_steps"]): c["success_mean"] for c in out["cells"]}
    assert verdicts["arli@4 > anchor_only@4"]["holds"] == (by[("arli", 4)] > by[("anchor_only", 4)])
    assert (tmp_path / "reports" / "latency_sweep.png").stat().st_size > 1000
    # a second run finds every cell in the cache and runs nothing new
    again = _sweep(tmp_path)
    assert again["cells"] == out["cells"]
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 10
    # each row lists the source files its cell ran: the residual cells ran the learner, the
    # base-policy cells did not need it; a row whose learner file changed is stale
    by_variant = {r["variant"]: r for r in rows}
    assert "arli/rl/learner.py" in by_variant["arli"]["sources"]
    assert "arli/finetune.py" in by_variant["arli"]["sources"]
    assert not any(f.startswith(("arli/bench/", "arli/commands/", "arli/config.py", ".venv"))
                   for f in by_variant["arli"]["sources"])
    # the command schemas reach a cell only through the fingerprinted settings: a row that
    # recorded arli/config.py (older sweeps did) stays valid after the schema file changes
    schema_edit = [{**r, "sources": {**r["sources"], "arli/config.py": "0" * 16}} for r in rows]
    (tmp_path / "schema.jsonl").write_text("".join(json.dumps(r) + "\n" for r in schema_edit))
    kept = _sweep(tmp_path, "report_only=true", cache="schema.jsonl")
    assert kept["cells"] == out["cells"]
    edited = [{**r, "sources": {**r["sources"], "arli/rl/learner.py": "0" * 16}}
              if r["variant"] == "arli" else r for r in rows]
    (tmp_path / "stale.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edited))
    stale = _sweep(tmp_path, "report_only=true", cache="stale.jsonl")
    assert ("arli", 4) not in {(c["variant"], c["delay_steps"]) for c in stale["cells"]}
    assert ("bc_control", 4) in {(c["variant"], c["delay_steps"]) for c in stale["cells"]}
    # a changed learner recipe invalidates the residual cells, not the base-policy ones
    changed = _sweep(tmp_path, "run.learner.anchor_weight=7.0", "report_only=true")
    assert {(c["variant"], c["delay_steps"]) for c in changed["cells"]} == {("base_naive", 4)}


def test_ideal_reference_reuses_standard_at_zero_delay():
    from arli.bench.latency_sweep import IDEAL, aggregate, plan
    from arli.cli import compose

    cfg = compose("bench_latency_sweep", ["seeds=[0,1]", "delay_steps=[0,4]",
                                          "variants=[standard,standard_d0]"])
    cells = plan(cfg)
    assert all(v != IDEAL for v, _, _ in cells) and len(cells) == 4  # not run twice
    rows = [{"variant": "standard", "delay_steps": d, "seed": s, "success": 0.1 * (s + 1) + d,
             "steps_to_80": None} for _, d, s in cells]
    agg = {(c["variant"], c["delay_steps"]): c for c in aggregate(rows, cfg)}
    assert agg[(IDEAL, 0)]["success_mean"] == agg[("standard", 0)]["success_mean"] == 0.15
    assert agg[(IDEAL, 0)]["seeds"] == 2


def test_report_command_names_every_non_default_setting_it_needs_to_reproduce():
    """The command a report prints must rerun the same cells: a non-default base checkpoint
    (the seeded-base sweep once printed a command that ran on another base) and learner
    overrides appear; defaults do not."""
    from arli.bench.latency_sweep import non_default_settings
    from arli.cli import compose

    plain = compose("bench_latency_sweep", ["env=peg_insert"])
    assert non_default_settings(plain) == []
    cfg = compose("bench_latency_sweep", ["env=peg_insert", "checkpoint=checkpoints/base_peg_insert_seeded",
                                          "run.learner.start_weight=1.0", "variants=[arli,anchor_only]"])
    assert non_default_settings(cfg) == ["checkpoint=checkpoints/base_peg_insert_seeded",
                                         "run.learner.start_weight=1.0", "'variants=[arli,anchor_only]'"]
