"""``arli bench tune``: a setting chosen on the tune seeds, by code: the reference is kept unless a
run's paired gain over it is resolved above 0; runs evaluated differently are refused."""

import json
import os

import numpy as np
import pytest
from omegaconf import OmegaConf

from arli.bench.tune import choose, main, run_rows, settings_diff
from arli.cli import compose
from arli.cli import main as cli_main
from arli.config import ConfigError

N = 40
REF = [1] * 20 + [0] * 20  # 0.50
BETTER = [1] * 20 + [1] * 12 + [0] * 8  # the reference's successes and 12 more: gain +0.30, resolved
SOMEWHAT = [1] * 20 + [1] * 6 + [0] * 14  # gain +0.15 (6 episodes up, none down): resolved
NOISY = [0] * 4 + [1] * 16 + [1] * 8 + [0] * 12  # 0.60, but 8 up and 4 down: gain +0.10, CI includes 0
BASE = [1] * 10 + [0] * 30


def _fake_run(path, *overrides, steps=100, wall=12.5, checkpoint=True, learner=None):
    """A finished run's directory as `arli finetune` leaves it (config.yaml, summary.json,
    checkpoint/), with nothing trained: the evaluation is injected."""
    cfg = compose("finetune", ["env=pick_cube", "checkpoint=expert", "delay_steps=4", *overrides])
    path.mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), path / "config.yaml")
    summary = {"env_steps": steps, "wall_s": wall}
    if learner is not None:
        summary["train_time_s"] = {"learner_updates": learner, "physics": 1.0}
    (path / "summary.json").write_text(json.dumps(summary))
    if checkpoint:
        (path / "checkpoint").mkdir()
        (path / "checkpoint" / "trainer_state.pt").write_bytes(b"")
    return str(path)


class FakeEval:
    """Hand-made per-episode outcomes per run directory; records what was asked."""

    def __init__(self, finals, base=BASE, awr=None):
        self.finals, self.base, self.awr, self.calls = finals, base, awr or {}, []

    def __call__(self, run_dir, run_cfg, seed_base, episodes, with_base):
        self.calls.append((os.path.basename(run_dir), seed_base, episodes, with_base))
        return {"final": self.finals[os.path.basename(run_dir)][:episodes], "env_steps": 100,
                "base": self.base[:episodes] if with_base else None, "env": "pick_cube",
                "delay_steps": run_cfg.delay_steps, "split": "tune",
                "awr": self.awr.get(os.path.basename(run_dir))}


def _never(*args):
    raise AssertionError("nothing may be evaluated before the runs are checked")


def _rows(*finals):
    labels = [f"r{i}" for i in range(len(finals))]
    return run_rows(labels, [[]] * len(finals), list(finals), BASE, [100] * len(finals), [1.0] * len(finals))


def test_the_choice_keeps_the_reference_unless_a_gain_over_it_is_resolved_above_0():
    rows = _rows(REF, NOISY)
    assert rows[1]["success"] > rows[0]["success"]  # higher on the tune seeds, but not resolved
    lo, hi = rows[1]["gain_vs_reference"]["ci95"]
    assert lo <= 0 < hi and rows[1]["gain_vs_reference"]["verdict"] == "unresolved"
    kept = choose(rows, N)
    assert kept["chosen"] == "r0" and "reference is kept" in kept["why"] and "r1" in kept["why"]
    # a run whose gain's interval excludes 0 is chosen
    rows = _rows(REF, NOISY, BETTER)
    assert rows[2]["gain_vs_reference"]["ci95"][0] > 0 and rows[2]["gain_vs_reference"]["mean"] == pytest.approx(0.3)
    assert choose(rows, N)["chosen"] == "r2"
    # of two resolved runs, the higher tune success wins, not the earlier one
    rows = _rows(REF, SOMEWHAT, BETTER)
    assert rows[1]["gain_vs_reference"]["verdict"] == "above" == rows[2]["gain_vs_reference"]["verdict"]
    assert choose(rows, N)["chosen"] == "r2"
    assert choose(_rows(REF, SOMEWHAT), N)["chosen"] == "r1"
    # a run resolved below the reference is never chosen
    assert choose(_rows(BETTER, REF), N)["chosen"] == "r0"


def test_the_settings_that_differ_are_listed_as_hydra_overrides(tmp_path):
    from arli.bench.tune import config_dict
    from arli.runs import load_run_config

    a = _fake_run(tmp_path / "a")
    b = _fake_run(tmp_path / "b", "run.seed=1", "run.learner.actor_lr=1e-5", "run.learner.anchor_weight=0.5",
                  "run.variant=standard")
    ref, other = (config_dict(load_run_config(d)) for d in (a, b))
    assert settings_diff(ref, ref) == []
    diff = settings_diff(ref, other)
    assert set(diff) == {"run.seed=1", "run.learner.actor_lr=1e-05", "run.learner.anchor_weight=0.5",
                         "run.variant=standard"}
    # each one is an override that composes back to the run's setting
    again = compose("finetune", ["env=pick_cube", "checkpoint=expert", "delay_steps=4", *diff])
    assert again.run == load_run_config(b).run
    # keys one side lacks: + and ~, as Hydra writes them; lists and null as Hydra reads them
    assert settings_diff({"run": {"a": 1}}, {"run": {"b": [1, 2], "c": None}}) == ["+run.b=[1,2]", "+run.c=null",
                                                                                  "~run.a"]


def test_bench_tune_reports_every_run_on_the_tune_seeds_and_the_choice(tmp_path):
    ref = _fake_run(tmp_path / "default")
    noisy = _fake_run(tmp_path / "noisy", "run.learner.actor_lr=1e-5", wall=20.0)
    better = _fake_run(tmp_path / "better", "run.learner.anchor_weight=0.5", "run.seed=1", steps=100)
    spread = {"awr_weight_ess": 0.765, "awr_weight_clipped": 0.0, "advantage_std": 0.0076,
              "advantage_abs_p50": 0.0016, "advantage_head_std": 0.0251, "advantage_snr": 0.3}
    fake = FakeEval({"default": REF, "noisy": NOISY, "better": BETTER}, awr={"default": spread})
    cfg = compose("bench_tune", [f"runs=[{ref},{noisy},{better}]", "name=t", f"episodes={N}",
                                 f"report_dir={tmp_path / 'reports'}"])
    assert main(cfg, evaluate=fake) == 0
    # each run once on the tune seeds run.tune_seed .., the base alone once (with the reference)
    assert fake.calls == [("default", 10_000, N, True), ("noisy", 10_000, N, False), ("better", 10_000, N, False)]
    report = json.loads((tmp_path / "reports" / "t.json").read_text())
    assert report["env"] == "pick_cube" and report["delay_steps"] == 4
    assert report["eval"] == {"split": "tune", "seed_base": 10_000, "episodes": N}
    assert report["base"]["success"] == 0.25 and report["base"]["ci95"][0] < 0.25 < report["base"]["ci95"][1]
    assert {"cpus", "python"} <= set(report["machine"])
    runs = {r["label"]: r for r in report["runs"]}
    assert [r["label"] for r in report["runs"]] == ["default", "noisy", "better"]
    assert runs["default"]["overrides"] == [] and runs["noisy"]["overrides"] == ["run.learner.actor_lr=1e-05"]
    assert set(runs["better"]["overrides"]) == {"run.seed=1", "run.learner.anchor_weight=0.5"}
    assert runs["noisy"]["wall_s"] == 20.0 and runs["better"]["env_steps"] == 100
    assert runs["better"]["success"] == 0.8 and runs["better"]["gain_vs_reference"]["verdict"] == "above"
    assert runs["better"]["gain_vs_base"]["mean"] == pytest.approx(0.55)
    assert runs["default"]["gain_vs_reference"]["mean"] == 0 and runs["default"]["gain_vs_reference"]["ci95"] == [0, 0]
    assert set(runs["noisy"]) >= {"label", "overrides", "env_steps", "wall_s", "success", "ci95",
                                  "gain_vs_reference", "gain_vs_base"}
    assert set(runs["noisy"]["gain_vs_base"]) == {"mean", "ci95", "verdict"}
    assert report["chosen"]["chosen"] == "better" and set(report["chosen"]) == {"chosen", "why"}
    md = (tmp_path / "reports" / "t.md").read_text()
    assert f"arli bench tune 'runs=[{ref},{noisy},{better}]' name=t" in md
    assert "(not over training seeds), gains paired on the episodes. The reference is" in md
    assert "not for reporting" in md and "**Chosen: `better`.**" in md and "`run.learner.actor_lr=1e-05`" in md
    # what each critic steers, for the runs that measured it (an AWR run with a Q advantage)
    assert runs["default"]["awr"] == spread and runs["noisy"]["awr"] is None
    assert "| `default` | 0.765 | 0.000 | 0.0076 | 0.0016 | 0.0251 | 0.30 |" in md and "| `noisy` | 0." not in md
    assert (tmp_path / "reports" / "t.png").stat().st_size > 1000
    # without the better run, the reference is kept although `noisy` is higher on the tune seeds
    cfg = compose("bench_tune", [f"runs=[{ref},{noisy}]", "name=u", f"episodes={N}", f"report_dir={tmp_path}"])
    assert main(cfg, evaluate=FakeEval({"default": REF, "noisy": NOISY})) == 0
    assert json.loads((tmp_path / "u.json").read_text())["chosen"]["chosen"] == "default"


@pytest.mark.parametrize("overrides,field", [
    (["delay_steps=8"], "delay_steps"),
    (["env=peg_insert"], "env.name"),
    (["env.max_episode_steps=50"], "env.max_episode_steps"),
    (["run.tune_seed=20000"], "run.tune_seed"),
    (["chunking.strategy=rtc"], "chunking.strategy"),
])
def test_runs_evaluated_differently_are_refused_naming_the_field(tmp_path, overrides, field):
    ref = _fake_run(tmp_path / "ref")
    other = _fake_run(tmp_path / "other", *overrides)
    cfg = compose("bench_tune", [f"runs=[{ref},{other}]", f"report_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"runs: .*other differs .* in {field.replace('.', r'[.]')} .*pass runs with "
                                          rf"{field.replace('.', r'[.]')}="):
        main(cfg, evaluate=_never)
    assert not (tmp_path / "tune.json").exists()


def test_a_latency_model_that_does_not_decide_the_delay_is_not_a_difference(tmp_path):
    ref = _fake_run(tmp_path / "ref")
    other = _fake_run(tmp_path / "other", "latency=lognormal")  # delay_steps=4 fixes the delay on both
    # not refused as evaluated differently: the same setting, so on the same seed it is the same run
    with pytest.raises(ConfigError, match=r"runs: .*ref and .*other are one setting on one training seed"):
        main(compose("bench_tune", [f"runs=[{ref},{other}]", f"episodes={N}", f"report_dir={tmp_path}"]),
             evaluate=_never)
    lr = _fake_run(tmp_path / "lr", "latency=lognormal", "run.learner.actor_lr=1e-5")
    cfg = compose("bench_tune", [f"runs=[{ref},{lr}]", "name=l", f"episodes={N}", f"report_dir={tmp_path}"])
    assert main(cfg, evaluate=FakeEval({"ref": REF, "lr": REF})) == 0
    assert json.loads((tmp_path / "l.json").read_text())["runs"][1]["overrides"] == ["run.learner.actor_lr=1e-05"]


def test_runs_without_a_checkpoint_or_unfinished_and_test_seeds_are_refused(tmp_path, capsys):
    ref = _fake_run(tmp_path / "ref")
    bare = _fake_run(tmp_path / "bare", checkpoint=False)
    with pytest.raises(ConfigError, match=r"runs: .*bare has no checkpoint"):
        main(compose("bench_tune", [f"runs=[{ref},{bare}]", f"report_dir={tmp_path}"]), evaluate=_never)
    running = _fake_run(tmp_path / "running")
    os.remove(os.path.join(running, "summary.json"))
    with pytest.raises(ConfigError, match=r"runs: .*running has no summary.json"):
        main(compose("bench_tune", [f"runs=[{ref},{running}]", f"report_dir={tmp_path}"]), evaluate=_never)
    with pytest.raises(ConfigError, match=r"runs: .*missing config.yaml"):
        main(compose("bench_tune", [f"runs=[{ref},{tmp_path}]", f"report_dir={tmp_path}"]), evaluate=_never)
    # 100 episodes from the tune seed 10000 would reach test seeds from 10050: refused, never evaluated
    near = [_fake_run(tmp_path / f"near{i}", "run.test_seed=10050", "run.guard_episodes=30") for i in range(2)]
    with pytest.raises(ConfigError, match=r"episodes: .*reach the test seeds .*pass episodes<=50"):
        main(compose("bench_tune", [f"runs=[{near[0]},{near[1]}]", "episodes=100", f"report_dir={tmp_path}"]),
             evaluate=_never)
    # one run is no choice; through the CLI: one line, exit 2
    assert cli_main(["bench", "tune", f"runs=[{ref}]", f"report_dir={tmp_path}"]) == 2
    assert "runs: expected two or more" in capsys.readouterr().err
    assert cli_main(["bench", "tune", "name=a/b"]) == 2 and "name" in capsys.readouterr().err
    assert cli_main(["bench", "tune", "outcomes_from=[reports/tune.md]"]) == 2
    assert "outcomes_from" in capsys.readouterr().err


def _tiny_real_run(path, *overrides, push: float | None = None, episode_steps: int = 30):
    """A real finished run with no online step: anchor-pretrained residual, saved as `arli
    finetune` saves it (the cheapest run whose checkpoint loads and evaluates). ``push``: the
    actor's last bias set to it, a residual far from 0 that acts unlike the base."""
    from arli.runs import make_finetuner

    cfg = compose("finetune", ["env=pick_cube", "checkpoint=expert", "delay_steps=4", f"env.max_episode_steps={episode_steps}",
                               "run.anchor_episodes=1", "run.eval_episodes=2", "run.guard_episodes=2", "run.learner.pretrain_updates=5",
                               "run.learner.hidden=16", "run.learner.critic_hidden=16", "run.learner.batch_size=16",
                               "run.learner.critic_heads=2", f"output_dir={path}", *overrides])
    ft, _, _ = make_finetuner(cfg)
    ft.prepare()
    if push is not None:
        import torch

        with torch.no_grad():
            ft.learner.actor.net[5].bias.fill_(push)
    os.makedirs(path)
    ft.save(os.path.join(path, "checkpoint"))
    OmegaConf.save(OmegaConf.structured(cfg), os.path.join(path, "config.yaml"))
    with open(os.path.join(path, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump({"env_steps": ft.env_steps, "wall_s": 1.0}, fh)
    return str(path), cfg


@pytest.mark.slow
def test_real_runs_are_loaded_as_arli_eval_loads_them_and_evaluated_on_tune_seeds(tmp_path):
    from arli.runs import load_run_config, make_finetuner

    ref, _ = _tiny_real_run(tmp_path / "ref")
    other, _ = _tiny_real_run(tmp_path / "other", "run.seed=1", "run.learner.pretrain_updates=10")
    cfg = compose("bench_tune", [f"runs=[{ref},{other}]", "name=real", "episodes=3", f"report_dir={tmp_path}"])
    assert main(cfg) == 0
    report = json.loads((tmp_path / "real.json").read_text())
    assert report["eval"] == {"split": "tune", "seed_base": 10_000, "episodes": 3}
    assert report["env"] == "pick_cube" and report["delay_steps"] == 4
    ref_row, other_row = report["runs"]
    assert other_row["overrides"] == ["run.seed=1", "run.learner.pretrain_updates=10"] and ref_row["overrides"] == []
    assert len(report["base"]["outcomes"]) == 3 and len(other_row["outcomes"]) == 3
    assert report["chosen"] == choose(report["runs"], 3)
    # the same numbers `arli eval run=<other> seed_base=10000 episodes=3` gets
    ft, _, _ = make_finetuner(load_run_config(other))
    ft.load(os.path.join(other, "checkpoint"))
    assert [int(x) for x in ft.evaluate(3, 10_000)["outcomes"]] == other_row["outcomes"]
    assert [int(x) for x in ft.evaluate(3, 10_000, residual=False)["outcomes"]] == report["base"]["outcomes"]
    np.testing.assert_allclose(report["base"]["success"], np.mean(report["base"]["outcomes"]))


@pytest.mark.slow
def test_workers_evaluate_each_run_in_its_own_process_as_one_thread_here_would(tmp_path, monkeypatch):
    """workers=2: the runs and the base alone are evaluated in worker processes, each row the outcomes
    of its own run; beside outcomes_from only the runs no report holds are evaluated."""
    import torch

    from arli.runs import load_run_config, make_finetuner

    long = 200  # episodes the expert base can finish
    ref, _ = _tiny_real_run(tmp_path / "ref", episode_steps=long)
    other, _ = _tiny_real_run(tmp_path / "other", "run.seed=1", "run.learner.pretrain_updates=10", push=3.0,
                              episode_steps=long)
    new, _ = _tiny_real_run(tmp_path / "new", "run.seed=2", "run.learner.pretrain_updates=20", push=-3.0,
                            episode_steps=long)
    cfg = compose("bench_tune", [f"runs=[{ref},{other}]", "name=par", "episodes=4", "workers=2",
                                 f"report_dir={tmp_path}"])
    assert main(cfg, evaluate=_never) == 0  # workers > 1 evaluates in its workers, never in this process
    report = json.loads((tmp_path / "par.json").read_text())
    # the pushed residual acts unlike the reference, so a row with another run's outcomes would show
    assert report["runs"][0]["outcomes"] != report["runs"][1]["outcomes"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for run_dir, row in zip((ref, other), report["runs"]):
            ft, _, _ = make_finetuner(load_run_config(run_dir))
            ft.load(os.path.join(run_dir, "checkpoint"))
            assert [int(x) for x in ft.evaluate(4, 10_000)["outcomes"]] == row["outcomes"]
        assert [int(x) for x in ft.evaluate(4, 10_000, residual=False)["outcomes"]] == report["base"]["outcomes"]
    finally:
        torch.set_num_threads(threads)
    assert report["workers"] == 2 and "workers=2" in report["command"]
    # a third run joins the two read from that report: only it is evaluated, the base beside it
    from arli.bench.tune import ParallelEvaluate

    submitted, start = [], ParallelEvaluate.start
    monkeypatch.setattr(ParallelEvaluate, "start", lambda self, runs, *a: (submitted.extend(d for d, _ in runs),
                                                                            start(self, runs, *a))[1])
    cfg = compose("bench_tune", [f"runs=[{ref},{other},{new}]", "name=joined", "episodes=4", "workers=2",
                                 f"outcomes_from=[{tmp_path / 'par.json'}]", f"report_dir={tmp_path}"])
    assert main(cfg, evaluate=_never) == 0
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert submitted == [new]
    assert [r.get("evaluated") for r in joined["runs"]] == [None, None, ["new"]]
    assert [r["outcomes"] for r in joined["runs"][:2]] == [r["outcomes"] for r in report["runs"]]
    # evaluated in this process (torch's default threads) beside a report made in workers: refused, nothing run
    cfg = compose("bench_tune", [f"runs=[{ref},{other},{new}]", "name=mixed", "episodes=4",
                                 f"outcomes_from=[{tmp_path / 'par.json'}]", f"report_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="evaluated in-process.*one torch thread per worker process; pass workers > 1"):
        main(cfg, evaluate=_never)


def test_reports_pool_across_one_evaluation_mode_only(tmp_path):
    """Any workers > 1 evaluates on one thread per process, workers=1 in-process: reports pool within a mode."""
    from arli.bench.tune import reported_outcomes

    def report(name, workers=None):
        payload = {"eval": {"split": "tune", "seed_base": 10_000, "episodes": 4}, "base": {"outcomes": [1, 0, 1, 0]},
                   "runs": [{"label": name, "outcomes": [1, 1, 0, 0]}], "env": "pick_cube", "delay_steps": 4}
        if workers is not None:
            payload["workers"] = workers
        (tmp_path / f"{name}.json").write_text(json.dumps(payload))
        return str(tmp_path / f"{name}.json")

    two, three, old, one = report("a", 2), report("b", 3), report("c"), report("d", 1)
    assert reported_outcomes([two, three], 10_000, 4).labels == {"a", "b"}
    assert reported_outcomes([old, one], 10_000, 4).labels == {"c", "d"}
    with pytest.raises(ConfigError, match="outcomes_from: .*c.json was evaluated in-process"):
        reported_outcomes([two, old], 10_000, 4)


@pytest.mark.parametrize("workers", [0, -1])
def test_bench_tune_refuses_fewer_than_one_worker(workers):
    with pytest.raises(ConfigError, match="workers"):
        compose("bench_tune", ["runs=[a,b]", f"workers={workers}"])


def test_awr_only_settings_are_not_listed_for_a_run_that_does_not_use_awr():
    from arli.bench.tune import settings_diff

    ref = {"run": {"learner": {"actor_update": "awr", "awr_advantage": "td", "actor_lr": 3e-5}}}
    dpg = {"run": {"learner": {"actor_update": "dpg", "awr_advantage": "q", "actor_lr": 1e-6}}}
    awr = {"run": {"learner": {"actor_update": "awr", "awr_advantage": "q", "actor_lr": 3e-5}}}
    assert settings_diff(ref, dpg) == ["run.learner.actor_update=dpg", "run.learner.actor_lr=1e-06"]
    assert settings_diff(ref, awr) == ["run.learner.awr_advantage=q"]


def test_runs_of_one_setting_on_several_training_seeds_are_pooled_and_paired_by_seed(tmp_path):
    """A setting better on one training seed of three is not chosen: the interval is over
    training seeds too (each run alone, seed 0's gain would be resolved). Runs pair by seed,
    not by the order given; keys that only evaluate a run (run.eval_every) split no setting."""
    ref = [_fake_run(tmp_path / f"ref{s}", f"run.seed={s}", f"run.eval_every={1000 * (s + 1)}") for s in (2, 0, 1)]
    lucky = [_fake_run(tmp_path / f"lucky{s}", f"run.seed={s}", "run.learner.anchor_weight=0.5", wall=10.0 + s)
             for s in (1, 2, 0)]
    worse = [1] * 15 + [0] * 25  # the reference on seed 1: 0.375
    finals = {"ref0": REF, "ref1": worse, "ref2": REF, "lucky0": BETTER, "lucky1": worse, "lucky2": REF}
    cfg = compose("bench_tune", [f"runs=[{','.join(ref + lucky)}]", "name=p", f"episodes={N}",
                                 f"report_dir={tmp_path / 'reports'}"])
    assert main(cfg, evaluate=FakeEval(finals)) == 0
    report = json.loads((tmp_path / "reports" / "p.json").read_text())
    reference, other = report["runs"]  # two settings, not six runs
    assert report["reference"] == reference["label"] == "ref0" and reference["runs"] == ["ref0", "ref1", "ref2"]
    assert reference["seeds"] == other["seeds"] == [0, 1, 2] and other["runs"] == ["lucky0", "lucky1", "lucky2"]
    assert other["overrides"] == ["run.learner.anchor_weight=0.5"] and reference["overrides"] == []
    assert other["per_seed"] == [0.8, 0.375, 0.5] and other["success"] == pytest.approx(1.675 / 3)
    assert other["outcomes_by_seed"]["1"] == "".join(map(str, worse)) and other["wall_s"] == 11.0
    g = other["gain_vs_reference"]  # paired by seed: +0.3, 0, 0 (by the order given it would not be)
    assert g["mean"] == pytest.approx(0.1) and g["ci95"][0] == pytest.approx(0) and g["verdict"] == "unresolved"
    assert report["chosen"]["chosen"] == "ref0" and "no setting's paired gain" in report["chosen"]["why"]
    # seed 0's run alone against the reference's seed-0 run: resolved, which is what pooling guards against
    alone = run_rows(["ref0", "lucky0"], [[], []], [REF, BETTER], BASE, [100, 100], [1.0, 1.0])
    assert alone[1]["gain_vs_reference"]["verdict"] == "above"
    md = (tmp_path / "reports" / "p.md").read_text()
    assert "each setting on 3 training seeds" in md and "`lucky1` seed 1: 0.375" in md and "wall s (mean)" in md
    assert "gains paired on seeds (in seed order) and episodes. The reference is `ref0`." in md
    # when every seed gains, the pooled gain is resolved and chosen
    finals.update(lucky1=SOMEWHAT, lucky2=BETTER)
    assert main(cfg, evaluate=FakeEval(finals)) == 0
    assert json.loads((tmp_path / "reports" / "p.json").read_text())["chosen"]["chosen"] == "lucky0"


def test_settings_on_other_seeds_a_seed_twice_or_one_setting_alone_are_refused_before_evaluating(tmp_path):
    ref = [_fake_run(tmp_path / f"ref{s}", f"run.seed={s}") for s in (0, 1)]
    one = _fake_run(tmp_path / "one", "run.learner.anchor_weight=0.5")
    with pytest.raises(ConfigError, match=r"runs: every setting needs the reference's training seeds .*ref0: seeds "
                                          r"\[0, 1\] \(the reference\); one: seeds \[0\] "
                                          r"\(run.learner.anchor_weight=0.5\)"):
        main(compose("bench_tune", [f"runs=[{ref[0]},{ref[1]},{one}]", f"report_dir={tmp_path}"]), evaluate=_never)
    other = [_fake_run(tmp_path / f"o{s}", f"run.seed={s}", "run.learner.anchor_weight=0.5") for s in (1, 2)]
    with pytest.raises(ConfigError, match=r"every setting needs the reference's training seeds .*o1: seeds \[1, 2\]"):
        main(compose("bench_tune", [f"runs=[{','.join(ref + other)}]", f"report_dir={tmp_path}"]), evaluate=_never)
    again = _fake_run(tmp_path / "again", "run.seed=1")
    with pytest.raises(ConfigError, match=r"runs: .*ref1 and .*again are one setting on one training seed "
                                          r"\(run.seed=1\)"):
        main(compose("bench_tune", [f"runs=[{ref[0]},{ref[1]},{again}]", f"report_dir={tmp_path}"]), evaluate=_never)
    with pytest.raises(ConfigError, match=r"runs: every run is one setting \(the reference's, on training seeds "
                                          r"\[0, 1\]\); pass runs of another setting"):
        main(compose("bench_tune", [f"runs=[{ref[0]},{ref[1]}]", f"report_dir={tmp_path}"]), evaluate=_never)


def test_single_seed_reports_pool_from_their_committed_json_as_evaluating_the_runs_again_would(tmp_path):
    """``outcomes_from``: runs judged in separate one-seed reports (committed without checkpoints)
    pool from those reports' outcomes, with the same rows as evaluating them together; reports
    on other episodes or another base, and a run in none of them, are refused."""
    runs = {f"{name}{s}": _fake_run(tmp_path / f"{name}{s}", f"run.seed={s}", *over)
            for s in (0, 1, 2) for name, over in (("ref", ()), ("alt", ("run.learner.anchor_weight=0.5",)))}
    finals = {"ref0": REF, "ref1": NOISY, "ref2": REF, "alt0": BETTER, "alt1": SOMEWHAT, "alt2": BETTER}
    for s in (0, 1, 2):  # one report per seed, as a session judging one seed at a time leaves them
        assert main(compose("bench_tune", [f"runs=[{runs[f'ref{s}']},{runs[f'alt{s}']}]", f"name=s{s}",
                                           f"episodes={N}", f"report_dir={tmp_path / 'r'}"]),
                    evaluate=FakeEval(finals)) == 0
    order = ",".join(runs[k] for k in ("ref0", "ref1", "ref2", "alt0", "alt1", "alt2"))
    assert main(compose("bench_tune", [f"runs=[{order}]", "name=together", f"episodes={N}",
                                       f"report_dir={tmp_path / 'r'}"]), evaluate=FakeEval(finals)) == 0
    for run in runs.values():  # as committed: config.yaml and summary.json only
        os.remove(os.path.join(run, "checkpoint", "trainer_state.pt"))
    reports = [str(tmp_path / "r" / f"s{s}.json") for s in (0, 1, 2)]
    pooled = compose("bench_tune", [f"runs=[{order}]", "name=pooled", f"episodes={N}",
                                    f"report_dir={tmp_path / 'r'}", f"outcomes_from=[{','.join(reports)}]"])
    assert main(pooled, evaluate=_never) == 0
    got, want = (json.loads((tmp_path / "r" / f"{n}.json").read_text()) for n in ("pooled", "together"))
    assert got["runs"] == want["runs"] and got["chosen"] == want["chosen"] and got["base"] == want["base"]
    assert got["chosen"]["chosen"] == "alt0" and got["outcomes_from"] == reports
    md = (tmp_path / "r" / "pooled.md").read_text()
    assert "'outcomes_from=[" in md and "not evaluated again" in md
    # without outcomes_from these runs (no checkpoint) cannot be judged
    with pytest.raises(ConfigError, match="runs: .*ref0 has no checkpoint"):
        main(compose("bench_tune", [f"runs=[{order}]", f"report_dir={tmp_path / 'r'}"]), evaluate=_never)
    # a report on other episodes
    with pytest.raises(ConfigError, match=rf"outcomes_from: .*s0.json holds {N} episodes from seed 10000, asked 20"):
        main(compose("bench_tune", [f"runs=[{order}]", "episodes=20", f"report_dir={tmp_path / 'r'}",
                                    f"outcomes_from=[{','.join(reports)}]"]), evaluate=_never)
    # a row of another run of the same name (another wall time), one run with other outcomes in two reports,
    # a pooled report, a file that is no report
    impostor = json.loads((tmp_path / "r" / "s1.json").read_text())
    impostor["runs"][1]["wall_s"] = 99.0
    (tmp_path / "r" / "impostor.json").write_text(json.dumps(impostor))
    with pytest.raises(ConfigError, match=r"outcomes_from: the row alt1 of .*impostor.json is not the run .*alt1 "
                                          r"\(wall s 99.0 there, 12.5 here\); pass the report that judged"):
        main(compose("bench_tune", [f"runs=[{order}]", f"episodes={N}", f"report_dir={tmp_path / 'r'}",
                                    f"outcomes_from=[{reports[0]},{tmp_path / 'r' / 'impostor.json'},{reports[2]}]"]),
             evaluate=_never)
    (tmp_path / "r" / "garbled.json").write_text("{not json")
    (tmp_path / "r" / "other.json").write_text(json.dumps({"eval": {}, "cells": []}))
    impostor["runs"][1]["wall_s"], impostor["runs"][1]["outcomes"] = 12.5, BETTER
    (tmp_path / "r" / "impostor.json").write_text(json.dumps(impostor))
    for bad, why in ((tmp_path / "r" / "impostor.json", r"alt1 has other outcomes in .*impostor.json than in .*s1"),
                     (tmp_path / "r" / "together.json", r".*together.json's row ref0 pools several training seeds"),
                     (tmp_path / "r" / "garbled.json", r"cannot read .*garbled.json"),
                     (tmp_path / "r" / "other.json", r".*other.json is not an `arli bench tune` report JSON"),
                     (tmp_path / "r" / "missing.json", r"cannot read .*missing.json")):
        with pytest.raises(ConfigError, match=f"outcomes_from: {why}"):
            main(compose("bench_tune", [f"runs=[{order}]", f"episodes={N}", f"report_dir={tmp_path / 'r'}",
                                        f"outcomes_from=[{','.join(reports[:2])},{bad}]"]), evaluate=_never)
    # two runs of one basename could take one row: refused
    (tmp_path / "x").mkdir()
    twin = _fake_run(tmp_path / "x" / "alt2", "run.seed=3", checkpoint=False)
    with pytest.raises(ConfigError, match=r"runs: with outcomes_from a run's row is found by its directory's "
                                          r"basename; two runs share one"):
        main(compose("bench_tune", [f"runs=[{order},{twin}]", f"episodes={N}", f"report_dir={tmp_path / 'r'}",
                                    f"outcomes_from=[{','.join(reports)}]"]), evaluate=_never)
    # a report of another base: its base-alone outcomes differ
    other = json.loads((tmp_path / "r" / "s2.json").read_text())
    other["base"]["outcomes"] = [1 - v for v in other["base"]["outcomes"]]
    (tmp_path / "r" / "s2.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match=r"outcomes_from: the base alone's outcomes in .*s2.json differ"):
        main(pooled, evaluate=_never)
    # a seed's report left out: its runs are in none of the reports given
    with pytest.raises(ConfigError, match=r"runs: .*ref2 has no row in outcomes_from \(their runs: alt0, alt1, "
                                          r"ref0, ref1\)"):
        main(compose("bench_tune", [f"runs=[{order}]", f"episodes={N}", f"report_dir={tmp_path / 'r'}",
                                    f"outcomes_from=[{','.join(reports[:2])}]"]), evaluate=_never)


def test_prefer_dip_through_the_bench_pools_each_settings_worst_run_and_reports_every_curve(tmp_path):
    """The bench end to end with ``prefer=dip``: a setting's dip is the worst of its runs'
    (read from each run's summary history), the report's table lists every run's dip and
    curve points, and the choice follows the pooled dips."""
    curves = {"ref0": [0.8, 0.0, 0.9], "ref1": [0.7, 0.6, 0.9], "held0": [0.8, 0.7, 0.9], "held1": [0.7, 0.5, 0.8]}
    runs = []
    for name, curve in curves.items():
        seed = int(name[-1])
        extra = ["run.learner.start_weight=10"] if name.startswith("held") else []
        run = _fake_run(tmp_path / name, f"run.seed={seed}", *extra)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        summary["history"] = [{"env_steps": 1000 * i, "success": v} for i, v in enumerate(curve)]
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
        runs.append(run)
    finals = {"ref0": REF, "ref1": REF, "held0": REF, "held1": NOISY}
    cfg = compose("bench_tune", [f"runs=[{','.join(runs)}]", "name=d", f"episodes={N}", "margin=-0.2",
                                 "prefer=dip", f"report_dir={tmp_path / 'reports'}"])
    assert main(cfg, evaluate=FakeEval(finals)) == 0
    report = json.loads((tmp_path / "reports" / "d.json").read_text())
    ref, held = report["runs"]
    assert ref["curve_dips"] == pytest.approx({"ref0": -0.8, "ref1": -0.1}) and ref["curve_dip"] == pytest.approx(-0.8)
    assert held["curve_dips"] == pytest.approx({"held0": -0.1, "held1": -0.2})
    assert held["curve_dip"] == pytest.approx(-0.2)
    assert held["curve_points"] == {"held0": 3, "held1": 3}
    assert report["chosen"]["chosen"] == "held0"
    md = (tmp_path / "reports" / "d.md").read_text()
    assert "| `ref0` | -0.80 | `ref0` -0.80 (3), `ref1` -0.10 (3) |" in md
    assert "| `held0` | -0.20 | `held0` -0.10 (3), `held1` -0.20 (3) |" in md
    assert "the shallowest worst tune-curve dip below the start" in md and "**Chosen: `held0`.**" in md
    # the worse run decides: held1 falling 0.9 -> 0.0 makes the setting dip deeper than the reference
    summary = json.loads((tmp_path / "held1" / "summary.json").read_text())
    summary["history"][0]["success"], summary["history"][1]["success"] = 0.9, 0.0
    (tmp_path / "held1" / "summary.json").write_text(json.dumps(summary))
    assert main(cfg, evaluate=FakeEval(finals)) == 0
    assert json.loads((tmp_path / "reports" / "d.json").read_text())["chosen"]["chosen"] == "ref0"


def test_prefer_dip_takes_the_setting_whose_curve_collapses_least_among_those_as_good():
    """``prefer=dip``: of the reference and the settings no more than -margin worse, the one whose
    tune curve falls least below its start while it learns (its worst run counts); a setting
    that dips less but is clearly worse does not qualify; a run without a curve is refused."""
    from arli.bench.tune import curve_dip

    curve = {"history": [{"success": 0.8}, {"success": 0.1}, {"success": 0.9}]}
    assert curve_dip(curve) == pytest.approx(-0.7) and curve_dip({"history": [{"success": 0.8}]}) is None
    # the lowest point *after* the start: a curve that only climbs has a positive "dip"
    assert curve_dip({"history": [{"success": 0.3}, {"success": 0.5}, {"success": 0.9}]}) == pytest.approx(0.2)
    rows = _rows(BETTER, BETTER, REF)  # r1 as good as the reference, r2 0.30 worse (resolved)
    for r, dip in zip(rows, (-0.7, -0.1, 0.0)):
        r["curve_dip"] = dip
    pick = choose(rows, N, margin=-0.1, prefer="dip")
    assert pick["chosen"] == "r1" and "r0 -0.70; r1 -0.10" in pick["why"] and "r2" not in pick["why"]
    rows[1]["curve_dip"] = -0.8  # dips deeper than the reference: the reference is kept
    assert "it is kept" in choose(rows, N, margin=-0.1, prefer="dip")["why"]
    rows[1]["curve_dip"] = None
    with pytest.raises(ConfigError, match="prefer: dip needs each run's tune curve .* missing for r1"):
        choose(rows, N, margin=-0.1, prefer="dip")


def test_a_non_inferiority_margin_with_prefer_cost_takes_the_cheapest_setting_as_good_as_the_reference(tmp_path):
    """``margin=-0.1 prefer=cost``: the cheapest of the reference and the settings whose paired gain's
    lower end is above -0.1; a cheaper setting clearly worse does not qualify, and where none is
    cheaper the reference is kept. ``margin=0 prefer=success`` is the plain rule."""
    rows = _rows(BETTER, BETTER, REF)  # r1 the same as the reference, r2 0.30 worse (resolved)
    for r, cost in zip(rows, (300.0, 200.0, 100.0)):
        r["learner_s"] = cost
    assert rows[2]["gain_vs_reference"]["ci95"][1] < 0 and rows[1]["gain_vs_reference"]["ci95"] == [0.0, 0.0]
    pick = choose(rows, N, margin=-0.1, prefer="cost")
    assert pick["chosen"] == "r1" and "200 s" in pick["why"] and "above -0.1" in pick["why"]
    assert choose(rows, N)["chosen"] == "r0"  # the plain rule: no gain above 0, the reference kept
    rows[1]["learner_s"] = 400.0  # no longer cheaper
    kept = choose(rows, N, margin=-0.1, prefer="cost")
    assert kept["chosen"] == "r0" and "it is kept" in kept["why"]
    rows[2]["learner_s"], rows[1]["learner_s"] = 1.0, None  # the worse one is cheapest but does not qualify
    with pytest.raises(ConfigError, match="prefer: cost needs each run's learner-update time .* missing for r1"):
        choose(rows, N, margin=-0.1, prefer="cost")
    rows[1]["learner_s"] = 50.0
    assert choose(rows, N, margin=-0.1, prefer="cost")["chosen"] == "r1"
    with pytest.raises(ConfigError, match="prefer: expected success, cost or dip"):
        compose("bench_tune", ["runs=[a,b]", "prefer=cheap"])
    with pytest.raises(ConfigError, match="margin"):
        compose("bench_tune", ["runs=[a,b]", "margin=-1.5"])


def test_a_new_setting_is_evaluated_beside_settings_pooled_from_reports_and_chosen_by_cost(tmp_path):
    """``outcomes_from`` with a run in none of the reports: that run (with its checkpoint) is
    evaluated, against the reports' base alone, and pools with the reported runs; its learner
    time comes from its summary.json and decides a ``prefer=cost`` choice."""
    ref = {s: _fake_run(tmp_path / f"ref{s}", f"run.seed={s}", learner=300.0 + s) for s in (0, 1)}
    for s in (0, 1):  # the reference judged seed by seed, then committed without its checkpoint
        other = _fake_run(tmp_path / f"old{s}", f"run.seed={s}", "run.learner.anchor_weight=0.5", learner=90.0)
        assert main(compose("bench_tune", [f"runs=[{ref[s]},{other}]", f"name=s{s}", f"episodes={N}",
                                           f"report_dir={tmp_path / 'r'}"]),
                    evaluate=FakeEval({f"ref{s}": BETTER, f"old{s}": REF})) == 0
        os.remove(os.path.join(ref[s], "checkpoint", "trainer_state.pt"))
    new = [_fake_run(tmp_path / f"new{s}", f"run.seed={s}", "run.learner.anchor_weight=0.2", learner=150.0 + s)
           for s in (0, 1)]
    fake = FakeEval({"new0": BETTER, "new1": BETTER})  # the same base alone as in the reports
    reports = ",".join(str(tmp_path / "r" / f"s{s}.json") for s in (0, 1))
    cfg = compose("bench_tune", [f"runs=[{ref[0]},{ref[1]},{new[0]},{new[1]}]", "name=mixed", f"episodes={N}",
                                 "margin=-0.05", "prefer=cost", f"report_dir={tmp_path / 'r'}",
                                 f"outcomes_from=[{reports}]"])
    assert main(cfg, evaluate=fake) == 0
    # the base alone evaluated once, beside the first new run, and checked against the reports'
    assert [(c[0], c[3]) for c in fake.calls] == [("new0", True), ("new1", False)]
    report = json.loads((tmp_path / "r" / "mixed.json").read_text())
    assert report["base"]["outcomes"] == BASE and report["rule"] == {"margin": -0.05, "prefer": "cost"}
    reference, newer = report["runs"]
    assert reference["learner_s"] == 300.5 and newer["learner_s"] == 150.5 and newer["evaluated"] == ["new0", "new1"]
    assert "evaluated" not in reference and newer["gain_vs_reference"]["ci95"] == [0.0, 0.0]
    assert report["chosen"]["chosen"] == "new0" and "margin=-0.05 prefer=cost" in report["command"]
    md = (tmp_path / "r" / "mixed.md").read_text()
    assert "runs in none of them were evaluated here against that base alone: `new0`, `new1`" in md
    assert "| learner s (mean) |" in md and "least mean learner-update time" in md
    # a base alone that acts otherwise here (another machine or base) cannot pair with the reports' outcomes
    with pytest.raises(ConfigError, match=r"outcomes_from: the base alone succeeds on other episodes here than in "
                                          r".*s0.json \(40 of 40 differ"):
        main(cfg, evaluate=FakeEval({"new0": BETTER, "new1": BETTER}, base=[1 - v for v in BASE]))
