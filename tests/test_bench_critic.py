"""``arli bench critic``: the Monte-Carlo Q of a candidate comes from a faithful copy of the
whole sim episode (the residual's own candidate returns exactly what the episode it was
copied from went on to get), and the ranking metrics count only pairs whose returns differ."""

import numpy as np
import pytest

from arli.bench.critic import _candidates, _snapshots, monte_carlo, ranking


def test_ranking_counts_only_pairs_whose_returns_differ():
    right = {"a": {"mc": 0.9, "q": 0.8}, "b": {"mc": 0.0, "q": 0.1}, "c": {"mc": 0.0, "q": 0.5}}  # b = c: a tie
    wrong = {"a": {"mc": 0.9, "q": 0.1}, "b": {"mc": 0.5, "q": 0.2}, "c": {"mc": 0.0, "q": 0.3}}
    flat = {"a": {"mc": 0.0, "q": 0.4}, "b": {"mc": 0.0, "q": 0.2}}  # nothing to rank
    out = ranking([right, wrong, flat])
    assert out["pairs"] == 2 + 3 and out["states_with_ranked_pairs"] == 2
    assert out["pairwise_accuracy"] == pytest.approx(2 / 5)
    assert out["top1"] == pytest.approx(0.5)  # right: a is Q's favourite and best; wrong: c is neither
    assert out["spearman"] == pytest.approx(np.mean([np.corrcoef([2, 0, 1], [2, 0, 1])[0, 1], -1.0]))
    lo, hi = out["pairwise_accuracy_ci95"]
    assert 0 <= lo <= 2 / 5 <= hi <= 1


@pytest.mark.slow
def test_a_candidate_is_judged_from_a_faithful_copy_of_the_episode():
    from arli.cli import compose
    from arli.runs import make_finetuner
    from arli.rollout import sim_episode

    cfg = compose("finetune", ["env=pick_cube", "checkpoint=expert", "run.anchor_episodes=0",
                               "env.max_episode_steps=60"])
    ft, _, _ = make_finetuner(cfg)
    gamma, seed = cfg.run.learner.gamma, 10_000
    rewards = []
    ctl = ft.evaluation_controller()
    after = ctl.after_step
    ctl.after_step = lambda t, r, term, trunc: (rewards.append(r), after(t, r, term, trunc))
    episode = sim_episode(ft.env, ft.base, ft.scheduler, ft.latency, np.random.default_rng(seed), seed, ctl)
    while not episode.done:
        episode.step()
    episode.finish()
    snaps = _snapshots(ft, "policy", [seed], every=20, limit=2)
    assert [s[1] for s in snaps] == [20, 40] or len(rewards) < 41
    picks = _candidates(ft, perturbations=2, sigma=0.5, rng=np.random.default_rng(0))
    assert set(picks) == {"residual", "explored", "base", "expert", "perturbed_0", "perturbed_1"}
    for snap in snaps:
        rows = monte_carlo(ft, snap, picks, gamma)
        t = snap[1]
        went_on_to = sum(gamma ** k * r for k, r in enumerate(rewards[t:]))
        assert rows["residual"]["mc"] == pytest.approx(went_on_to, abs=1e-9)
        assert all(np.isfinite(v["q"]) for v in rows.values())
        assert not np.allclose(rows["perturbed_0"]["action"], rows["residual"]["action"])
        # the executed action as training explores: the residual moved by the run's exploration noise
        moved = np.abs(rows["explored"]["action"] - rows["residual"]["action"]).max()
        assert 0 < moved <= 5 * cfg.run.learner.exploration_std * cfg.run.learner.residual_scale


def test_runs_judged_in_parallel_come_back_in_the_order_asked(monkeypatch):
    import time

    import arli.bench.critic as critic
    from arli.config import BenchCriticConfig

    def fake_judge(run_dir, cfg, bar=None):  # the first run finishes last
        time.sleep(0.6 if run_dir == "a" else 0.05)
        return {"run": run_dir}

    monkeypatch.setattr(critic, "judge_run", fake_judge)  # forked workers inherit the patch
    cfg = BenchCriticConfig(runs=["a", "b", "c"], workers=2)
    assert [r["run"] for r in critic.judge_runs(cfg, sources=2)] == ["a", "b", "c"]


def test_a_run_that_fails_in_a_worker_is_named(monkeypatch):
    import pytest

    import arli.bench.critic as critic
    from arli.config import BenchCriticConfig

    def fake_judge(run_dir, cfg, bar=None):
        if run_dir == "broken":
            raise FileNotFoundError("no checkpoint/ in broken")
        return {"run": run_dir}

    monkeypatch.setattr(critic, "judge_run", fake_judge)
    with pytest.raises(RuntimeError, match="judging broken failed: FileNotFoundError"):
        critic.judge_runs(BenchCriticConfig(runs=["a", "broken"], workers=2), sources=2)


def test_the_report_names_the_command_that_wrote_it(monkeypatch, tmp_path):
    """The report's first line is the command with the runs and every setting that shaped it, so
    a reader can rerun it."""
    import arli.bench.critic as critic
    from arli.config import BenchCriticConfig

    overall = {"states": 1, "states_with_ranked_pairs": 1, "pairs": 1, "pairwise_accuracy": 0.75,
               "pairwise_accuracy_ci95": [0.5, 1.0], "spearman": 0.5, "top1": 1.0, "q_mean": 0.4, "mc_mean": 0.5}
    settings = {"critic_heads": 4, "critic_hidden": 128, "utd": 1, "critic_warmup_updates": 2000, "gamma": 0.99,
                "n_step": 3, "exploration_std": 0.1}
    fake = [{"run": r, "env": "peg_insert", "variant": "arli", "delay_steps": 8, "env_steps": 10, "states": [],
             "overall": overall, "settings": settings, "by_source": {"policy": overall}, "by_phase": {},
             "by_candidate": {"residual": {"mc_mean": 0.5, "q_mean": 0.4}}} for r in ("runs/a", "runs/b")]
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: fake)
    cfg = BenchCriticConfig(runs=["runs/a", "runs/b"], states=40, episodes=20, name="c", report_dir=str(tmp_path))
    assert critic.main(cfg) == 0
    md = (tmp_path / "c.md").read_text()
    assert ("`arli bench critic 'runs=[runs/a, runs/b]' states=40 episodes=20 every=10 perturbations=4 "
            f"perturb_scale=0.5 seed=0 name=c report_dir={tmp_path}`") in md
    assert "| `runs/a` (arli, d=8, 10 steps) | 4 × 128 |" in md and "0.75 [0.50, 1.00]" in md
