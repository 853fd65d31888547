"""``arli bench drift``: the select update run with a run's critic frozen moves the actor, a
trust region to the start holds it, and bad settings are refused before any work."""

import json

import pytest


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny finished `arli finetune` run (pick_cube, the scripted expert as the base) with
    its checkpoint and replay, saved inside its critic warm-up: the actor is still its start."""
    from arli.cli import main

    out = tmp_path_factory.mktemp("drift") / "run"
    assert main(["finetune", "env=pick_cube", "checkpoint=expert", "delay_steps=4", "run.env_steps=300",
                 "run.eval_every=300", "run.eval_episodes=2", "run.guard_episodes=2", "run.test_episodes=2",
                 "run.anchor_episodes=2", "run.learn_after=100", "run.learner.hidden=32", "run.learner.critic_hidden=32",
                 "run.learner.critic_warmup_updates=1000", "run.learner.pretrain_updates=30", "run.start_guard=false",
                 "run.end_guard=false", "videos=0", f"output_dir={out}"]) == 0
    return out


@pytest.mark.slow
def test_a_trust_region_holds_the_actor_the_select_update_moves(run_dir, tmp_path):
    from arli.cli import main

    assert main(["bench", "drift", f"run={run_dir}", "updates=40", "episodes=2",
                 "settings=[\"\", \"start_weight=1000\"]", "name=d", f"report_dir={tmp_path}"]) == 0
    report = json.loads((tmp_path / "d.json").read_text())
    free, held = report["rows"]
    assert report["split"] == "tune" and report["updates"] == 40
    assert held["overrides"] == {"start_weight": 1000} and free["overrides"] == {}
    # the same checkpoint: the critic's picks are the same draws, the actor evaluated once before
    assert free["picks"] == held["picks"] and free["before"] == held["before"] and len(held["after"]) == 2
    # the gated policy is evaluated too, with the gate acting although the checkpoint is inside the
    # warm-up; the same critic and gate settings on the same episodes: the same outcomes before
    assert len(free["gated_before"]) == len(held["gated_after"]) == 2 and free["gated_before"] == held["gated_before"]
    assert free["picks"]["row_step"] > 0 and free["moved"] > 0 and any(x != 0 for x in free["mean_shift"])
    assert held["moved"] < free["moved"] / 5  # the trust region to the start holds
    md = (tmp_path / "d.md").read_text()
    assert "gated before" in md
    assert "start_weight=1000" in md and "![drift](d.png)" in md and (tmp_path / "d.png").exists()


@pytest.mark.slow
def test_the_gated_evaluation_lets_the_gate_act_inside_the_warm_up_and_restores_the_count(run_dir, monkeypatch):
    import arli.bench.drift as drift

    _, ft = drift._load(str(run_dir), "")
    learner = ft.learner
    seen: list[int] = []
    monkeypatch.setattr(ft, "evaluate", lambda episodes, seed_base: seen.append(learner.updates) or {"outcomes": [1]})
    updates = learner.updates
    assert 0 < updates < learner.cfg.critic_warmup_updates  # inside the warm-up: act() would not gate
    assert drift.gated(ft, 1, 10_000) == [1]
    assert seen == [learner.cfg.critic_warmup_updates] and learner.updates == updates


@pytest.mark.slow
@pytest.mark.parametrize("args, field", [
    (["settings=[\"start_wieght=1\"]"], "start_wieght"),  # a typo: refused, naming the key
    (["settings=[\"\", \"q_weight=0\"]"], "select update"),  # only the select update is measured, checked up front
    (["settings=[\"actor_lr=0.1\"]"], "actor_lr"),  # fixed in the optimiser already: it would change nothing
    (["settings=[\"start_weight=abc\"]"], "expected a number"),
    (["settings=[\"gate_std=-1\"]"], "gate_std"),  # a value the learner refuses, before any work
    (["seed_base=5000000"], "test seeds"),  # a diagnostic: never on the run's test seeds
    (["run="], "run: expected"),  # no run given
])
def test_bad_settings_are_refused_with_what_is_wrong(run_dir, tmp_path, capsys, args, field):
    from arli.cli import main

    assert main(["bench", "drift", f"run={run_dir}", "updates=2", "episodes=1", *args, f"report_dir={tmp_path}"]) == 2
    assert field in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written
