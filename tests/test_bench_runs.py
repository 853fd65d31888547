"""``arli bench runs``: several training seeds pooled on their shared test episodes."""

import json

import pytest

from arli.cli import compose
from arli.bench.runs import main
from arli.config import ConfigError


def _run(path, seed_base, final, start, base, variant="arli", trained=None, guard=None, history=None):
    path.mkdir()
    split = {"split": "test", "seed_base": seed_base, "episodes": len(final)}
    outcomes = {"base": base, "start": start, "final": final, **({"trained": trained} if trained else {})}
    (path / "eval_test.json").write_text(json.dumps({"split": split, "outcomes": outcomes}))
    (path / "summary.json").write_text(json.dumps({"env": "peg_insert", "variant": variant, "regime": "rl",
                                                   "delay_steps": 8, "env_steps": 100, "wall_s": 1.0,
                                                   "end_guard": guard, "history": history or [],
                                                   "curve_eval": {"split": "tune", "seed_base": 10000,
                                                                  "episodes": 30}}))
    return str(path)


def test_the_tune_curves_are_read_at_each_quarter_of_the_budget(tmp_path):
    """The learning curves (tune episodes) at the budget's quarters: the evaluated point nearest
    each mark per run, the mean over runs, and the plot; none for runs that saved no curve."""
    def history(points):
        return [{"env_steps": s, "success": v} for s, v in points]

    a = _run(tmp_path / "a", 5, [1, 1], [1, 0], [0, 0],
             history=history([(0, 0.5), (1010, 0.6), (2020, 0.7), (3030, 0.8), (4040, 0.9)]))
    b = _run(tmp_path / "b", 5, [1, 0], [1, 0], [0, 0],
             history=history([(0, 0.4), (990, 0.4), (2005, 0.5), (2990, 0.6), (4001, 0.7), (4990, 0.2)]))
    assert main(compose("bench_runs", [f"runs=[{a},{b}]", "name=curves", f"report_dir={tmp_path}"])) == 0
    marks = json.loads((tmp_path / "curves.json").read_text())["curve_at_budget"]
    # quarters of the shorter run (4040 steps); b's last point (4990) is past the 100% mark
    assert [m["mark"] for m in marks] == [1010, 2020, 3030, 4040]
    assert marks[1]["env_steps"] == [2020, 2005] and marks[1]["per_seed"] == [0.7, 0.5]
    assert marks[3]["env_steps"] == [4040, 4001] and marks[3]["mean"] == pytest.approx(0.8)
    assert (tmp_path / "curves.png").stat().st_size > 0 and "![learning curves](curves.png)" in \
        (tmp_path / "curves.md").read_text()
    assert "| 2020 | 0.600 | 0.70 (2020) / 0.50 (2005) |" in (tmp_path / "curves.md").read_text()
    c = _run(tmp_path / "c", 5, [1, 0], [1, 0], [0, 0])
    assert main(compose("bench_runs", [f"runs=[{a},{c}]", "name=nocurve", f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "nocurve.json").read_text())["curve_at_budget"] == []
    assert not (tmp_path / "nocurve.png").exists()
    # re-pooling under a name whose earlier report had curves drops that report's plot
    assert main(compose("bench_runs", [f"runs=[{a},{c}]", "name=curves", f"report_dir={tmp_path}"])) == 0
    assert not (tmp_path / "curves.png").exists() and "![learning curves]" not in (tmp_path / "curves.md").read_text()


def test_the_trained_residual_is_pooled_next_to_the_deployed_one(tmp_path):
    """Runs with the end guard: what RL trained and what was deployed (the start where the guard
    dropped the trained residual), and the guard's paired effect final - trained."""
    guard = {"split": "tune", "episodes": 30, "start": 0.9, "trained": 0.8, "reverted": True}
    a = _run(tmp_path / "a", 5, [1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0], trained=[1, 0, 0, 0], guard=guard)
    b = _run(tmp_path / "b", 5, [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], trained=[1, 1, 0, 0],
             guard={**guard, "trained": 0.95, "reverted": False})
    assert main(compose("bench_runs", [f"runs=[{a},{b}]", "name=guarded", f"report_dir={tmp_path}"])) == 0
    report = json.loads((tmp_path / "guarded.json").read_text())
    assert report["cells"]["trained"]["per_seed"] == [0.25, 0.5] and report["cells"]["final"]["per_seed"] == [0.75, 0.5]
    assert report["gains"]["final-trained"]["mean"] == 0.25 and report["gains"]["trained-start"]["mean"] == -0.125
    assert [g["reverted"] for g in report["end_guard"]] == [True, False]
    md = (tmp_path / "guarded.md").read_text()
    assert "as trained (before the end guard)" in md and "0.90 vs 0.80 on 30 -> start deployed" in md
    # a run without the trained outcomes (made before the guard): no trained cell for the pool
    c = _run(tmp_path / "c", 5, [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0])
    assert main(compose("bench_runs", [f"runs=[{a},{c}]", "name=mixed", f"report_dir={tmp_path}"])) == 0
    mixed = json.loads((tmp_path / "mixed.json").read_text())
    assert "trained" not in mixed["cells"] and "final-trained" not in mixed["gains"]


def test_runs_are_pooled_per_seed_and_paired(tmp_path):
    a = _run(tmp_path / "a", 5, [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0])
    b = _run(tmp_path / "b", 5, [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0])
    cfg = compose("bench_runs", [f"runs=[{a},{b}]", "name=pooled", f"report_dir={tmp_path}"])
    assert main(cfg) == 0
    report = json.loads((tmp_path / "pooled.json").read_text())
    assert report["seeds"] == 2 and report["cells"]["final"]["per_seed"] == [0.75, 0.5]
    assert report["cells"]["final"]["success"] == 0.625 and report["gains"]["final-start"]["mean"] == 0.25
    assert report["target"] is None
    # 4 test episodes and 2 training seeds: written, and marked as below the protocol reported numbers need
    assert report["protocol"]["met"] is False and len(report["protocol"]["shortfalls"]) == 2
    assert "**Below the evaluation protocol** (4 test episodes" in (tmp_path / "pooled.md").read_text()
    three = [_run(tmp_path / f"p{s}", 5, [1, 0] * 100, [0, 0] * 100, [0, 0] * 100) for s in range(3)]
    assert main(compose("bench_runs", [f"runs=[{','.join(three)}]", "name=met", f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "met.json").read_text())["protocol"]["met"] is True
    assert "Below the evaluation protocol" not in (tmp_path / "met.md").read_text()
    # a target is judged by the deployed residual's interval: reached only when its lower end clears it
    low = [_run(tmp_path / n, 5, f, [0, 0, 0, 0], [0, 0, 0, 0]) for n, f in (("la", [0, 0, 0, 1]), ("lb", [0] * 4))]
    for runs, target, judged in (([a, b], 0.1, "above"), ([a, b], 0.6, "unresolved"), (low, 0.9, "below")):
        assert main(compose("bench_runs", [f"runs=[{','.join(runs)}]", "name=t", f"target={target}",
                                           f"report_dir={tmp_path}"])) == 0
        assert json.loads((tmp_path / "t.json").read_text())["target"] == {"success": target, "verdict": judged}
        assert f"target={target:g} name=t`" in (tmp_path / "t.md").read_text()
        assert f"Target: after RL ≥ {target:g}, judged by its interval: **{judged}**" in (tmp_path / "t.md").read_text()
    for bad in ("95", "1"):  # a percentage, or a rate no interval can clear
        with pytest.raises(ConfigError, match="target"):
            main(compose("bench_runs", [f"runs=[{a},{b}]", f"target={bad}", f"report_dir={tmp_path}"]))
    lo, hi = report["gains"]["final-base"]["ci95"]
    assert 0 < lo <= 0.625 <= hi and report["gains"]["final-base"]["verdict"] == "above"
    other = _run(tmp_path / "c", 99, [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1])
    with pytest.raises(ConfigError, match="share one test split"):
        main(compose("bench_runs", [f"runs=[{a},{other}]", f"report_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="has no eval_test.json"):
        main(compose("bench_runs", [f"runs=[{tmp_path}]", f"report_dir={tmp_path}"]))


def test_a_reference_setting_is_paired_by_training_seed_and_episode(tmp_path):
    runs = [_run(tmp_path / "a", 5, [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]),
            _run(tmp_path / "b", 5, [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0])]
    refs = [_run(tmp_path / "ra", 5, [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]),
            _run(tmp_path / "rb", 5, [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0])]
    for d, seed in zip(runs + refs, (10, 11, 10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n")
    cfg = compose("bench_runs", [f"runs=[{','.join(runs)}]", f"reference=[{','.join(refs)}]", "name=vs",
                                 f"report_dir={tmp_path}"])
    assert main(cfg) == 0
    report = json.loads((tmp_path / "vs.json").read_text())
    assert report["demonstrations"] == "expert"  # saved before the key existed: the expert's own
    assert "`run.demonstrations=expert`" in (tmp_path / "vs.md").read_text()
    ref = report["reference"]
    assert ref["final-reference_final"]["mean"] == 1 - 0.125
    assert report["reference_settings"] == [[], []]  # only the seed saved: nothing else differs
    assert "The runs' saved settings match the reference's" in (tmp_path / "vs.md").read_text()
    # a setting the runs changed is named in the report, per seed where the seeds disagree
    for d, seed in zip(runs, (10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n  eval_every: 9\n  learner:\n"
                                                  f"    actor_update: select\n    gate_candidates: {7 + seed - 10}\n")
    for d, seed in zip(refs, (10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n  learner:\n    actor_update: awr\n"
                                                  "    gate_candidates: 0\n")
    assert main(cfg) == 0
    assert json.loads((tmp_path / "vs.json").read_text())["reference_settings"] == [
        ["run.learner.actor_update=select", "run.learner.gate_candidates=7"],
        ["run.learner.actor_update=select", "run.learner.gate_candidates=8"]]
    assert ("per training seed: `run.learner.actor_update=select`, `run.learner.gate_candidates=7`; "
            "`run.learner.actor_update=select`, `run.learner.gate_candidates=8`.") in (tmp_path / "vs.md").read_text()
    for d, seed in zip(runs + refs, (10, 11, 10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n")
    assert ref["final-reference_final"]["reference_per_seed"] == [0.0, 0.25]
    assert ref["start-reference_start"]["mean"] == 0.375 - 0.125
    lo, hi = ref["final-reference_final"]["ci95"]
    assert 0 < lo <= 0.875 <= hi and ref["final-reference_final"]["verdict"] == "above"
    assert "margin" not in ref["final-reference_final"]
    # a margin over the control is judged by the paired difference's lower end
    for mine, control, margin, judged in ((runs, refs, lo - 0.01, "above"), (runs, refs, (lo + hi) / 2, "unresolved"),
                                          (refs, runs, 0.0, "below")):
        assert main(compose("bench_runs", [f"runs=[{','.join(mine)}]", f"reference=[{','.join(control)}]", "name=m",
                                           f"margin={margin}", f"report_dir={tmp_path}"])) == 0
        final = json.loads((tmp_path / "m.json").read_text())["reference"]["final-reference_final"]
        assert final["margin"] == {"threshold": margin, "verdict": judged}
        assert f"(met when its lower end is above): **{judged}**" in (tmp_path / "m.md").read_text()
    # a lead resolved above 0 that falls short of the margin: the margin's verdict, not the plain one
    few = [_run(tmp_path / f"f{i}", 5, [1, 0] * 10, [0] * 20, [0] * 20) for i in range(2)]
    none = [_run(tmp_path / f"n{i}", 5, [0] * 20, [0] * 20, [0] * 20) for i in range(2)]
    for d, seed in zip(few + none, (10, 11, 10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n")
    assert main(compose("bench_runs", [f"runs=[{','.join(few)}]", f"reference=[{','.join(none)}]", "name=f",
                                       "margin=0.9", f"report_dir={tmp_path}"])) == 0
    final = json.loads((tmp_path / "f.json").read_text())["reference"]["final-reference_final"]
    assert final["verdict"] == "above" and final["ci95"][1] < 0.9 and final["margin"]["verdict"] == "below"
    for bad, says in ((["margin=1.5", f"reference=[{','.join(refs)}]"], "margin: expected a success difference"),
                      (["margin=0.05"], "margin: expected reference=.* runs to lead")):
        with pytest.raises(ConfigError, match=says):
            main(compose("bench_runs", [f"runs=[{','.join(runs)}]", *bad, f"report_dir={tmp_path}"]))
    # a reference of another training seed, or on other episodes, is refused by name
    with pytest.raises(ConfigError, match="training seed 11"):
        main(compose("bench_runs", [f"runs=[{','.join(runs)}]", f"reference=[{refs[1]},{refs[0]}]",
                                    f"report_dir={tmp_path}"]))
    other = _run(tmp_path / "rc", 99, [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1])
    with pytest.raises(ConfigError, match="same test episodes"):
        main(compose("bench_runs", [f"runs=[{runs[0]}]", f"reference=[{other}]", f"report_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="one reference run per run"):
        main(compose("bench_runs", [f"runs=[{','.join(runs)}]", f"reference=[{refs[0]}]", f"report_dir={tmp_path}"]))
    # a reference whose base alone succeeded elsewhere ran another base, recorded or not: refused
    moved = _run(tmp_path / "rd", 5, [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0])
    (tmp_path / "rd" / "config.yaml").write_text("run:\n  seed: 10\n")
    with pytest.raises(ConfigError, match=r"base alone succeeded on other test episodes .*\(1 of 4 differ\)"):
        main(compose("bench_runs", [f"runs=[{runs[0]}]", f"reference=[{moved}]", f"report_dir={tmp_path}"]))


def test_runs_of_different_demonstrators_are_not_pooled(tmp_path):
    """Anchor data from the expert's own actions and from its bounded correction are two settings:
    pooling them is refused, naming each run's demonstrator."""
    runs = [_run(tmp_path / n, 5, [1, 0], [1, 0], [0, 0]) for n in ("a", "b")]
    (tmp_path / "a" / "config.yaml").write_text("run:\n  seed: 10\n  demonstrations: bounded\n")
    (tmp_path / "b" / "config.yaml").write_text("run:\n  seed: 11\n  demonstrations: expert\n")
    with pytest.raises(ConfigError, match="different demonstrators.*bounded.*expert"):
        main(compose("bench_runs", [f"runs=[{','.join(runs)}]", f"report_dir={tmp_path}"]))
    (tmp_path / "b" / "config.yaml").write_text("run:\n  seed: 11\n  demonstrations: bounded\n")
    assert main(compose("bench_runs", [f"runs=[{','.join(runs)}]", "name=ok", f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "ok.json").read_text())["demonstrations"] == "bounded"


def test_runs_of_different_budgets_or_curve_episodes_are_refused(tmp_path):
    a = _run(tmp_path / "a", 5, [1, 1], [1, 0], [0, 0])
    b = _run(tmp_path / "b", 5, [1, 0], [1, 0], [0, 0])
    (tmp_path / "a" / "config.yaml").write_text("run:\n  seed: 10\n  env_steps: 50000\n")
    (tmp_path / "b" / "config.yaml").write_text("run:\n  seed: 11\n  env_steps: 200000\n")
    with pytest.raises(ConfigError, match="different budgets.*50000.*200000"):
        main(compose("bench_runs", [f"runs=[{a},{b}]", f"report_dir={tmp_path}"]))
    (tmp_path / "b" / "config.yaml").write_text("run:\n  seed: 11\n  env_steps: 50000\n")
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    summary["curve_eval"] = {"split": "tune", "seed_base": 10000, "episodes": 100}
    (tmp_path / "b" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ConfigError, match="different tune episodes"):
        main(compose("bench_runs", [f"runs=[{a},{b}]", f"report_dir={tmp_path}"]))


def test_runs_on_different_bases_are_neither_pooled_nor_paired(tmp_path):
    """Each run records its base's digest; pooling or pairing across two bases is refused by name,
    and runs saved before the digest existed still pool (reported as not recorded)."""
    a, b, c = (_run(tmp_path / n, 5, [1, 0], [1, 0], [0, 0]) for n in ("a", "b", "c"))
    for d, seed, digest in ((a, 10, "86ed350fefad"), (b, 11, "86ed350fefad"), (c, 10, "280b12aa66b9")):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n")
        summary = json.loads((tmp_path / d / "summary.json").read_text())
        (tmp_path / d / "summary.json").write_text(json.dumps({**summary, "base_digest": digest}))
    assert main(compose("bench_runs", [f"runs=[{a},{b}]", "name=one", f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "one.json").read_text())["base_digests"] == ["86ed350fefad"] * 2
    assert "; base `86ed350fefad`." in (tmp_path / "one.md").read_text()
    with pytest.raises(ConfigError, match="^runs: the runs finetuned different bases.*280b12aa66b9"):
        main(compose("bench_runs", [f"runs=[{b},{c}]", f"report_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="^reference: the runs finetuned different bases"):
        main(compose("bench_runs", [f"runs=[{a}]", f"reference=[{c}]", f"report_dir={tmp_path}"]))
    old = _run(tmp_path / "old", 5, [1, 1], [1, 0], [0, 0])
    (tmp_path / "old" / "config.yaml").write_text("run:\n  seed: 11\n")
    assert main(compose("bench_runs", [f"runs=[{a},{old}]", "name=mixed", f"report_dir={tmp_path}"])) == 0
    assert f"base `86ed350fefad` (not recorded by {old})." in (tmp_path / "mixed.md").read_text()
    assert json.loads((tmp_path / "mixed.json").read_text())["base_digests"] == ["86ed350fefad", None]


def test_a_control_is_named_in_its_report_and_never_pooled_with_the_method(tmp_path):
    """A run whose config says awr_weights=uniform (or q_weight=0) is the named control: its report
    says so, a pairing names the reference's control, and mixing it with the method is refused."""
    ctl = [_run(tmp_path / f"u{i}", 5, [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]) for i in range(2)]
    own = [_run(tmp_path / f"a{i}", 5, [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]) for i in range(2)]
    for d, seed in zip(ctl, (10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n  learner:\n    awr_weights: uniform\n")
    for d, seed in zip(own, (10, 11)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n  learner:\n    awr_weights: advantage\n")
    assert main(compose("bench_runs", [f"runs=[{','.join(ctl)}]", "name=c", f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "c.json").read_text())["control"] == "uniform_control"
    assert (tmp_path / "c.md").read_text().startswith("# c: `arli` (uniform_control) on")
    assert main(compose("bench_runs", [f"runs=[{','.join(own)}]", f"reference=[{','.join(ctl)}]", "name=v",
                                       f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "v.json").read_text())["control"] is None
    assert f"`[{', '.join(ctl)}]` (uniform_control)" in (tmp_path / "v.md").read_text()
    with pytest.raises(ConfigError, match="mix learners.*uniform_control"):
        main(compose("bench_runs", [f"runs=[{own[0]},{ctl[1]}]", f"report_dir={tmp_path}"]))


def test_the_protocol_names_each_shortfall_at_its_edge():
    from arli.bench.common import protocol

    assert protocol(200, 3)["met"] and protocol(200, 3)["shortfalls"] == []
    assert protocol(199, 3)["shortfalls"] == ["199 test episodes (reported numbers need >= 200)"]
    assert protocol(200, 2)["shortfalls"] == ["2 training seeds (reported cells need >= 3)"]
    assert protocol(50, 1) == {"met": False, "test_episodes": 50, "training_seeds": 1,
                               "required": {"test_episodes": 200, "training_seeds": 3},
                               "shortfalls": ["50 test episodes (reported numbers need >= 200)",
                                              "1 training seed (reported cells need >= 3)"]}


def test_a_training_seed_or_a_directory_given_twice_is_refused(tmp_path):
    """Two runs of one training seed would count as two seeds in the interval and the protocol."""
    a = _run(tmp_path / "a", 5, [1, 0] * 100, [0] * 200, [0] * 200)
    b = _run(tmp_path / "b", 5, [1, 1] * 100, [0] * 200, [0] * 200)
    c = _run(tmp_path / "c", 5, [0, 1] * 100, [0] * 200, [0] * 200)
    for d, seed in ((a, 10), (b, 11), (c, 10)):
        (tmp_path / d / "config.yaml").write_text(f"run:\n  seed: {seed}\n")
    with pytest.raises(ConfigError, match=r"training seed \[10\] appear more than once .*a: seed 10, .*c: seed 10"):
        main(compose("bench_runs", [f"runs=[{a},{b},{c}]", f"report_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="each run directory once"):
        compose("bench_runs", [f"runs=[{a},{b},{a}/]", f"report_dir={tmp_path}"])
    (tmp_path / c / "config.yaml").write_text("run:\n  seed: 12\n")
    assert main(compose("bench_runs", [f"runs=[{a},{b},{c}]", "name=three", f"report_dir={tmp_path}"])) == 0
    assert json.loads((tmp_path / "three.json").read_text())["protocol"]["met"] is True
