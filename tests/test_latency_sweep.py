"""``arli bench latency-sweep``: the plan, the report's schema, the paired intervals and the
verdicts on hand-built cells (fast); a real sweep with a tiny budget (slow)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from arli.cli import compose

ARGS = ["env=pick_cube", "checkpoint=expert", "budget=150", "seeds=[0,1]", "delay_steps=[4]",
        "variants=[base_naive,arli,standard_d0,bc_control,uniform_control,anchor_only,ceiling]", "eval_episodes=2",
        "workers=1", "run.anchor_episodes=1", "run.learn_after=50", "run.learner.hidden=32",
        "run.learner.critic_hidden=32", "run.learner.batch_size=32", "run.learner.critic_warmup_updates=10",
        "run.learner.pretrain_updates=10", "run.eval_episodes=2", "run.guard_episodes=2"]  # curve and guards on 2 tune episodes: a test
REQUIRED_CELL = {"variant", "delay_steps", "seeds", "success_mean", "ci95", "start_mean", "gain_ci95"}


def _sweep(tmp_path, *extra, cache="cells.jsonl", in_process=False):
    """The command's last-line JSON: as a real process, or (``in_process``: for reruns that
    only read cells back, which a new interpreter would spend most of its time importing for)
    through the same CLI entry point in this one."""
    argv = ["bench", "latency-sweep", *ARGS, f"cache={tmp_path / cache}", f"report_dir={tmp_path / 'reports'}",
            *extra]
    if in_process:
        import contextlib
        import io

        from arli.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
        return json.loads(out.getvalue().strip().splitlines()[-1])
    proc = subprocess.run([sys.executable, "-m", "arli.cli", *argv], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_latency_sweep_cells_cache_and_report(tmp_path):
    out = _sweep(tmp_path)
    assert out["env"] == "pick_cube" and out["budget"] == 150 and out["regime"] == "rl"
    assert out["eval"] == {"split": "test", "seed_base": 5_000_000, "episodes": 2}
    keys = {(c["variant"], c["delay_steps"]) for c in out["cells"]}
    assert keys == {("base_naive", 4), ("arli", 4), ("standard_d0", 0), ("bc_control", 4), ("uniform_control", 4),
                    ("anchor_only", 4)}
    for c in out["cells"]:
        assert set(c) >= REQUIRED_CELL and 0 <= c["success_mean"] <= 1
        assert c["seeds"] == ([] if c["variant"] == "base_naive" else [0, 1])  # the base alone: once
        assert c["ci95"][0] <= c["success_mean"] <= c["ci95"][1]
        assert (c["start_mean"] is None) == (c["variant"] == "base_naive")
    assert [c["delay_steps"] for c in out["ceiling"]] == [4] and 0 <= out["ceiling"][0]["success"] <= 1
    rows = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["budget"] == 150 for r in rows)  # 5 variants x 2 seeds + base + ceiling
    # anchor_only never trains online: its curve is empty and its start is its final; the others train
    by_cell = {(r["variant"], r["seed"]): r for r in rows}
    assert by_cell[("anchor_only", 0)]["curve"] == [] and len(by_cell[("arli", 0)]["curve"]) >= 1
    assert by_cell[("anchor_only", 0)]["start_outcomes"] == by_cell[("anchor_only", 0)]["outcomes"]
    for v in ("arli", "bc_control", "uniform_control", "standard_d0"):
        assert len(by_cell[(v, 0)]["start_outcomes"]) == 2
        for seed in (0, 1):  # the end guard: what RL trained is kept; dropped, the start's outcomes are final
            row = by_cell[(v, seed)]
            guard, trained = row["end_guard"], row["trained_outcomes"]
            assert len(trained) == 2 and guard["reverted"] == (guard["trained"] < guard["start"])
            assert row["outcomes"] == (row["start_outcomes"] if guard["reverted"] else trained)
    assert by_cell[("anchor_only", 0)]["end_guard"] is None
    assert json.loads((tmp_path / "reports" / "latency_sweep.json").read_text())["cells"] == out["cells"]
    md = (tmp_path / "reports" / "latency_sweep.md").read_text()
    assert "budget=150" in md and "Expected results" in md and "ceiling" in md
    verdicts = {v["claim"]: v for v in out["verdicts"]}
    assert verdicts["arli@4 - start@4 >= +0.05, gain CI excludes 0 (the issue's rule; fails: CI below +0.05)"]["holds"] is not None  # computed
    assert verdicts["standard@4 <= arli@4 - 0.20 (paired CI of arli - standard)"]["holds"] is None  # standard@4 not run
    assert (tmp_path / "reports" / "latency_sweep.png").stat().st_size > 1000
    # a second run finds every cell in the cache and runs nothing new
    again = _sweep(tmp_path, in_process=True)
    assert again["cells"] == out["cells"]
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 12
    # the report keeps the rows it was built from: a fresh clone (empty run cache, the same
    # code and base) reruns the command and runs nothing
    committed = tmp_path / "reports" / "latency_sweep" / "cells.jsonl"
    assert len(committed.read_text().splitlines()) == 12
    fresh = _sweep(tmp_path, cache="fresh.jsonl", in_process=True)
    assert fresh["cells"] == out["cells"] and not (tmp_path / "fresh.jsonl").exists()
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
    kept = _sweep(tmp_path, "report_only=true", "name=schema", cache="schema.jsonl", in_process=True)
    assert kept["cells"] == out["cells"]
    edited = [{**r, "sources": {**r["sources"], "arli/rl/learner.py": "0" * 16}}
              if r["variant"] == "arli" else r for r in rows]
    (tmp_path / "stale.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edited))
    stale = _sweep(tmp_path, "report_only=true", "name=stale", cache="stale.jsonl", in_process=True)
    assert ("arli", 4) not in {(c["variant"], c["delay_steps"]) for c in stale["cells"]}
    assert ("bc_control", 4) in {(c["variant"], c["delay_steps"]) for c in stale["cells"]}
    # a changed learner recipe invalidates the residual cells, not the base-policy ones; the
    # ceiling reads only the bound
    changed = _sweep(tmp_path, "run.learner.anchor_weight=7.0", "report_only=true", in_process=True)
    assert {(c["variant"], c["delay_steps"]) for c in changed["cells"]} == {("base_naive", 4)}
    assert len(changed["ceiling"]) == 1
    rescaled = _sweep(tmp_path, "run.learner.residual_scale=0.5", "report_only=true", in_process=True)
    assert rescaled["ceiling"] == []
    # a report rebuilt from the cells of a base this machine does not train: only the cells of
    # the named base are used, and the report names it
    other = _sweep(tmp_path, "report_only=true", "base_digest=0123456789ab", "name=otherbase", in_process=True)
    assert other["cells"] == [] and other["ceiling"] == [] and other["checkpoint_digest"] == "0123456789ab"
    named = _sweep(tmp_path, "report_only=true", f"base_digest={out['checkpoint_digest']}", "name=named",
                   in_process=True)
    assert named["cells"] == out["cells"] and named["rebuilt_from_cells_of_base"] == out["checkpoint_digest"]
    assert "Rebuilt from the committed cells of base" in (tmp_path / "reports" / "named.md").read_text()


# -- hand-built rows -----------------------------------------------------------------------
N = 100  # test episodes per seed


def _hits(k: int, n: int = N) -> list[int]:
    """Episodes 0..k-1 succeed: policies built this way are nested, so their paired
    differences have one sign on every episode."""
    return [1] * k + [0] * (n - k)


def _row(variant, d, seed, k, start=None, n=N):
    from arli.bench.latency_sweep import RL_VARIANTS

    row = {"variant": variant, "delay_steps": d, "seed": seed, "success": k / n, "outcomes": _hits(k, n),
           "steps_to_80": None}
    if variant in RL_VARIANTS:
        row.update(start_success=start / n, start_outcomes=_hits(start, n))
    if variant == "ceiling":
        row.update(seed=None, scale=0.3, grip_authority=False)
    return row


def _cfg(*extra):
    return compose("bench_latency_sweep", ["checkpoint=expert", "seeds=[0,1]", *extra])


def _rows(spec: dict, seeds=(0, 1)) -> list[dict]:
    """{(variant, d): k or (k, start)} -> rows for every seed (the base alone and the ceiling:
    one row, no seed)."""
    from arli.bench.latency_sweep import seedless

    rows = []
    for (variant, d), k in spec.items():
        k, start = k if isinstance(k, tuple) else (k, None)
        rows += [_row(variant, d, None, k)] if seedless(variant) else \
            [_row(variant, d, s, k, start) for s in seeds]
    return rows


def _verdicts(spec: dict, cfg=None) -> dict[str, dict]:
    from arli.bench.claims import verdicts
    from arli.bench.latency_sweep import aggregate, base_variant, ceiling_cells

    cfg = cfg or _cfg()
    rows = _rows(spec)
    checks = verdicts(aggregate(rows, cfg), ceiling_cells(rows), list(cfg.delay_steps),
                      base_variant(cfg.chunking.strategy))
    return {c["claim"]: c for c in checks}


HOLDS = {("base_naive", 0): 80, ("base_naive", 4): 30, ("base_naive", 8): 10,
         ("arli", 0): (100, 85), ("arli", 4): (100, 85), ("arli", 8): (99, 80),
         ("ceiling", 0): 100, ("ceiling", 4): 100, ("ceiling", 8): 99,
         ("bc_control", 4): (85, 85), ("bc_control", 8): (85, 80),
         ("uniform_control", 4): (88, 85), ("uniform_control", 8): (86, 80),
         ("standard", 0): (96, 85), ("standard", 4): (60, 50), ("standard", 8): (30, 20),
         ("arli_no_committed", 8): (80, 80), ("arli_no_midobs", 8): (85, 80)}
FAILS = {("base_naive", 0): 95, ("base_naive", 4): 95, ("base_naive", 8): 95,
         ("arli", 0): (85, 84), ("arli", 4): (85, 84), ("arli", 8): (80, 79),
         ("ceiling", 0): 100, ("ceiling", 4): 100, ("ceiling", 8): 99,
         ("bc_control", 4): (89, 88), ("bc_control", 8): (84, 84),
         ("uniform_control", 4): (92, 88), ("uniform_control", 8): (85, 84),
         ("standard", 0): (98, 85), ("standard", 4): (80, 50), ("standard", 8): (30, 20),
         ("arli_no_committed", 8): (85, 84), ("arli_no_midobs", 8): (90, 84)}
FAMILIES = {"target", "gain_over_start", "controls", "standard", "ideal", "ablations", "not_below_base"}


def test_each_verdict_family_holds_on_good_cells_and_fails_on_bad_ones():
    good, bad = _verdicts(HOLDS), _verdicts(FAILS)
    assert good.keys() == bad.keys() and {c["family"] for c in good.values()} == FAMILIES
    # the default sweep: 3 targets, gain at 3 delays, 2 controls at d = 4 and 8, standard, ideal, 2 ablations,
    # not below the base at 3 delays
    assert len(good) == 3 + 3 + 4 + 1 + 1 + 2 + 3
    assert [c["claim"] for c in good.values() if c["status"] != "holds" or c["holds"] is not True] == []
    assert [c["claim"] for c in bad.values() if c["status"] != "fails" or c["holds"] is not False] == []
    # the numbers behind them
    t8 = good["arli@8 >= 0.90 (ceiling@8 - 0.03 where the ceiling is lower; judged by its CI)"]["values"]
    assert t8["target"] == 0.90 and t8["arli@8"] == 0.99 and t8["ceiling@8"] == 0.99 and t8["ci95"][0] >= 0.90
    c = bad["arli@4 >= uniform_control@4 + 0.05 (paired CI of the difference)"]["values"]
    assert c["difference"] == -0.07 and c["difference_ci95"][1] <= 0
    base = bad["arli@8 not below base_naive@8 (paired CI of arli - base not entirely below 0)"]["values"]
    assert base["difference"] == -0.15 and base["difference_ci95"][1] < 0


def test_a_claim_whose_interval_straddles_its_threshold_is_unresolved():
    """Mean above the margin is not enough: arli - bc_control = +0.06 with an interval reaching
    below +0.05 is unresolved, and so is a target inside the success interval; both clear
    once the interval does."""
    spread = [1] * 3 + [0] * 3 + [1] * 94  # arli wins 6 episodes of 100 per seed and loses 3 ...
    rows = _rows({("arli", 4): (94, 85), ("bc_control", 4): (91, 85), ("base_naive", 4): 30})
    for r in rows:
        if r["variant"] == "bc_control":
            r["outcomes"] = [0] * 3 + [1] * 3 + spread[6:94] + [1] * 3 + [0] * 3  # ... and ties the rest
    from arli.bench.claims import verdicts
    from arli.bench.latency_sweep import aggregate

    cfg = _cfg("delay_steps=[4]")
    got = {c["claim"]: c for c in verdicts(aggregate(rows, cfg), [], [4], "base_naive")}
    control = got["arli@4 >= bc_control@4 + 0.05 (paired CI of the difference)"]
    lo, hi = control["values"]["difference_ci95"]
    assert control["values"]["difference"] >= 0.0 and lo < 0.05 <= hi
    assert control["status"] == "unresolved" and control["holds"] is None
    target = got["arli@4 >= 0.95 (ceiling@4 - 0.03 where the ceiling is lower; judged by its CI)"]
    lo, hi = target["values"]["ci95"]
    assert lo < 0.95 <= hi and target["status"] == "unresolved"
    clear = _verdicts({("arli", 4): (100, 85), ("bc_control", 4): (85, 85)}, cfg)
    assert clear["arli@4 >= bc_control@4 + 0.05 (paired CI of the difference)"]["status"] == "holds"


def _paired(wins: int, losses: int, common: int = 30) -> tuple[list[int], list[int]]:
    """Outcomes of two policies on N episodes: the first wins ``wins`` episodes the second
    fails, loses ``losses``, both solve ``common`` and both fail the rest."""
    rest = N - wins - losses - common
    return ([1] * wins + [0] * losses + [1] * common + [0] * rest,
            [0] * wins + [1] * losses + [1] * common + [0] * rest)


def _rows_with(cells: dict) -> list[dict]:
    """Rows for seeds 0 and 1 with given outcomes: {(variant, d): outcomes or (outcomes, start outcomes)}."""
    rows = _rows({key: (50, 50) for key in cells if key[0] != "base_naive"} |
                 {key: 50 for key in cells if key[0] == "base_naive"})
    for r in rows:
        got = cells[(r["variant"], r["delay_steps"])]
        r["outcomes"], start = got if isinstance(got, tuple) else (got, r.get("start_outcomes"))
        if start is not None:
            r["start_outcomes"] = start
    return rows


def _second_look_cases() -> dict:
    """Per verdict family: cells where the 95% interval decides the claim and the 97.5% one
    (a second look) does not, with the two statuses."""
    a, b = _paired(7, 1)                # +0.06: 95% [+0.01, ..], 97.5% [0.00, ..]
    c12, c0 = _paired(12, 0)            # +0.12: 95% [+0.06, ..], 97.5% [+0.05, ..]
    s30, s0 = _paired(30, 0)            # +0.30: 95% [+0.21, ..], 97.5% [+0.20, ..]
    i2, i1 = _paired(2, 1)              # +0.01: 95% [-0.02, ..], 97.5% [-0.03, ..]
    return {
        "target": ({("arli", 4): ([1] * 96 + [0] * 4, [1] * 50 + [0] * 50)}, [("ceiling", 4, 94)],
                   "holds", "unresolved"),  # the ceiling's 0.94 sets the target 0.91; 95% [0.92, ..], 97.5% [0.91, ..]
        "gain_over_start": ({("arli", 4): (a, b)}, [], "holds", "unresolved"),
        "controls": ({("arli", 4): c12, ("bc_control", 4): c0}, [], "holds", "unresolved"),
        "standard": ({("arli", 4): s30, ("standard", 4): s0}, [], "holds", "unresolved"),
        "ideal": ({("arli", 4): i2, ("standard", 0): i1}, [], "holds", "unresolved"),
        "ablations": ({("arli", 8): a, ("arli_no_committed", 8): b}, [], "holds", "unresolved"),
        "not_below_base": ({("arli", 4): b, ("base_naive", 4): a}, [], "fails", "holds"),
    }


@pytest.mark.parametrize("family", ["target", "gain_over_start", "controls", "standard", "ideal", "ablations",
                                    "not_below_base"])
def test_a_second_look_judges_each_verdict_family_at_97_5(family):
    """Adding training seeds to a reported sweep and judging again is a second look at the same
    claims: looks=2 judges every rule at 97.5% (1 - 0.05 / 2). Each family gets cells whose
    95% interval decides the claim and whose 97.5% interval does not; the verdict must follow
    the wider one and show it beside the 95% one."""
    from arli.bench.claims import verdicts
    from arli.bench.latency_sweep import aggregate, ceiling_cells

    cells, ceiling, first_status, second_status = _second_look_cases()[family]
    rows = _rows_with(cells) + [_row(v, d, None, k) for v, d, k in ceiling]
    cfg = _cfg()
    agg, ceil = aggregate(rows, cfg), ceiling_cells(rows)
    first = [c for c in verdicts(agg, ceil, [0, 4, 8], "base_naive") if c["family"] == family and c["status"] != "not evaluated"]
    second = [c for c in verdicts(agg, ceil, [0, 4, 8], "base_naive", looks=2) if c["family"] == family
              and c["status"] != "not evaluated"]
    assert [c["status"] for c in first] == [first_status] and [c["status"] for c in second] == [second_status]
    assert not any("97.5" in key for key in first[0]["values"])  # a first look shows the 95% intervals only
    keys = list(second[0]["values"])
    (judged,) = [k for k in keys if k.endswith("ci97.5")]
    assert keys.index(judged) == keys.index(judged.replace("ci97.5", "ci95")) + 1  # right after its 95% one
    lo95, hi95 = first[0]["values"][judged.replace("ci97.5", "ci95")]
    lo, hi = second[0]["values"][judged]
    assert lo <= lo95 and hi >= hi95 and (lo, hi) != (lo95, hi95)


def test_a_first_look_is_judged_as_before_and_the_report_names_its_level(tmp_path):
    """looks=1 is the 95% judgement (the verdicts of every committed report); the report of a
    later look says so in its JSON, Markdown and command."""
    from arli.bench.claims import looks_error, verdict_level, verdicts
    from arli.bench.latency_sweep import aggregate, ceiling_cells, command, markdown, report

    rows = _rows(HOLDS)
    cfg = _cfg()
    agg, ceil = aggregate(rows, cfg), ceiling_cells(rows)
    assert verdicts(agg, ceil, [0, 4, 8], "base_naive") == verdicts(agg, ceil, [0, 4, 8], "base_naive", looks=1)
    with pytest.raises(ValueError, match="base: a base-alone variant"):  # a chunking strategy is not a variant
        verdicts(agg, ceil, [0, 4, 8], "naive")
    assert verdict_level(1) == 0.95 and verdict_level(2) == 0.975
    assert looks_error(1) == pytest.approx(0.05) and looks_error(2) == pytest.approx(0.075)
    payload, text = report(rows, _cfg("looks=2"), [])
    assert payload["looks"] == 2 and payload["verdict_level"] == 0.975
    assert "each judged by a 97.5% interval (look 2 at these claims" in text
    assert "about 2.5%, and over the 2 looks at most about 7.5%" in text
    first, first_text = report(rows, cfg, [])
    assert first["verdict_level"] == 0.95 and "each judged by a 95% interval:" in first_text
    assert markdown(first, cfg) == first_text.split("\nNot run yet")[0]
    assert command(_cfg("looks=2")).endswith(" looks=2") and " looks=" not in command(cfg)
    from arli.config import ConfigError

    with pytest.raises(ConfigError, match="looks"):
        _cfg("looks=0")


def test_not_below_the_base_holds_when_the_interval_straddles_zero():
    # arli succeeds on 10 episodes the base fails and fails on 12 it solves: -0.02, CI around 0
    from arli.bench.claims import verdicts
    from arli.bench.latency_sweep import aggregate

    cfg = _cfg("delay_steps=[4]")
    rows = [_row("base_naive", 4, s, 50) for s in (0, 1)]
    rows += [{**_row("arli", 4, s, 48, 40), "outcomes": [0] * 12 + [1] * 38 + [1] * 10 + [0] * 40} for s in (0, 1)]
    (check,) = [c for c in verdicts(aggregate(rows, cfg), [], [4], "base_naive") if c["family"] == "not_below_base"
                and "@4" in c["claim"]]
    lo, hi = check["values"]["difference_ci95"]
    assert lo < 0 < hi and check["holds"] is True


def test_a_missing_cell_leaves_its_rules_not_evaluated():
    partial = {k: v for k, v in HOLDS.items() if k not in {("bc_control", 4), ("arli", 0), ("standard", 4)}}
    got = _verdicts(partial)
    assert got["arli@4 >= bc_control@4 + 0.05 (paired CI of the difference)"]["holds"] is None
    assert got["arli@8 >= bc_control@8 + 0.05 (paired CI of the difference)"]["holds"] is True  # its own cells exist
    assert got["arli@0 >= 0.95 (ceiling@0 - 0.03 where the ceiling is lower; judged by its CI)"]["holds"] is None
    assert got["arli@0 - start@0 >= +0.05, gain CI excludes 0 (the issue's rule; fails: CI below +0.05)"]["holds"] is None
    assert got["standard@4 <= arli@4 - 0.20 (paired CI of arli - standard)"]["holds"] is None
    assert got["arli@4 >= standard@0 - 0.03 (paired CI of arli@4 - standard@0)"]["holds"] is True
    # without a ceiling cell the nominal target stands
    no_ceiling = _verdicts({k: v for k, v in HOLDS.items() if k[0] != "ceiling"})
    t4 = no_ceiling["arli@4 >= 0.95 (ceiling@4 - 0.03 where the ceiling is lower; judged by its CI)"]
    assert t4["holds"] is True and t4["values"]["target"] == 0.95 and t4["values"]["ceiling@4"] is None


def test_a_partial_cell_is_shown_but_no_verdict_uses_it():
    """An ablation run on one of the sweep's two seeds: reported with its seeds, flagged
    incomplete, and its rule stays not evaluated (a verdict needs every training seed)."""
    from arli.bench.claims import verdicts
    from arli.bench.latency_sweep import aggregate, ceiling_cells

    cfg = _cfg()
    rows = [r for r in _rows(HOLDS) if not (r["variant"] == "arli_no_committed" and r["seed"] == 1)]
    cells = aggregate(rows, cfg)
    (partial,) = [c for c in cells if c["variant"] == "arli_no_committed"]
    assert partial["seeds"] == [0] and partial["complete"] is False
    assert all(c["complete"] for c in cells if c is not partial)
    got = {c["claim"]: c for c in verdicts(cells, ceiling_cells(rows), list(cfg.delay_steps), "base_naive")}
    assert got["arli_no_committed@8 < arli@8 (paired CI of arli_no_committed - arli below 0)"]["holds"] is None
    assert got["arli_no_midobs@8 < arli@8 (paired CI of arli_no_midobs - arli below 0)"]["holds"] is True


def test_a_lower_ceiling_lowers_the_target():
    claim = "arli@8 >= 0.90 (ceiling@8 - 0.03 where the ceiling is lower; judged by its CI)"
    cells = {("arli", 8): (85, 80)}
    high = _verdicts({**cells, ("ceiling", 8): 95})[claim]  # a ceiling above 0.90: 0.90 stands
    assert high["values"]["target"] == 0.90 and high["holds"] is not True
    low = _verdicts({**cells, ("ceiling", 8): 80})[claim]
    assert low["holds"] is True and low["values"]["target"] == 0.77
    assert low["values"]["ci95"][0] >= 0.77
    assert _verdicts({**cells, ("ceiling", 8): 90})[claim]["values"]["target"] == 0.90  # not lower: unchanged
    too_low = _verdicts({("arli", 8): (65, 60), ("ceiling", 8): 80})[claim]
    assert too_low["holds"] is False and too_low["values"]["target"] == 0.77


def test_the_gain_interval_is_paired_on_the_same_episodes():
    """Final = start plus 9 more solved episodes out of 60 on each seed: the paired gain is
    clearly positive although the two success intervals overlap; the same success rates on
    unrelated episodes would give no such interval."""
    from arli.bench.latency_sweep import aggregate
    from arli.stats import gain_ci

    cfg = _cfg("delay_steps=[4]", "variants=[arli]")
    rows = [_row("arli", 4, s, 39, 30, n=60) for s in (0, 1)]
    (cell,) = aggregate(rows, cfg)
    assert cell["start_mean"] == 0.5 and cell["success_mean"] == 0.65 and cell["gain_mean"] == 0.15
    assert cell["ci95"][0] < cell["start_ci95"][1]  # the marginal intervals overlap
    assert cell["gain_ci95"][0] > 0.05
    finals = np.array([r["outcomes"] for r in rows], float)
    starts = np.array([r["start_outcomes"] for r in rows], float)
    assert cell["gain_ci95"] == [round(x, 4) for x in gain_ci(finals, starts)]
    # the same rates with the start's successes on other episodes: unpaired, the interval straddles 0
    shuffled = [{**r, "start_outcomes": list(np.random.default_rng(r["seed"]).permutation(r["start_outcomes"]))}
                for r in rows]
    (other,) = aggregate(shuffled, cfg)
    assert other["gain_mean"] == 0.15 and other["gain_ci95"][0] < cell["gain_ci95"][0]


def test_the_report_writes_every_required_field(tmp_path):
    """The default variant list on hand-built cached rows, through main(report_only=true):
    JSON with the fixed schema, markdown with the table, the ceiling and the command, the plot."""
    from arli.bench import latency_sweep as ls

    cache = tmp_path / "cells.jsonl"
    cfg = _cfg("report_only=true", f"cache={cache}", f"report_dir={tmp_path}", "name=latency_sweep_test",
               "eval_episodes=100")
    cfg_dict = ls.cell_settings(cfg)
    sources = {"arli/stats.py": ls._file_digest("arli/stats.py")}
    spec = {**HOLDS, **{(v, d): 70 for v in ("base_sync", "base_rtc") for d in (0, 4, 8)},
            **{(v, d): (90, 85) for v in ("arli_no_committed", "arli_no_midobs") for d in (0, 4)}}
    spec.pop(("uniform_control", 8))  # one cell not run
    rows = [{**r, "fingerprint": ls.fingerprint(cfg_dict, r["variant"]), "sources": sources} for r in _rows(spec)]
    cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ls.main(cfg) == 0
    report = json.loads((tmp_path / "latency_sweep_test.json").read_text())
    assert set(report) >= {"env", "regime", "budget", "eval", "cells", "ceiling", "verdicts", "missing"}
    assert report["env"] == "peg_insert" and report["regime"] == "rl" and report["budget"] == cfg.budget == 50_000
    assert report["eval"] == {"split": "test", "seed_base": 5_000_000, "episodes": 100}
    # 100 test episodes and 2 training seeds: the report says it is below the protocol, naming both
    assert report["protocol"]["met"] is False and report["protocol"]["training_seeds"] == 2
    assert "**Below the evaluation protocol** (100 test episodes (reported numbers need >= 200); 2 training seeds" \
        in (tmp_path / "latency_sweep_test.md").read_text()
    # the same cells judged as a 200-episode, 3-seed sweep's would be: no banner (a base-and-ceiling sweep has no
    # training seed to count)
    from arli.bench.common import protocol

    assert protocol(200, 3)["met"] and protocol(200, None)["met"] and not protocol(100, None)["met"]
    met = ls.markdown({**report, "protocol": protocol(200, 3)}, cfg)
    assert "Below the evaluation protocol" not in met and met.count("| arli | 4 |") == 1
    # which demonstrator made the anchor data: the default changed once, so the report says it
    assert report["demonstrations"] == "bounded"
    assert "anchor data from `run.demonstrations=bounded`" in (tmp_path / "latency_sweep_test.md").read_text()
    keys = {(c["variant"], c["delay_steps"]) for c in report["cells"]}
    assert len(keys) == 3 * 3 + 4 * 3 + 2 + 1  # base x3, arli / ablations / standard, bc x2, uniform x1
    for c in report["cells"]:
        once = c["variant"].startswith("base_")  # the base alone: one row, no training seed
        assert set(c) >= REQUIRED_CELL and c["seeds"] == ([] if once else [0, 1])
        assert c["ci95"][0] <= c["success_mean"] <= c["ci95"][1]
        assert "_outcomes" not in c and set(c["outcomes_by_seed"]) == ({"all"} if once else {"0", "1"})
        assert all(len(b) == 100 and set(b) <= {"0", "1"} for b in c["outcomes_by_seed"].values())
        if c["variant"].startswith("base_"):
            assert c["start_mean"] is None and c["gain_ci95"] is None
        else:
            lo, hi = c["gain_ci95"]
            assert isinstance(c["start_mean"], float) and lo <= c["success_mean"] - c["start_mean"] <= hi
    assert [(c["delay_steps"], c["success"]) for c in report["ceiling"]] == [(0, 1.0), (4, 1.0), (8, 0.99)]
    assert report["missing"] == [["uniform_control", 8, 0], ["uniform_control", 8, 1]]
    claims = {v["claim"]: v["holds"] for v in report["verdicts"]}
    assert claims["arli@8 >= uniform_control@8 + 0.05 (paired CI of the difference)"] is None
    assert claims["arli@4 >= uniform_control@4 + 0.05 (paired CI of the difference)"] is True
    md = (tmp_path / "latency_sweep_test.md").read_text()
    assert "| arli | 4 | [0, 1] | 1.000 [" in md and "**ceiling**" in md
    assert "![latency sweep](latency_sweep_test.png)" in md
    assert "arli bench latency-sweep env=peg_insert budget=50000" in md and "name=latency_sweep_test" in md
    assert "does NOT hold" not in md and "not evaluated" in md  # the one missing cell
    assert (tmp_path / "latency_sweep_test.png").stat().st_size > 1000


def test_a_cached_rl_row_without_its_anchored_start_is_recomputed(tmp_path):
    from arli.bench import latency_sweep as ls

    cfg = _cfg("delay_steps=[4]", "variants=[base_naive,arli]")
    cfg_dict = ls.cell_settings(cfg)
    sources = {"arli/stats.py": ls._file_digest("arli/stats.py")}
    complete = [{**r, "fingerprint": ls.fingerprint(cfg_dict, r["variant"]), "sources": sources}
                for r in _rows({("base_naive", 4): 30, ("arli", 4): (90, 80)})]
    old = [{k: v for k, v in r.items() if k not in ("start_outcomes", "start_success")} for r in complete]
    path = tmp_path / "cells.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    done = ls.load_cache([str(path)], cfg_dict)
    assert set(done) == {("base_naive", 4, None)}  # the arli rows are to run again
    assert [c for c in ls.plan(cfg) if c not in done] == [("arli", 4, 0), ("arli", 4, 1)]
    # the complete rows in a second file (the report's committed cells) fill in what the first lacks
    other = tmp_path / "committed.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in complete))
    assert len(ls.load_cache([str(path), str(other)], cfg_dict)) == 3
    path.write_text("".join(json.dumps(r) + "\n" for r in complete))
    assert len(ls.load_cache([str(path)], cfg_dict)) == 3
    # a cell run with another torch thread count summed its floats in another order: not reused
    assert not ls.load_cache([str(path)], {**cfg_dict, "threads_per_worker": cfg_dict["threads_per_worker"] + 1})


def test_controls_run_at_every_positive_delay_and_the_ceiling_once_per_delay():
    from arli.bench.latency_sweep import plan
    from arli.config import DEFAULT_SWEEP_VARIANTS

    cfg = compose("bench_latency_sweep", [])
    assert cfg.eval_episodes == 200 and cfg.seeds == [10, 11, 12] and cfg.delay_steps == [0, 4, 8]
    assert cfg.name == "latency_sweep" and cfg.report_dir == "reports"
    assert list(cfg.variants) == list(DEFAULT_SWEEP_VARIANTS)
    assert not {"standard_d0", "stepwise_d0", "anchor_only"} & set(cfg.variants)
    cells = plan(cfg)
    for control in ("bc_control", "uniform_control"):
        assert sorted({(d, s) for v, d, s in cells if v == control}) == [(d, s) for d in (4, 8) for s in (10, 11, 12)]
    assert sorted((d, s) for v, d, s in cells if v == "ceiling") == [(0, None), (4, None), (8, None)]
    assert sorted({d for v, d, _ in cells if v == "arli"}) == [0, 4, 8]
    other = plan(compose("bench_latency_sweep", ["delay_steps=[0,2,8]", "seeds=[5]"]))
    assert sorted(d for v, d, _ in other if v == "uniform_control") == [2, 8]


def test_uniform_control_weights_every_row_one_and_bc_control_drops_the_critic():
    from arli.bench.latency_sweep import cell_settings, cell_spec

    cfg_dict = cell_settings(compose("bench_latency_sweep", ["checkpoint=expert", "budget=2000"]))
    arli, uniform, bc = (cell_spec(cfg_dict, v, 2) for v in ("arli", "uniform_control", "bc_control"))
    assert uniform.learner.awr_weights == "uniform" and uniform.learner.q_weight == arli.learner.q_weight == 1.0
    assert arli.learner.awr_weights == "advantage" and bc.learner.awr_weights == "advantage"
    assert bc.learner.q_weight == 0.0
    for spec in (arli, uniform, bc):  # otherwise the same run as arli's
        assert spec.variant == "arli" and spec.seed == 2 and spec.env_steps == 2000
    # the critic steers nothing in a control: no value gating, AWR where the default's select needs candidates
    assert arli.learner.gate_candidates == 8 and arli.learner.actor_update == "select"
    assert uniform.learner == arli.learner.__class__(**{**vars(arli.learner), "awr_weights": "uniform",
                                                        "actor_update": "awr", "gate_candidates": 0})
    assert bc.learner == arli.learner.__class__(**{**vars(arli.learner), "q_weight": 0.0, "actor_update": "awr",
                                                   "gate_candidates": 0})
    for spec in (uniform, bc):
        spec.learner.validate()
    # under dpg the uniform control is still AWR with uniform weights; the BC control keeps dpg's update
    dpg = cell_settings(compose("bench_latency_sweep", ["checkpoint=expert", "run.learner.actor_update=dpg"]))
    assert cell_spec(dpg, "uniform_control", 2).learner.actor_update == "awr"
    assert cell_spec(dpg, "bc_control", 2).learner.actor_update == "dpg"


def test_ideal_reference_reuses_standard_at_zero_delay():
    from arli.bench.latency_sweep import IDEAL, aggregate, plan

    cfg = compose("bench_latency_sweep", ["seeds=[0,1]", "delay_steps=[0,4]",
                                          "variants=[standard,standard_d0]"])
    cells = plan(cfg)
    assert all(v != IDEAL for v, _, _ in cells) and len(cells) == 4  # not run twice
    rows = [_row("standard", d, s, 10 * (s + 1) + d, 5) for _, d, s in cells]
    agg = {(c["variant"], c["delay_steps"]): c for c in aggregate(rows, cfg)}
    assert agg[(IDEAL, 0)]["success_mean"] == agg[("standard", 0)]["success_mean"] == 0.15
    assert agg[(IDEAL, 0)]["seeds"] == [0, 1]
    # without d = 0 in the sweep, standard_d0 runs itself and stands in for standard@0 in the verdicts
    alone = compose("bench_latency_sweep", ["seeds=[0,1]", "delay_steps=[4]", "variants=[arli,standard_d0]"])
    assert sorted({(v, d) for v, d, _ in plan(alone)}) == [("arli", 4), (IDEAL, 0)]
    got = _verdicts({("arli", 4): (93, 80), (IDEAL, 0): (92, 80)}, alone)
    assert got["arli@4 >= standard@0 - 0.03 (paired CI of arli@4 - standard@0)"]["holds"] is True
    assert got["arli@4 >= standard@0 - 0.03 (paired CI of arli@4 - standard@0)"]["values"]["standard@0"] == 0.92


def test_report_command_names_every_non_default_setting_it_needs_to_reproduce():
    """The command a report prints must rerun the same cells: a non-default base checkpoint
    (the seeded-base sweep once printed a command that ran on another base) and learner
    overrides appear; defaults do not."""
    from arli.bench.latency_sweep import command, non_default_settings

    plain = compose("bench_latency_sweep", ["env=peg_insert"])
    assert non_default_settings(plain) == []
    assert command(plain) == ("arli bench latency-sweep env=peg_insert budget=50000 'seeds=[10, 11, 12]' "
                              "'delay_steps=[0, 4, 8]' eval_episodes=200")
    cfg = compose("bench_latency_sweep", ["env=peg_insert", "checkpoint=checkpoints/base_peg_insert_seeded",
                                          "run.learner.start_weight=1.0", "variants=[arli,anchor_only]"])
    assert non_default_settings(cfg) == ["checkpoint=checkpoints/base_peg_insert_seeded",
                                         "run.learner.start_weight=1.0", "'variants=[arli,anchor_only]'"]
    dynamic = compose("bench_latency_sweep", ["env=peg_insert_dynamic", "delay_steps=[4,8]",
                                              "variants=[arli,standard]", "name=latency_sweep_peg_insert_dynamic"])
    assert command(dynamic).endswith("'variants=[arli,standard]' name=latency_sweep_peg_insert_dynamic")


def test_the_report_name_is_a_file_name():
    from arli.config import ConfigError

    with pytest.raises(ConfigError, match="name"):
        compose("bench_latency_sweep", ["name=reports/x"])


def test_a_start_the_guard_replaced_by_the_base_is_named_in_the_cell():
    """A start whose test outcomes are exactly the base's (in the residual's loop) is the base
    (the start guard dropped the anchored start): the cell lists those seeds and the report says
    so; a start that differs on any episode is not listed."""
    from arli.bench.common import protocol
    from arli.bench.latency_sweep import aggregate, markdown

    cfg = _cfg("delay_steps=[4]", "variants=[base_naive,arli]")
    rows = _rows({("base_naive", 4): 30, ("arli", 4): (60, 30)})
    for r in rows:
        if r["variant"] == "arli" and r["seed"] == 1:
            r["start_outcomes"] = r["start_outcomes"][::-1]  # the same rate on other episodes
    (cell,) = [c for c in aggregate(rows, cfg) if c["variant"] == "arli"]
    assert cell["start_is_base_seeds"] == [0]
    assert cell["outcomes_by_seed"]["0"] == "1" * 60 + "0" * 40
    assert cell["start_outcomes_by_seed"]["1"] == "0" * 70 + "1" * 30
    md = markdown({"cells": [cell], "ceiling": [], "eval": {"episodes": 100, "seed_base": 5_000_000},
                   "command": "arli bench latency-sweep", "checkpoint_digest": "x", "verdicts": [], "machine": {},
                   "protocol": protocol(100, 2)}, cfg)
    assert "(= the base's outcomes on seeds [0])" in md


def test_seeds_where_the_end_guard_deployed_the_start_are_named_in_the_cell():
    from arli.bench.common import protocol
    from arli.bench.latency_sweep import aggregate, markdown

    cfg = _cfg("delay_steps=[4]", "variants=[base_naive,arli]")
    rows = _rows({("base_naive", 4): 30, ("arli", 4): (60, 30)})
    for r in rows:
        if r["variant"] == "arli":
            r["end_guard"] = {"split": "tune", "episodes": 30, "start": 0.9, "trained": 0.8 + 0.2 * r["seed"],
                              "reverted": r["seed"] == 0}
            r["trained_outcomes"] = [1] * (20 + r["seed"]) + [0] * (80 - r["seed"])  # what the guard dropped
    (cell,) = [c for c in aggregate(rows, cfg) if c["variant"] == "arli"]
    assert cell["start_deployed_seeds"] == [0]
    # the dropped residual's own test outcomes stay in the report, for the seeds where it was dropped only
    assert cell["trained_per_seed"] == {"0": 0.2} and cell["trained_outcomes_by_seed"] == {"0": "1" * 20 + "0" * 80}
    md = markdown({"cells": [cell], "ceiling": [], "eval": {"episodes": 100, "seed_base": 5_000_000},
                   "command": "arli bench latency-sweep", "checkpoint_digest": "x", "verdicts": [], "machine": {},
                   "protocol": protocol(100, 2)}, cfg)
    assert "(end guard: the start deployed on seeds [0]; the trained residual: 0.200 (seed 0))" in md


def test_a_file_edited_while_a_worker_runs_makes_its_rows_stale(monkeypatch):
    """A module first imported during a cell was read from disk then: if its file differs from
    what it was when the worker started, which version ran is unknown, so the row must not be
    reused (it used to be credited with the edited file's digest)."""
    from arli.bench import latency_sweep as ls
    import arli.stats  # noqa: F401
    import arli.types  # noqa: F401

    from arli.bench import provenance

    monkeypatch.setattr(provenance, "_FIRST_SEEN", {})
    at_start = {rel: ls._file_digest(rel) for rel in ls._code_files()}
    assert "arli/rl/learner.py" in at_start and "sim_envs/peg_insert.py" in at_start
    monkeypatch.setattr(provenance, "_AT_START", {**at_start, "arli/stats.py": "0" * 16})  # edited since the start
    seen = ls.loaded_sources()
    assert seen["arli/stats.py"] == ls.CHANGED_WHILE_RUNNING
    assert seen["arli/types.py"] == at_start["arli/types.py"]
    assert not ls.sources_unchanged({"arli/stats.py": seen["arli/stats.py"]})
    assert ls.sources_unchanged({"arli/types.py": seen["arli/types.py"]})
    assert not ls.sources_unchanged({"arli/types.py": None})


def test_the_base_alone_runs_once_per_delay_and_old_per_seed_rows_collapse(tmp_path):
    """The base alone depends on no training seed: the plan runs it once per delay. A sweep
    that ran it per seed left copies: they load as the one cell, are rewritten as one row, and
    its interval is that of one measurement, not of three seeds; copies that disagree are refused."""
    from arli.bench import claims
    from arli.bench import latency_sweep as ls
    from arli.stats import success_ci

    cfg = compose("bench_latency_sweep", ["checkpoint=expert"])  # seeds 10-12, d 0 / 4 / 8
    cells = ls.plan(cfg)
    base = [c for c in cells if c[0] in ls.BASE_VARIANTS]
    assert sorted(base) == sorted((v, d, None) for v in ls.BASE_VARIANTS for d in (0, 4, 8))
    assert sorted(s for v, d, s in cells if v == "arli" and d == 4) == [10, 11, 12]

    cfg = _cfg("delay_steps=[4]", "variants=[base_naive,arli]")
    cfg_dict = ls.cell_settings(cfg)
    sources = {"arli/stats.py": ls._file_digest("arli/stats.py")}
    outcomes = [1, 0, 1, 1] * 25
    old = [{**_row("base_naive", 4, s, 0), "outcomes": outcomes, "success": 0.75,
            "fingerprint": ls.fingerprint(cfg_dict, "base_naive"), "sources": sources} for s in (0, 1)]
    arli = [{**r, "fingerprint": ls.fingerprint(cfg_dict, "arli"), "sources": sources}
            for r in _rows({("arli", 4): (90, 80)})]
    committed = tmp_path / "name" / "cells.jsonl"
    committed.parent.mkdir()
    committed.write_text("".join(json.dumps(r) + "\n" for r in old + arli))
    done = ls.load_cache([str(committed)], cfg_dict)
    assert set(done) == {("base_naive", 4, None), ("arli", 4, 0), ("arli", 4, 1)}
    assert done[("base_naive", 4, None)]["seed"] is None and not [c for c in ls.plan(cfg) if c not in done]
    ls.write_cells(str(committed), [done[c] for c in ls.plan(cfg)])  # the copies give way to the one row
    kept = [json.loads(line) for line in committed.read_text().splitlines()]
    assert sorted(str(r["seed"]) for r in kept if r["variant"] == "base_naive") == ["None"]
    cells = {c["variant"]: c for c in ls.aggregate(old + arli, cfg)}
    assert cells["base_naive"]["seeds"] == [] and cells["base_naive"]["complete"] is True
    assert cells["base_naive"]["per_seed"] == [0.75]  # one measurement, not two seeds
    assert cells["base_naive"]["ci95"] == [round(x, 4) for x in success_ci([outcomes])]
    assert cells["base_naive"]["outcomes_by_seed"] == {"all": ls._bits(outcomes)}
    (harm,) = [c for c in claims.verdicts(list(cells.values()), [], [4], "base_naive") if c["family"] == "not_below_base"
               and "@4" in c["claim"]]
    assert harm["values"]["difference"] == 0.15 and harm["holds"] is True
    with pytest.raises(ValueError, match="base_naive@4: two rows with other test outcomes"):
        ls.aggregate([old[0], {**old[1], "outcomes": outcomes[::-1]}, *arli], cfg)
    # the same through the cache: a disagreeing copy is refused, not dropped by the rewrite
    committed.write_text("".join(json.dumps(r) + "\n" for r in [old[0], {**old[1], "outcomes": outcomes[::-1]}]))
    with pytest.raises(ValueError, match="base_naive@4: two rows with other test outcomes"):
        ls.load_cache([str(committed)], cfg_dict)
    # a copy under other settings (another thread count) is another cell's row: kept by the rewrite
    other = {**old[1], "fingerprint": "another", "seed": 1}
    committed.write_text(json.dumps(other) + "\n")
    ls.write_cells(str(committed), [{**old[0], "seed": None}])
    assert [r["fingerprint"] for r in map(json.loads, committed.read_text().splitlines())] == \
        [old[0]["fingerprint"], "another"]


def test_committed_cells_merge_and_the_first_valid_row_wins(tmp_path):
    """A rerun with fewer variants never drops committed rows; with a valid row for the same
    cell in the run cache and in the committed file, the run cache's is used."""
    from arli.bench import latency_sweep as ls

    cfg = _cfg("delay_steps=[4]", "variants=[base_naive,arli]")
    cfg_dict = ls.cell_settings(cfg)
    sources = {"arli/stats.py": ls._file_digest("arli/stats.py")}
    rows = [{**r, "fingerprint": ls.fingerprint(cfg_dict, r["variant"]), "sources": sources}
            for r in _rows({("base_naive", 4): 30, ("arli", 4): (90, 80)})]
    committed = tmp_path / "name" / "cells.jsonl"
    ls.write_cells(str(committed), rows)
    ls.write_cells(str(committed), [r for r in rows if r["variant"] == "base_naive"])  # fewer variants
    assert len(ls.load_cache([str(committed)], cfg_dict)) == 3
    assert len(committed.read_text().splitlines()) == 3 and not list(committed.parent.glob("*.tmp"))
    other = [{**r, "success": 0.5} if r["variant"] == "arli" else r for r in rows]
    cache = tmp_path / "cache.jsonl"
    cache.write_text("".join(json.dumps(r) + "\n" for r in other))
    done = ls.load_cache([str(cache), str(committed)], cfg_dict)
    assert done[("arli", 4, 0)]["success"] == 0.5
    assert ls.load_cache([str(committed), str(cache)], cfg_dict)[("arli", 4, 0)]["success"] != 0.5
    with pytest.raises(TypeError, match="list of files"):
        ls.load_cache(str(cache), cfg_dict)


def test_cell_threads_are_a_setting_not_the_machine_s_cores():
    from arli.bench import latency_sweep as ls

    one, two = ls.cell_settings(_cfg("workers=1")), ls.cell_settings(_cfg("workers=3"))
    assert one["threads_per_worker"] == two["threads_per_worker"] == 1
    assert ls.fingerprint(one, "arli") == ls.fingerprint(two, "arli")
    assert ls.fingerprint(ls.cell_settings(_cfg("threads=2")), "arli") != ls.fingerprint(one, "arli")
    # the ceiling always runs on one thread: its cells do not depend on the setting
    assert ls.fingerprint(ls.cell_settings(_cfg("threads=2")), "ceiling") == ls.fingerprint(one, "ceiling")


def test_base_digest_only_rebuilds_reports():
    """Cells run on this machine's base: a base digest from elsewhere only rebuilds a report."""
    from arli.config import ConfigError

    with pytest.raises(ConfigError, match="base_digest"):
        compose("bench_latency_sweep", ["base_digest=280b12aa66b9"])
    assert compose("bench_latency_sweep", ["base_digest=280b12aa66b9", "report_only=true"]).base_digest == "280b12aa66b9"


# -- finished `arli finetune` runs as cells (runs=[...]) ----------------------------------
# the controls' learners as `arli finetune` overrides (the sweep's control_settings at the default select update)
BC_CONTROL = ("run.learner.q_weight=0", "run.learner.actor_update=awr", "run.learner.gate_candidates=0")
UNIFORM_CONTROL = ("run.learner.awr_weights=uniform", "run.learner.actor_update=awr", "run.learner.gate_candidates=0")
def _finetune_run(root, name, *overrides, final=95, start=85, base=30, digest="expert", seed=0, episodes=N,
                  summary=None):
    """A finished run's files as `arli finetune` writes them (its config through the same
    composition and save), with hand-made outcomes on ``episodes`` test episodes; ``summary``:
    keys to set in its summary.json."""
    from omegaconf import OmegaConf

    from sim_envs import task_name

    cfg = compose("finetune", ["checkpoint=expert", "delay_steps=4", f"run.seed={seed}", "run.env_steps=50000",
                               f"run.test_episodes={episodes}", *overrides])
    d = root / name
    d.mkdir(parents=True)
    OmegaConf.save(OmegaConf.structured(cfg), d / "config.yaml")
    outcomes = {k: _hits(v, episodes) for k, v in (("base", base), ("start", start), ("trained", final),
                                                   ("final", final))}
    split = {"split": "test", "seed_base": 5_000_000, "episodes": episodes}
    (d / "eval_test.json").write_text(json.dumps({"split": split, "outcomes": outcomes,
                                                  "success": {k: sum(v) / episodes for k, v in outcomes.items()}}))
    history = [{"env_steps": x, "success": y} for x, y in ((0, 0.85), (12_510, 0.7), (25_020, 0.83), (50_000, 0.9))]
    (d / "summary.json").write_text(json.dumps({
        "env": task_name(cfg.env.name), "variant": cfg.run.variant, "regime": cfg.run.regime,
        "strategy": cfg.chunking.strategy, "delay_steps": cfg.delay_steps, "eval": split,
        "env_steps": cfg.run.env_steps + 17, "base_digest": digest, "steps_to_80": 0, "history": history,
        "end_guard": {"split": "tune", "episodes": 30, "start": 0.8, "trained": 0.9, "reverted": False},
        **(summary or {})}))
    return str(d)


def _sweep_of_runs(tmp_path, runs, *extra, base=30, cached=None):
    """``main(report_only=true)`` over a cache holding the base alone at d = 4 (seeds 0, 1) and
    ``cached`` ({(variant, d): k or (k, start)}, hand-built rows)."""
    from arli.bench import latency_sweep as ls

    cache = tmp_path / "cells.jsonl"
    cfg = _cfg("report_only=true", f"cache={cache}", f"report_dir={tmp_path / 'reports'}", "name=of_runs",
               "eval_episodes=100", "delay_steps=[4]", f"runs=[{','.join(runs)}]", *extra)
    cfg_dict = ls.cell_settings(cfg)
    sources = {"arli/stats.py": ls._file_digest("arli/stats.py")}
    rows = [{**r, "fingerprint": ls.fingerprint(cfg_dict, r["variant"]), "sources": sources}
            for r in _rows({**({} if base is None else {("base_naive", 4): base}), **(cached or {})})]
    cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ls.main(cfg) == 0
    return json.loads((tmp_path / "reports" / "of_runs.json").read_text())


def test_finished_runs_fill_their_cells_and_stay_in_their_directories(tmp_path, capsys):
    from arli.bench import latency_sweep as ls

    runs = [_finetune_run(tmp_path, f"arli_s{s}", seed=s, final=95 - s) for s in (0, 1)]
    # a control by its learner; the curve's spacing is free (it changes no reported number)
    runs += [_finetune_run(tmp_path, f"bc_s{s}", *BC_CONTROL, "run.eval_every=5000", seed=s, final=80)
             for s in (0, 1)]
    # a run that recorded its code (this code) and threads (the sweep's): checked, not flagged
    runs += [_finetune_run(tmp_path, f"uniform_s{s}", *UNIFORM_CONTROL, seed=s, final=86,
                           summary={"sources": {"arli/stats.py": ls._file_digest("arli/stats.py")},
                                    "torch_threads": 1}) for s in (0, 1)]
    # the cache's own arli@4 row is replaced by the named runs
    report = _sweep_of_runs(tmp_path, runs, cached={("arli", 4): (10, 10)})
    assert "replaces the cached arli@4 row of seed 0" in capsys.readouterr().out
    cells = {(c["variant"], c["delay_steps"]): c for c in report["cells"]}
    arli, bc, uniform = cells[("arli", 4)], cells[("bc_control", 4)], cells[("uniform_control", 4)]
    assert arli["per_seed"] == [0.95, 0.94] and arli["start_mean"] == 0.85 and arli["complete"]
    assert arli["runs_by_seed"] == {"0": runs[0], "1": runs[1]} and bc["success_mean"] == 0.80
    assert uniform["success_mean"] == 0.86 and uniform["runs_unrecorded_seeds"] == []
    assert arli["runs_unrecorded_seeds"] == [0, 1]
    # steps to 80% at the sweep's points (quarters of the budget), not the run's step-0 point
    assert arli["steps_to_80"] == 25_020
    assert "runs_by_seed" not in cells[("base_naive", 4)]
    claims = {v["claim"]: v["holds"] for v in report["verdicts"]}
    assert claims["arli@4 >= bc_control@4 + 0.05 (paired CI of the difference)"] is True
    assert report["runs"] == runs
    md = (tmp_path / "reports" / "of_runs.md").read_text()
    assert "'runs=[" in md and "* arli@4: seed 0 [`" in md
    assert "(seeds [0, 1]: code and torch threads not recorded, not checked)" in md
    # the committed rows are the sweep's own cells: the runs are read from their directories
    kept = [json.loads(x) for x in (tmp_path / "reports" / "of_runs" / "cells.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in kept} == {"base_naive", "arli"} and all("run_dir" not in r for r in kept)


def test_a_run_of_another_recipe_base_code_or_cell_is_refused_naming_what_differs(tmp_path):
    from arli.config import ConfigError

    def refused(run, *extra, base=30):
        with pytest.raises(ConfigError) as err:
            _sweep_of_runs(tmp_path, [run], *extra, base=base)
        return str(err.value)

    msg = refused(_finetune_run(tmp_path, "lr", "run.learner.actor_lr=0.001"))
    assert "run.learner.actor_lr=0.001 (the sweep's: 3e-05)" in msg
    assert "env.dt=0.1 (the sweep's: 0.05)" in refused(_finetune_run(tmp_path, "dt", "env.dt=0.1"))
    assert "chunking.execute_horizon=6" in refused(_finetune_run(tmp_path, "h6", "chunking.execute_horizon=6"))
    assert "ran 20000 env steps; the sweep's budget is 50000" in refused(
        _finetune_run(tmp_path, "short", "run.env_steps=20000"))
    assert "other test episodes" in refused(_finetune_run(tmp_path, "other_base", base=31))
    assert "finetuned base 0123456789ab" in refused(_finetune_run(tmp_path, "digest", digest="0123456789ab"))
    assert "not one of the sweep's seeds" in refused(_finetune_run(tmp_path, "seed7", seed=7))
    assert "delay_steps=8" in refused(_finetune_run(tmp_path, "d8", "delay_steps=8"))
    assert "has test episodes {'split': 'test', 'seed_base': 5000000, 'episodes': 50}" in refused(
        _finetune_run(tmp_path, "fewer", episodes=50))
    assert "resumed from" in refused(_finetune_run(tmp_path, "resumed", "resume=outputs/x/checkpoint"))
    # the summary of another run left in the same directory
    msg = refused(_finetune_run(tmp_path, "stale", summary={"variant": "standard", "env_steps": 5000}))
    assert "variant='standard'" in msg and "env_steps=5000" in msg and "rerun it" in msg
    # recorded code that is not this code, recorded threads that are not the sweep's
    assert "ran other code than is here (arli/stats.py changed)" in refused(
        _finetune_run(tmp_path, "code", summary={"sources": {"arli/stats.py": "0" * 16}}))
    assert "ran 2 torch threads, the sweep's cells 1" in refused(
        _finetune_run(tmp_path, "threads", summary={"torch_threads": 2}))
    # a run that saved no base digest is checked by the base alone's outcomes, or refused without them
    assert "add `base_naive` at d = 4" in refused(_finetune_run(tmp_path, "nodigest", summary={"base_digest": None}),
                                                  base=None)
    twice = [_finetune_run(tmp_path, "a", seed=0), _finetune_run(tmp_path, "b", seed=0)]
    with pytest.raises(ConfigError, match="both the arli@4 cell of seed 0"):
        _sweep_of_runs(tmp_path, twice)
