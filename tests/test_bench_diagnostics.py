"""``arli bench diagnostics``: finished runs' learner statistics and speed, per run and group."""

import json

import pytest

from arli.bench.diagnostics import main
from arli.cli import compose
from arli.config import ConfigError


def _run(path, seed, ess=None, learner=None, budget=200000, variant="arli", wall=100.0, times=None):
    """A finished run's summary.json and config.yaml, as `arli finetune` writes them."""
    path.mkdir(parents=True)
    diagnostics = {"critic_loss": 0.001, **({"awr_weight_ess": ess} if ess is not None else {})}
    (path / "summary.json").write_text(json.dumps({
        "env": "peg_insert", "variant": variant, "regime": "rl", "delay_steps": 8, "base_digest": "abc",
        "env_steps": budget + 7, "finetuned_success": 0.9, "learner_diagnostics": diagnostics,
        "env_steps_per_s": budget / wall, "updates_per_s": budget / wall, "wall_s": wall, "torch_threads": 1,
        "train_time_s": times or {"physics": 30.0, "learner_updates": 60.0, "evaluation": 10.0}}))
    # JSON is YAML: the run's saved settings as config.yaml
    (path / "config.yaml").write_text(json.dumps({"run": {"seed": seed, "env_steps": budget,
                                                          "learner": learner or {}}}))
    return path


def test_runs_are_grouped_by_their_learner_and_each_key_spread_over_the_group(tmp_path):
    """Default runs pool into one group with their ESS quantiles; a named control and a run with
    another exploration setting are groups of their own; a run that did not record the key
    counts as not recorded, not as a value."""
    _run(tmp_path / "runs" / "a", 10, ess=0.4)
    _run(tmp_path / "runs" / "b", 11, ess=0.8)
    _run(tmp_path / "runs" / "c", 12, ess=0.9)
    _run(tmp_path / "runs" / "u", 10, learner={"awr_weights": "uniform"})
    _run(tmp_path / "runs" / "x", 10, ess=0.6, learner={"exploration_std": 0.3})
    _run(tmp_path / "runs" / "short", 10, ess=0.7, budget=50000)
    out = tmp_path / "out"
    cfg = compose("bench_diagnostics", [f"runs=[{tmp_path}/runs/**/summary.json]", "name=d", f"report_dir={out}"])
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
    row = next(r for r in report["runs"] if r["run"].endswith("/a"))
    assert row["seed"] == 10 and row["budget"] == 200000
    assert row["time_share"] == pytest.approx({"physics": 0.3, "learner_updates": 0.6, "evaluation": 0.1})
    md = (out / "d.md").read_text()
    assert "| variant=arli, learner=default, budget=200000 | 3 | 3 | 0.4 | 0.6 | 0.8 | 0.85 | 0.9 |" in md
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
    ("runs=[]", "no runs given"),
])
def test_bad_input_names_the_field(tmp_path, override, field):
    (tmp_path / "empty").mkdir()
    _run(tmp_path / "a", 10, ess=0.4)
    overrides = [f"runs=[{tmp_path}/a]", "name=bad", f"report_dir={tmp_path / 'out'}",
                 override.format(tmp=tmp_path)]
    with pytest.raises(ConfigError, match=field):
        main(compose("bench_diagnostics", overrides))
    assert not (tmp_path / "out" / "bad.json").exists()
