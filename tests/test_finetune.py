"""Finetuning: exact resume from a checkpoint, and the real entry point improving success."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from arli.finetune import Finetuner
from arli.rl.learner import LearnerDiverged
from arli.latency import FixedLatency
from arli.rl.config import InterventionSpec, LearnerConfig, RunSpec
from arli.types import DEMO, INTERVENTION, ONLINE
from sim_envs import make_env
from arli.policies.expert import ExpertChunkPolicy
from sim_envs.experts import EXPERTS

TINY = LearnerConfig(batch_size=32, hidden=32, critic_hidden=32, critic_heads=2, critic_warmup_updates=20,
                     pretrain_updates=30, buffer_size=20_000)


def _finetuner(seed=0):
    spec = RunSpec(env_steps=400, anchor_episodes=2, regime="hil", intervention=InterventionSpec(prob=0.5, after=10),
                   learn_after=64, eval_every=10_000, eval_episodes=2, guard_episodes=2, seed=seed, learner=TINY)
    env = make_env("pick_cube", max_episode_steps=40)
    return Finetuner(spec, env, ExpertChunkPolicy("pick_cube", 16), EXPERTS["pick_cube"],
                     FixedLatency(0.2))


def _params(ft):
    return torch.cat([p.detach().flatten() for p in
                      list(ft.learner.actor.parameters()) + list(ft.learner.critic.parameters())])


def test_checkpoint_resume_continues_identically(tmp_path):
    a = _finetuner()
    a.prepare()
    a.train(150, progress=False)
    saved_steps, saved_updates = a.env_steps, a.learner.updates
    a.env.unwrapped.unstable_episodes = 2  # as if MuJoCo had reset two episodes so far
    a.save(str(tmp_path / "ckpt"))
    a.train(400, progress=False)

    b = _finetuner()
    b.load(str(tmp_path / "ckpt"))
    assert (b.env_steps, b.learner.updates) == (saved_steps, saved_updates)
    # what happened before the first online step travels with the checkpoint (the guard's decision)
    assert "start_guard" in a.start_record and b.start_record == a.start_record
    assert b.unstable_episodes == 2  # the run's count of unstable episodes resumes with it
    assert saved_steps >= 150 and saved_updates > 0
    b.train(400, progress=False)
    assert a.env_steps == b.env_steps
    assert a.learner.updates == b.learner.updates > 0
    torch.testing.assert_close(_params(a), _params(b), rtol=0, atol=0)
    assert len(a.online) == len(b.online) and len(a.anchor) == len(b.anchor)
    np.testing.assert_array_equal(a.online.data["ret"], b.online.data["ret"])


def test_a_checkpoint_trained_at_another_delay_is_refused_naming_delay_steps(tmp_path):
    """arli finetune's default delay moved from 4 to 8: resuming (or recording with) a d = 4
    residual at d = 8 must be refused before anything is loaded, not run silently."""
    from arli.errors import InputError

    a = _finetuner()  # FixedLatency(0.2) at dt 0.05: d = 4
    a.prepare()
    a.save(str(tmp_path / "ckpt"))
    spec = RunSpec(anchor_episodes=2, seed=0, learner=TINY)
    b = Finetuner(spec, make_env("pick_cube", max_episode_steps=40), ExpertChunkPolicy("pick_cube", 16),
                  EXPERTS["pick_cube"], FixedLatency(0.4))  # d = 8
    before = _params(b).clone()
    with pytest.raises(InputError, match=r"planning d = 4 .* plans d = 8: pass delay_steps=4"):
        b.load(str(tmp_path / "ckpt"))
    torch.testing.assert_close(_params(b), before, rtol=0, atol=0)
    assert b.env_steps == 0
    # nor one whose anchor data another demonstrator collected (resume does not collect them again)
    c = Finetuner(RunSpec(anchor_episodes=2, seed=0, learner=TINY, demonstrations="expert"),
                  make_env("pick_cube", max_episode_steps=40), ExpertChunkPolicy("pick_cube", 16),
                  EXPERTS["pick_cube"], FixedLatency(0.2))
    with pytest.raises(InputError, match="pass run.demonstrations=bounded"):
        c.load(str(tmp_path / "ckpt"))
    assert c.env_steps == 0


def test_a_run_records_which_base_it_finetuned(tmp_path):
    """A local checkpoint by its content (equal for equal weights, not for other ones), the
    scripted expert by name, anything else by the id as given."""
    from arli.commands.finetune import base_identity
    a, b = tmp_path / "a", tmp_path / "b"
    for d, weights in ((a, b"w1"), (b, b"w1")):
        d.mkdir()
        (d / "model.safetensors").write_bytes(weights)
    assert base_identity(str(a)) == base_identity(str(b)) != f"id:{a}"
    (b / "model.safetensors").write_bytes(b"w2")
    assert base_identity(str(a)) != base_identity(str(b))
    assert base_identity("expert") == "expert" and base_identity("lerobot/pi0") == "id:lerobot/pi0"


def test_interventions_and_anchor_data_are_routed_to_anchor_replay():
    ft = _finetuner()
    n_anchor = ft.collect_anchor()
    assert n_anchor > 0 and len(ft.online) == 0 and ft.env_steps == 0
    # demonstrations are neither online interventions nor owed updates
    assert ft.trainer.intervention_rows == 0 and ft.trainer.owed == 0 and ft.learner.updates == 0
    assert np.all(ft.anchor.data["source"][:n_anchor] == DEMO)
    # anchor rows carry the demonstrator's action (by default the expert's correction within the
    # residual's reach) and the base action the scheduler had (relabel)
    data = {k: v[:n_anchor] for k, v in ft.anchor.data.items()}
    assert np.abs(data["action"] - data["base"]).max() > 0.1
    ft.train(200, progress=False)
    assert len(ft.online) > 0 and ft.env_steps >= 200


def test_bounded_demonstrations_stay_within_the_residuals_reach():
    """run.demonstrations=bounded: the demonstrator corrects the running base only as far as
    the residual's bound allows, so every anchor target is reachable; with the expert's own
    actions (the same seeds) some rows lie beyond it."""

    from arli.policies.residual_np import project_numpy

    scale = 0.1
    rows = {}
    for mode in ("expert", "bounded"):
        spec = RunSpec(anchor_episodes=2, demonstrations=mode, seed=0, learner=replace(TINY, residual_scale=scale))
        ft = Finetuner(spec, make_env("pick_cube", max_episode_steps=40), ExpertChunkPolicy("pick_cube", 16),
                       EXPERTS["pick_cube"], FixedLatency(0.2))
        n = ft.collect_anchor()
        rows[mode] = {k: v[:n] for k, v in ft.anchor.data.items()}
    beyond = np.abs(rows["expert"]["action"] - rows["expert"]["base"]).max(-1) > scale + 1e-5
    assert beyond.mean() > 0.05
    a, b = rows["bounded"]["action"], rows["bounded"]["base"]
    assert np.abs(a - b).max() <= scale + 1e-5
    # the projection is active: entries pushed to the bound, in both directions
    at_bound = np.isclose(a - b, scale, atol=1e-5) | np.isclose(a - b, -scale, atol=1e-5)
    assert at_bound.mean() > 0.01 and (a - b).min() < 0 < (a - b).max()
    # and it is the nearest reachable action: projecting it again changes nothing
    np.testing.assert_allclose(project_numpy(a, b, scale), a, atol=1e-6)


def test_project_numpy_is_the_nearest_action_in_reach():
    from arli.policies.residual_np import project_numpy

    base = np.array([0.0, 0.95, -0.5], np.float32)
    target = np.array([0.5, 1.0, -0.55], np.float32)
    np.testing.assert_allclose(project_numpy(target, base, 0.3), [0.3, 1.0, -0.55], atol=1e-6)
    with pytest.raises(ValueError, match="run.demonstrations"):
        RunSpec(demonstrations="teleop").validate()


@pytest.mark.slow
def test_finetune_entry_point_writes_a_consistent_run(tmp_path):
    """The real console script with a tiny budget, regime rl: base, anchor-only start and
    finetuned evaluations, curve, checkpoint and TensorBoard diagnostics (learning results
    themselves are benchmarks: reports/learner_tuning.md, reports/latency_sweep*)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "arli.cli", "finetune", "env=pick_cube", "checkpoint=expert",
         "delay_steps=4", "run.env_steps=600", "run.eval_every=300", "run.eval_episodes=2", "run.guard_episodes=2",
         "run.test_episodes=3", "run.anchor_episodes=3", "run.learn_after=100", "run.learner.hidden=32", "run.learner.critic_hidden=32",
         "run.learner.critic_warmup_updates=50", "run.learner.pretrain_updates=50", "videos=1", "video_size=32",
         f"output_dir={out}"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regime"] == "rl" and summary["intervened_steps"] == 0
    assert summary["base_digest"] == "expert"  # the base it finetuned, for pooling and pairing runs
    assert summary["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # run.device=auto
    assert summary["env_steps"] >= 600 and summary["updates"] > 0
    # the final numbers: base, start and finetuned on the same test seeds, per episode, with intervals
    report = json.loads((out / "eval_test.json").read_text())
    assert report["split"] == {"split": "test", "seed_base": 5_000_000, "episodes": 3} == summary["eval"]
    for key, name in (("base_success", "base"), ("anchor_only_success", "start"), ("finetuned_success", "final")):
        assert len(report["outcomes"][name]) == 3 and summary[key] == sum(report["outcomes"][name]) / 3
        lo, hi = report["ci95"][name]
        assert lo <= summary[key] <= hi
    assert set(report["gains"]) == {"final-start", "final-base", "start-base", "trained-start"}
    # the end guard: the curve's first and last tune points decide; the deployed residual is the
    # trained one, or (dropped) the start, whose test outcomes it then has
    guard, curve = summary["end_guard"], summary["history"]
    assert (guard["start"], guard["trained"]) == (curve[0]["success"], curve[-1]["success"])
    assert guard["reverted"] == (guard["trained"] < guard["start"])
    assert summary["trained_success"] == sum(report["outcomes"]["trained"]) / 3
    deployed = report["outcomes"]["start"] if guard["reverted"] else report["outcomes"]["trained"]
    assert report["outcomes"]["final"] == deployed
    assert summary["env_steps_per_s"] > 0 and summary["updates_per_s"] > 0
    # the code it ran (the learner among it, the CLI not) and its torch threads: what a sweep
    # checks before it takes the run as a cell
    from arli.bench.provenance import sources_unchanged

    assert "arli/rl/learner.py" in summary["sources"] and "arli/finetune.py" in summary["sources"]
    assert not any(k.startswith(("arli/commands/", "arli/bench/")) for k in summary["sources"])
    assert sources_unchanged(summary["sources"]) and summary["torch_threads"] >= 1
    assert summary["machine"]["cpus"] >= 1 and len(summary["machine"]["load_avg"]) == 3
    # a stable run says so for each evaluation (tests/test_sim_envs.py provokes an unstable one)
    assert summary["sim_unstable_episodes"] == {"test_base": 0, "test_start": 0, "test_final": 0, "run": 0}
    # where the training time went: every part measured, none negative, the loop's rest included
    parts = summary["train_time_s"]
    assert set(parts) == {"physics", "base_inference", "residual_acting", "loop_other", "learner_updates",
                          "evaluation", "checkpoints"} and min(parts.values()) >= 0 and parts["physics"] > 0
    # one test seed rendered, base alone against base + residual, outcomes those of the evaluation
    (video,) = summary["videos"]
    assert video["seed"] == 5_000_000 and os.path.exists(video["path"]) and video["cameras"] == ["front", "wrist"]
    assert video["success"] == {"base alone": bool(report["outcomes"]["base"][0]),
                                "base + arli residual": bool(report["outcomes"]["final"][0])}
    # `arli eval` reproduces the final evaluation from the saved run, and takes any seed range
    again = subprocess.run([sys.executable, "-m", "arli.cli", "eval", f"run={out}", "episodes=3"],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    redo = json.loads((out / "eval_5000000_3.json").read_text())
    assert redo["split"]["split"] == "test" and redo["outcomes"]["final"] == report["outcomes"]["final"]
    assert redo["outcomes"]["base"] == report["outcomes"]["base"]
    assert redo["gating"] is (not guard["reverted"])  # a deployed start acts ungated, as it was judged
    # gating=false: the actor's own r(s) alone, in a file of its own (the gated one kept)
    alone = subprocess.run([sys.executable, "-m", "arli.cli", "eval", f"run={out}", "episodes=3", "gating=false"],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert alone.returncode == 0, alone.stderr[-3000:]
    ungated = json.loads((out / "eval_5000000_3_ungated.json").read_text())
    assert ungated["gating"] is False and ungated["outcomes"]["base"] == redo["outcomes"]["base"]
    # what acted: the gated evaluation's steps went through the gate (its choices of pi(s), the base or a
    # perturbation counted), and with gating=false none did
    assert sum(ungated["gate_picks"].values()) == 0
    if redo["gating"]:
        gated_steps = sum(redo["gate_picks"].values())
        # a critic this young scores 8 candidates about alike: over hundreds of steps it leaves pi(s) somewhere
        assert gated_steps > 0 and redo["gate_picks"]["pi"] < gated_steps
    assert json.loads((out / "eval_5000000_3.json").read_text()) == redo
    tune = subprocess.run([sys.executable, "-m", "arli.cli", "eval", f"run={out}", "seed_base=10000", "episodes=2",
                           "videos=1"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert tune.returncode == 0, tune.stderr[-3000:]
    tuned = json.loads((out / "eval_10000_2.json").read_text())
    assert tuned["split"]["split"] == "tune"
    # its video is of the seeds it evaluated, with their outcomes, and reaches the run's TensorBoard
    assert [v["seed"] for v in tuned["videos"]] == [10_000]
    assert tuned["videos"][0]["success"]["base + arli residual"] == bool(tuned["outcomes"]["final"][0])
    # the curve starts at the anchor-pretrained residual (step 0, no update), then 2 evaluations
    start, *points = summary["history"]
    assert start["env_steps"] == 0 and start["updates"] == 0
    assert len(points) == 2 and all(h["env_steps"] >= 300 and h["updates"] > 0 for h in points)
    assert all(np.isfinite(h["q_eval"]) and 0 <= h["return_eval"] <= 1 for h in summary["history"])
    # what the learner measured last, at each curve point and at the end (the default's select update:
    # the share of rows whose chosen target is the data's own action)
    assert all(0 <= h["learner"]["moved_to_data"] <= 1 for h in points)
    assert 0 <= summary["learner_diagnostics"]["moved_to_data"] <= 1
    for name in ("checkpoint/trainer_state.pt", "checkpoint/residual_actor.safetensors",
                 "learning_curve.png", "config.yaml"):
        assert (out / name).exists(), name
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(out / "tb"))
    tb.Reload()
    assert {"rollouts/seed5000000", "rollouts/seed10000"} <= set(tb.Tags()["images"])
    tags = set(tb.Tags()["scalars"])
    assert {"eval/q_vs_return/q", "eval/q_vs_return/mc_return", "learner/critic_loss"} <= tags
    assert any(t.startswith("learner/td_abs/") for t in tags) and "learner/critic_grad_norm" in tags
    # resuming the run through the command: it continues, and still reports the start it had
    resumed = tmp_path / "resumed"
    args = [a for a in proc.args if not a.startswith(("run.env_steps=", "videos=", "output_dir="))]
    cont = subprocess.run(args + ["run.env_steps=900", f"resume={out}/checkpoint", f"output_dir={resumed}"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert cont.returncode == 0, cont.stderr[-3000:]
    after = json.loads((resumed / "summary.json").read_text())
    assert after["env_steps"] >= 900 > summary["env_steps"] and after["updates"] > summary["updates"]
    assert after["anchor_only_success"] == summary["anchor_only_success"]
    assert after["start_guard"] == summary["start_guard"] is not None
    redo = json.loads((resumed / "eval_test.json").read_text())
    assert redo["outcomes"]["start"] == report["outcomes"]["start"] and "final-start" in redo["gains"]


def test_corrective_interventions_are_expert_labelled_anchor_rows():
    """Base chunks fail under delay, so the intervener keeps correcting; every step it takes
    becomes one anchor transition whose action is the expert's at that state."""
    spec = RunSpec(env_steps=300, anchor_episodes=0, learn_after=10**9, eval_every=10_000, learner=TINY, regime="hil",
                   intervention=InterventionSpec(prob=1.0, after=0, mode="corrective", segment=5))
    env = make_env("pick_cube", max_episode_steps=60)
    ft = Finetuner(spec, env, ExpertChunkPolicy("pick_cube", 16), EXPERTS["pick_cube"], FixedLatency(0.2))
    ft.train(progress=False)
    ctl, n = ft.controller, env.observation_space["state"].shape[0]
    assert 0 < ctl.intervened_steps < ft.env_steps  # short segments, not whole episodes
    assert len(ft.anchor) == ctl.intervened_steps and len(ft.online) == ft.env_steps - ctl.intervened_steps
    rows = ft.anchor.data
    expert = np.stack([EXPERTS["pick_cube"](s[:n]) for s in rows["state"][: len(ft.anchor)]])
    np.testing.assert_allclose(rows["action"][: len(ft.anchor)], expert, atol=1e-6)


def test_resuming_an_older_checkpoint_fails_clearly_and_leaves_it_intact(tmp_path):
    ft = _finetuner()
    ft.save(str(tmp_path / "ckpt"))
    path = tmp_path / "ckpt" / "trainer_state.pt"
    state = torch.load(path, weights_only=False)
    del state["format"]  # what the previous version wrote
    torch.save(state, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="older ARLI.*start a new run"):
        _finetuner().load(str(tmp_path / "ckpt"))
    assert path.read_bytes() == before


def test_rl_regime_flags_demo_rows_and_has_no_online_intervener():
    spec = RunSpec(env_steps=200, anchor_episodes=2, regime="rl", learn_after=64, eval_every=10_000,
                   learner=TINY)
    env = make_env("pick_cube", max_episode_steps=40)
    ft = Finetuner(spec, env, ExpertChunkPolicy("pick_cube", 16), EXPERTS["pick_cube"], FixedLatency(0.2))
    n_anchor = ft.collect_anchor()
    assert np.all(ft.anchor.data["source"][:n_anchor] == DEMO)
    ft.train(progress=False)
    assert ft.controller.intervened_steps == 0 and len(ft.anchor) == n_anchor
    online = {k: v[: len(ft.online)] for k, v in ft.online.data.items()}
    assert np.all(online["source"] == ONLINE)
    # the state carries the episode's progress, so time-limit truncation ends the value:
    # every episode's last rows (40 steps each, no success: the pick is rarely done in 40)
    # never bootstrap; and some earlier rows do
    assert (online["discount"] == 0).sum() >= 1 and (online["discount"] > 0).sum() >= 1


def test_takeover_penalty_and_intervention_cap():
    spec = RunSpec(env_steps=300, anchor_episodes=0, learn_after=10**9, eval_every=10_000, learner=TINY,
                   regime="hil", intervention=InterventionSpec(prob=1.0, mode="corrective", segment=5,
                                                               max_steps=12, takeover_penalty=0.5))
    env = make_env("pick_cube", max_episode_steps=60)
    ft = Finetuner(spec, env, ExpertChunkPolicy("pick_cube", 16), EXPERTS["pick_cube"], FixedLatency(0.2))
    ft.train(progress=False)
    ctl = ft.controller
    assert ctl.intervened_steps == 12  # capped
    assert np.all(ft.anchor.data["source"][: len(ft.anchor)] == INTERVENTION)
    rets = ft.online.data["ret"][: len(ft.online)]
    # each takeover charged -0.5 to the robot's step before it (seen through n-step returns)
    assert ctl.takeovers >= 2 and (rets < 0).sum() >= ctl.takeovers


def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    ft = _finetuner()
    ft.spec.eval_every = 100
    ft.prepare()
    ckpt = tmp_path / "ckpt"
    ft.train(150, progress=False, checkpoint_dir=str(ckpt))
    saved = (ckpt / "trainer_state.pt").read_bytes()
    with torch.no_grad():
        ft.learner.critic.w1.fill_(float("nan"))  # what a blown-up update leaves behind
    with pytest.raises(LearnerDiverged, match=f"last good checkpoint is {ckpt}"):
        ft.train(400, progress=False, checkpoint_dir=str(ckpt))
    assert (ckpt / "trainer_state.pt").read_bytes() == saved
    _finetuner().load(str(ckpt))  # and it still loads


def test_default_run_dirs_of_runs_started_in_the_same_second_differ(tmp_path, monkeypatch):
    """Two runs started in the same second once shared a directory and one crashed renaming
    the other's checkpoint; each now creates its own."""
    from arli.commands.finetune import new_run_dir

    monkeypatch.setattr("time.strftime", lambda fmt: "20261130_120000")
    prefix = str(tmp_path / "finetune_peg_insert_arli_d4")
    dirs = [new_run_dir(prefix) for _ in range(3)]
    assert dirs == [f"{prefix}_20261130_120000", f"{prefix}_20261130_120000_2", f"{prefix}_20261130_120000_3"]
    assert all(os.path.isdir(d) for d in dirs)


@pytest.mark.parametrize("start,base,reverted", [(0.0, 0.5, True), (0.5, 0.5, False), (1.0, 0.5, False)])
def test_the_start_guard_drops_a_start_below_the_base(monkeypatch, start, base, reverted):
    """Do no harm before RL: prepare() compares the anchored start with the base alone on the
    tune episodes; a start below the base is dropped for the zero residual (the base acts,
    exactly), otherwise the pretrained actor is kept."""
    ft = _finetuner()
    calls = []

    def fake_evaluate(episodes, seed=None, residual=True, diagnostics=False):
        calls.append((episodes, seed, residual))
        return {"success": start if residual else base}

    monkeypatch.setattr(ft, "evaluate", fake_evaluate)
    guard = ft.prepare()["start_guard"]
    assert calls == [(2, None, False), (2, None, True)]  # tune seeds (seed=None), base and start
    assert guard == {"split": "tune", "episodes": 2, "base": base, "start": start, "reverted": reverted}
    states = torch.as_tensor(ft.anchor.data["state"][:64])
    with torch.no_grad():
        moved = ft.learner.actor(states).abs().max().item()
        centre = ft.learner.actor_start(states).abs().max().item()
    if reverted:
        assert moved == 0.0 and centre == 0.0
    else:
        assert moved > 0.0 and centre == pytest.approx(moved)


@pytest.mark.parametrize("trained,start,reverted", [(0.5, 1.0, True), (1.0, 1.0, False), (1.0, 0.5, False)])
def test_the_end_guard_drops_a_trained_residual_below_its_start(monkeypatch, trained, start, reverted):
    """Do no harm after RL: guard_end compares the trained residual with the one RL started
    from on the tune episodes (the start evaluated with the start's own weights, the trained
    one's restored after); below its start, the start's weights act again, exactly."""
    ft = _finetuner()
    ft.prepare()
    ft.train(150, progress=False)
    start_w = {k: v.clone() for k, v in ft.learner.actor_start.state_dict().items()}
    trained_w = {k: v.clone() for k, v in ft.learner.actor.state_dict().items()}
    assert any(not torch.equal(start_w[k], trained_w[k]) for k in start_w)  # RL moved the actor
    calls = []

    def fake_evaluate(episodes, seed=None, residual=True, diagnostics=False):
        now = ft.learner.actor.state_dict()
        which = "start" if all(torch.equal(now[k], start_w[k]) for k in now) else "trained"
        calls.append((episodes, seed, which))
        return {"success": start if which == "start" else trained}

    monkeypatch.setattr(ft, "evaluate", fake_evaluate)
    ft.history = []  # no curve points to read: both residuals are evaluated
    ft.start_record["start_guard"] = None  # nor the start guard's measurement of the start
    guard = ft.guard_end()
    assert sorted(calls) == [(2, None, "start"), (2, None, "trained")]  # tune seeds, both residuals
    assert guard == {"split": "tune", "episodes": 2, "start": start, "trained": trained, "reverted": reverted}
    deployed = ft.learner.actor.state_dict()
    for k in deployed:
        assert torch.equal(deployed[k], (start_w if reverted else trained_w)[k]), k
        assert torch.equal(ft.learner.actor_target.state_dict()[k], deployed[k]) or not reverted


def test_the_guards_compare_on_more_tune_episodes_than_a_curve_point(monkeypatch):
    """run.guard_episodes > run.eval_episodes: each guard evaluates the curve's seeds and the
    rest as two calls (a seed meets the same latency draws in every evaluation); the end guard
    reuses what was measured on the same seeds and weights (the start guard's start, the curve's
    last point) and compares counts, so a tie keeps what RL trained."""
    ft = _finetuner()
    ft.spec = replace(ft.spec, guard_episodes=8)  # 2 curve episodes + 6 more
    start_w = {k: v.clone() for k, v in ft.learner.actor_start.state_dict().items()}
    calls, trained_rest = [], [1.0]

    def fake_evaluate(episodes, seed=None, residual=True, diagnostics=False):
        now = ft.learner.actor.state_dict()
        which = ("base" if not residual else
                 "start" if all(torch.equal(now[k], start_w[k]) for k in now) else "trained")
        calls.append((episodes, seed, which))
        return {"success": {"base": 0.0, "start": 0.5, "trained": trained_rest[0]}[which]}

    monkeypatch.setattr(ft, "evaluate", fake_evaluate)
    guard = ft.guard_start()
    assert guard == {"split": "tune", "episodes": 8, "base": 0.0, "start": 0.5, "reverted": False}
    assert calls == [(2, None, "base"), (6, 10_002, "base"), (2, None, "start"), (6, 10_002, "start")]
    ft.start_record["start_guard"] = guard  # as prepare() records it
    with torch.no_grad():
        for p in ft.learner.actor.parameters():
            p.add_(0.01)  # what RL moved
    calls.clear()
    ft.history = [{"env_steps": 0, "success": 1.0, "eval_episodes": 2},
                  {"env_steps": ft.env_steps, "success": 0.0, "eval_episodes": 2}]
    # trained: 0 of the curve's 2 + 6 of the rest; start: the start guard's 4 of 8
    assert ft.guard_end() == {"split": "tune", "episodes": 8, "start": 0.5, "trained": 0.75, "reverted": False}
    assert calls == [(6, 10_002, "trained")]
    trained_rest[0] = 4 / 6  # 0 + 4 = the start's 4: a tie, decided on counts, keeps what RL trained
    assert not ft.guard_end()["reverted"]
    # without the start guard's record: the start from the curve's first point (2 of 2) + 3 of 6
    ft.start_record["start_guard"], trained_rest[0] = None, 1.0
    calls.clear()
    assert ft.guard_end() == {"split": "tune", "episodes": 8, "start": 0.625, "trained": 0.75, "reverted": False}
    assert sorted(calls) == [(6, 10_002, "start"), (6, 10_002, "trained")]
    # a curve point measured on another count of seeds (a resumed run's) is evaluated again
    ft.history[-1]["eval_episodes"] = 5
    calls.clear()
    ft.guard_end()
    assert (2, None, "trained") in calls and (6, 10_002, "trained") in calls
    ft.history[-1]["eval_episodes"] = 2
    ft.spec = replace(ft.spec, guard_episodes=0)  # a run saved before the knob: the curve's episodes
    calls.clear()
    assert ft.guard_end()["reverted"] and calls == []  # 0 < 2 on the curve's 2 episodes alone


def test_a_run_whose_end_guard_drops_the_trained_residual(tmp_path, monkeypatch):
    """The entry point with the guard forced to drop what RL trained: the final outcomes are the
    start's, the trained ones are kept, the checkpoint stays the training state (its actor the
    trained one: resuming and the tuning benches see what RL trained), residual_actor.safetensors
    is the deployed start, and `arli eval` evaluates the deployed start."""
    from safetensors.torch import load_file

    from arli.cli import main

    real = Finetuner.guard_end

    def dropping(self):
        out = real(self)
        self.learner.revert_to_start()
        return {**out, "reverted": True}

    monkeypatch.setattr(Finetuner, "guard_end", dropping)
    out = tmp_path / "run"
    assert main(["finetune", "env=pick_cube", "checkpoint=expert", "delay_steps=4", "run.env_steps=300",
                 "run.eval_every=300", "run.eval_episodes=2", "run.guard_episodes=2", "run.test_episodes=3", "run.anchor_episodes=2",
                 "run.learn_after=100", "run.learner.hidden=32", "run.learner.critic_hidden=32",
                 "run.learner.critic_warmup_updates=20", "run.learner.pretrain_updates=30", "videos=0",
                 f"output_dir={out}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    report = json.loads((out / "eval_test.json").read_text())
    assert summary["end_guard"]["reverted"] and summary["deployed_actor"] == "actor_start"
    assert report["outcomes"]["final"] == report["outcomes"]["start"] and len(report["outcomes"]["trained"]) == 3
    assert summary["trained_success"] == sum(report["outcomes"]["trained"]) / 3
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)["trainer"]["learner"]
    trained, start = state["actor"], state["actor_start"]
    assert any(not torch.equal(trained[k], start[k]) for k in trained)  # RL moved it; the state keeps it
    deployed = load_file(str(out / "checkpoint" / "residual_actor.safetensors"))
    assert all(torch.equal(deployed[k], start[k]) for k in start)
    assert main(["eval", f"run={out}", "episodes=3"]) == 0
    again = json.loads((out / "eval_5000000_3.json").read_text())
    assert again["outcomes"]["final"] == report["outcomes"]["final"]


def test_the_end_guard_reads_the_curve_where_it_has_both_points(monkeypatch):
    """The curve's first point (the start, at 0 online steps) and its last (at this step) are
    the guard's numbers: no evaluation is run again."""
    ft = _finetuner()
    ft.prepare()
    ft.train(100, progress=False)
    ft.history = [{"env_steps": 0, "success": 1.0}, {"env_steps": ft.env_steps, "success": 0.5}]
    ft.start_record["start_guard"] = None  # the curve's first point, not the start guard's number
    monkeypatch.setattr(ft, "evaluate", lambda *a, **k: pytest.fail("the guard evaluated"))
    assert ft.guard_end() == {"split": "tune", "episodes": 2, "start": 1.0, "trained": 0.5, "reverted": True}


def test_no_start_guard_without_pretraining_or_when_switched_off(monkeypatch):
    for spec_change in ({"start_guard": False}, {"learner": TINY.__class__(**{**vars(TINY), "pretrain_updates": 0})}):
        ft = _finetuner()
        ft.spec = ft.spec.__class__(**{**vars(ft.spec), **spec_change})
        monkeypatch.setattr(ft, "evaluate", lambda *a, **k: pytest.fail("the guard evaluated"))
        assert "start_guard" not in ft.prepare()
