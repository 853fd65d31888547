"""``arli bench diagnostics``: finished runs' learner statistics and speed, per run and group."""

import json
from dataclasses import asdict

import pytest

from arli.bench.diagnostics import main, run_row
from arli.cli import compose
from arli.config import DIAGNOSTICS_GROUP_FIELDS, ConfigError
from arli.rl.config import LearnerConfig

KEYS = "keys=[awr_weight_ess,critic_loss]"


def _run(path, seed, ess=None, learner=None, budget=200000, variant="arli", wall=100.0, times=None,
         without=()):
    """A finished run's summary.json and config.yaml, as `arli finetune` writes them."""
    path.mkdir(parents=True)
    diagnostics = {"critic_loss": 0.001, **({"awr_weight_ess": ess} if ess is not None else {})}
    (path / "summary.json").write_text(json.dumps({
        "env": "peg_insert", "variant": variant, "regime": "rl", "delay_steps": 8, "base_digest": "abc",
        "env_steps": budget + 7, "finetuned_success": 0.9, "learner_diagnostics": diagnostics,
        "env_steps_per_s": budget / wall, "updates_per_s": budget / wall, "wall_s": wall, "torch_threads": 1,
        "train_time_s": times or {"physics": 30.0, "learner_updates": 60.0, "evaluation": 10.0},
        "machine": {"cpus": 2, "load_avg": [2.5, 2.25, 2.125]}}))
    # JSON is YAML: the run's saved settings as config.yaml (every learner key, as runs save
    # them, less ``without``: keys a run saved before they existed lacks)
    saved = {k: v for k, v in {**asdict(LearnerConfig()), **(learner or {})}.items() if k not in without}
    (path / "config.yaml").write_text(json.dumps({"run": {"seed": seed, "env_steps": budget, "learner": saved}}))
    return path


def test_runs_are_grouped_by_their_learner_and_each_key_spread_over_the_group(tmp_path):
    """Default runs pool into one group with their ESS quantiles; a named control and a run with
    another exploration setting are groups of their own; a run that did not record the key
    counts as not recorded, not as a value."""
    _run(tmp_path / "runs" / "a", 10, ess=0.4)
    _run(tmp_path / "runs" / "b", 11, ess=0.8)
    _run(tmp_path / "runs" / "c", 12, ess=0.9, times={"physics": 10.0, "learner_updates": 80.0, "evaluation": 10.0})
    _run(tmp_path / "runs" / "u", 10, learner={"awr_weights": "uniform"})
    _run(tmp_path / "runs" / "x", 10, ess=0.6, learner={"exploration_std": 0.3})
    _run(tmp_path / "runs" / "short", 10, ess=0.7, budget=50000)
    out = tmp_path / "out"
    cfg = compose("bench_diagnostics", [f"runs=[{tmp_path}/runs/**/summary.json]", KEYS, "name=d", f"report_dir={out}"])
    assert main(cfg) == 0
    report = json.loads((out / "d.json").read_text())
    assert len(report["runs"]) == 6
    groups = {(g["group"]["learner"], g["group"]["budget"]): g for g in report["groups"]}
    assert set(groups) == {("default", 200000), ("default", 50000), ("uniform_control", 200000),
                           ("exploration_std=0.3", 200000)}
    ess = groups[("default", 200000)]["diagnostics"]["awr_weight_ess"]
    assert ess["n"] == 3 and ess["min"] == pytest.approx(0.4) and ess["median"] == pytest.approx(0.8)
    assert ess["max"] == pytest.approx(0.9) and ess["p25"] == pytest.approx(0.6)
    assert groups[("uniform_control", 200000)]["diagnostics"]["awr_weight_ess"] == {"n": 0}
    assert groups[("default", 200000)]["wall_s"]["median"] == pytest.approx(100.0)
    assert groups[("default", 200000)]["time_share"]["learner_updates"]["median"] == pytest.approx(0.6)
    row = next(r for r in report["runs"] if r["run"].endswith("/a"))
    assert row["seed"] == 10 and row["budget"] == 200000 and row["load_15m"] == 2.125
    assert row["time_share"] == pytest.approx({"physics": 0.3, "learner_updates": 0.6, "evaluation": 0.1})
    md = (out / "d.md").read_text()
    assert "| G2 | variant=arli, learner=default, budget=200000 | 3 | 3 | 0.4 | 0.6 | 0.8 | 0.85 | 0.9 |" in md
    assert [g["id"] for g in report["groups"]] == ["G1", "G2", "G3", "G4"]
    assert report["groups"][0]["group"]["budget"] == 50000  # budgets sorted as numbers
    assert (out / "d.png").stat().st_size > 0


def test_group_by_chooses_what_pools_runs(tmp_path):
    """Grouped by variant alone, runs of every learner and budget of one variant pool."""
    _run(tmp_path / "a", 10, ess=0.4)
    _run(tmp_path / "b", 11, ess=0.8, budget=50000)
    _run(tmp_path / "s", 10, ess=0.2, variant="standard")
    cfg = compose("bench_diagnostics", [f"runs=[{tmp_path}/a,{tmp_path}/b,{tmp_path}/s]", "group_by=[variant]",
                                        "keys=[awr_weight_ess]", "name=v", f"report_dir={tmp_path / 'out'}"])
    assert main(cfg) == 0
    report = json.loads((tmp_path / "out" / "v.json").read_text())
    spread = {g["group"]["variant"]: g["diagnostics"]["awr_weight_ess"] for g in report["groups"]}
    assert spread["arli"]["n"] == 2 and spread["arli"]["median"] == pytest.approx(0.6)
    assert spread["standard"]["n"] == 1 and spread["standard"]["max"] == pytest.approx(0.2)


@pytest.mark.parametrize("override, field", [
    ("runs=[{tmp}/nothing/**/summary.json]", "the pattern"),
    ("runs=[{tmp}/empty]", "has no summary.json"),
    ("group_by=[seedling]", "group_by"),
    ("keys=[]", "keys"),
    ("name=a/b", "name"),
    ("runs=[]", "no runs given"),
])
def test_bad_input_names_the_field(tmp_path, override, field):
    (tmp_path / "empty").mkdir()
    _run(tmp_path / "a", 10, ess=0.4)
    overrides = [f"runs=[{tmp_path}/a]", "name=bad", f"report_dir={tmp_path / 'out'}", KEYS,
                 override.format(tmp=tmp_path)]
    with pytest.raises(ConfigError, match=field):
        main(compose("bench_diagnostics", overrides))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("learner, without, label", [
    ({}, ("anchor_decay_updates",), "anchor_decay_updates=0"),
    ({"q_weight": 0.0, "anchor_decay_updates": 0}, (), "bc_control anchor_decay_updates=0"),
    ({"awr_weights": "uniform"}, (), "uniform_control"),
    ({"exploration_std": 0.3, "exploration_differenced": True}, (),
     "exploration_std=0.3 exploration_differenced=true"),
])
def test_the_learner_label_names_what_differs_from_todays_default(tmp_path, learner, without, label):
    """Keys a run saved before they existed count as what such runs ran with, not as today's
    default; a named control keeps its other differing settings."""
    run = _run(tmp_path / "r", 10, ess=0.5, learner=learner, without=without)
    summary = json.loads((run / "summary.json").read_text())
    row = run_row(str(run), summary, ["awr_weight_ess"])
    assert row["learner"] == label
    assert set(DIAGNOSTICS_GROUP_FIELDS) <= set(row)


def test_a_run_named_twice_counts_once_and_a_run_without_config_is_unknown(tmp_path, monkeypatch):
    """A directory, its summary.json, a glob and an absolute path to one run are one run; a run
    without config.yaml has no seed, budget or known learner."""
    _run(tmp_path / "runs" / "a", 10, ess=0.4)
    bare = _run(tmp_path / "runs" / "bare", 11, ess=0.6)
    (bare / "config.yaml").unlink()
    monkeypatch.chdir(tmp_path)
    cfg = compose("bench_diagnostics", ["runs=[runs/a,./runs/a/,runs/a/summary.json,runs/*,"
                                        f"{tmp_path}/runs/a]", KEYS, "name=t", "report_dir=out"])
    assert main(cfg) == 0
    rows = json.loads((tmp_path / "out" / "t.json").read_text())["runs"]
    assert [r["run"] for r in rows] == ["runs/a", "runs/bare"]
    assert rows[1]["learner"] == "unknown (no config.yaml)" and rows[1]["seed"] is None and rows[1]["budget"] is None


def test_a_key_no_run_recorded_is_refused_naming_what_they_record(tmp_path):
    """A mistyped key would make an empty report: it is refused, listing the recorded keys."""
    _run(tmp_path / "a", 10, ess=0.4)
    cfg = compose("bench_diagnostics", [f"runs=[{tmp_path}/a]", "keys=[awr_weight_es]", "name=t",
                                        f"report_dir={tmp_path / 'out'}"])
    with pytest.raises(ConfigError, match=r"keys: \['awr_weight_es'\] recorded by none.*awr_weight_ess"):
        main(cfg)
    assert not (tmp_path / "out").exists()


def test_curves_show_the_critics_bias_along_each_run(tmp_path):
    """curves=true: each run's tune curve with Q - return per point from its history (None where a
    point recorded no finite Q, e.g. no residual step), the gate's choices as shares where counted,
    a row per point in the Markdown and a plot; without the option the report has none of it."""
    run = _run(tmp_path / "a", 10, ess=0.4)
    summary = json.loads((run / "summary.json").read_text())
    summary["history"] = [
        {"env_steps": 0, "updates": 0, "success": 0.7, "q_eval": 0.25, "return_eval": 0.4},
        {"env_steps": 2000, "updates": 2000, "success": 0.0, "q_eval": 0.35, "return_eval": 0.0,
         "gate_picks": {"pi": 10, "base": 30, "perturbed": 60}},
        {"env_steps": 4000, "updates": 4000, "success": 0.5, "q_eval": float("nan"), "return_eval": 0.2}]
    (run / "summary.json").write_text(json.dumps(summary))
    cfg = compose("bench_diagnostics", [f"runs=[{run}]", KEYS, "curves=true", "name=c",
                                        f"report_dir={tmp_path / 'out'}"])
    assert main(cfg) == 0
    (row,) = json.loads((tmp_path / "out" / "c.json").read_text())["runs"]
    assert [p["bias"] for p in row["curve"]] == [pytest.approx(-0.15), pytest.approx(0.35), None]
    assert row["curve"][1]["gate_picks"] == {"pi": 10, "base": 30, "perturbed": 60}
    md = (tmp_path / "out" / "c.md").read_text()
    assert "| 2000 | 2000 | 0.00 | 0.350 | 0.000 | +0.350 | 0.10 / 0.30 / 0.60 |" in md
    assert "| 4000 | 4000 | 0.50 | — | — | — | — |" in md and "curves=true name=c" in md
    assert (tmp_path / "out" / "c_curves.png").stat().st_size > 0
    assert main(compose("bench_diagnostics", [f"runs=[{run}]", KEYS, "name=n", f"report_dir={tmp_path / 'out'}"])) == 0
    assert "curve" not in json.loads((tmp_path / "out" / "n.json").read_text())["runs"][0]
    assert not (tmp_path / "out" / "n_curves.png").exists()
