"""``arli bench critic``: the Monte-Carlo Q of a candidate comes from a faithful copy of the
whole sim episode (the residual's own candidate returns exactly what the episode it was
copied from went on to get), and the ranking metrics count only pairs whose returns differ."""

import numpy as np
import pytest

from arli.bench.critic import _candidates, _snapshots, monte_carlo, ranking


@pytest.fixture
def saved_runs(monkeypatch):
    """Every run name a test passes has a saved finetune config (its default seed ranges), so
    ``main``'s up-front check of ``runs`` passes on to the (faked) judging."""
    from types import SimpleNamespace

    import arli.runs
    from arli.rl.config import RunSpec

    monkeypatch.setattr(arli.runs, "load_run_config", lambda run: SimpleNamespace(run=RunSpec()))


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


def test_split_halves_rank_the_labels_against_themselves_and_the_critic_against_the_same_half():
    from arli.bench.critic import split_half

    agree = {"x": {"runs": [1.0, 1.0], "q": 0.9}, "y": {"runs": [0.0, 0.0], "q": 0.1}}  # both right
    flip = {"x": {"runs": [1.0, 0.0], "q": 0.2}, "y": {"runs": [0.0, 1.0], "q": 0.8}}  # halves disagree
    tie = {"x": {"runs": [0.5, 0.5], "q": 0.1}, "y": {"runs": [0.0, 0.5], "q": 0.3}}  # odd half ties: 1/2
    level = {"x": {"runs": [0.2, 0.9], "q": 0.1}, "y": {"runs": [0.2, 0.0], "q": 0.3}}  # even half ties: no pair
    states = [{k: {**v, "mc": float(np.mean(v["runs"]))} for k, v in st.items()} for st in (agree, flip, tie, level)]
    out = split_half(states)
    assert {k: out[k] for k in ("pairs", "labels", "critic")} == {"pairs": 3, "labels": pytest.approx(1.5 / 3),
                                                                   "critic": pytest.approx(1 / 3)}
    # per size of the half-B difference: 0.5 (tie) falls in (0.1, inf), as do agree's and flip's 1.0
    assert [(g["gap"], g["pairs"]) for g in out["by_gap"]] == [([1e-6, 0.01], 0), ([0.01, 0.1], 0), ([0.1, None], 3)]
    near = {"x": {"runs": [0.5, 0.5], "q": 0.9, "mc": 0.5}, "y": {"runs": [0.495, 0.49], "q": 0.1, "mc": 0.4925}}
    small = split_half([near])["by_gap"][0]
    assert small["pairs"] == 1 and small["labels"] == 1.0 and small["critic"] == 1.0
    assert ranking(states)["split_half"] == out
    one = [{"x": {"runs": [1.0], "q": 0.0, "mc": 1.0}, "y": {"runs": [0.0], "q": 0.0, "mc": 0.0}}]
    assert split_half(one) is None and ranking(one)["split_half"] is None  # a single repeat has no halves


def test_repeats_draw_fresh_base_noise_the_same_for_every_candidate():
    """Repeat 0 continues with the base's noise as the roll-in left it; each later repeat with
    its own reproducible draw, shared by every candidate (common random numbers)."""
    from types import SimpleNamespace

    import torch

    class Ctl:
        def begin_episode(self):
            pass

        def act(self, t, obs, info):
            return np.zeros(2, np.float32)

        def after_step(self, t, reward, terminated, truncated):
            pass

        def end(self, obs, info, terminated, truncated):
            pass

    class Episode:  # two steps; each step's reward is one draw of the base's noise + the action's push
        def __init__(self, base):
            self.base, self.ctl, self.t, self.done = base, None, 0, False

        def step(self):
            obs, info = SimpleNamespace(state=np.zeros(3)), SimpleNamespace(base_action=np.zeros(2, np.float32))
            action = self.ctl.act(self.t, obs, info)
            reward = float(torch.rand(1, generator=self.base._gen)) + float(action[0])
            self.t += 1
            self.done = self.t == 2
            self.ctl.after_step(self.t - 1, reward, False, self.done)

        def finish(self):
            self.ctl.end(None, None, False, True)

    base = SimpleNamespace(_gen=torch.Generator().manual_seed(123))
    learner = SimpleNamespace(generator=torch.Generator().manual_seed(0),
                              q_value=lambda s, a: np.asarray(a, np.float64).sum(axis=1))
    ft = SimpleNamespace(base=base, learner=learner, expert=None, spec=SimpleNamespace(learner=SimpleNamespace(
        residual_scale=0.5)), builder=SimpleNamespace(build=lambda state, info: np.zeros(4, np.float32)),
        evaluation_controller=Ctl)
    snapshot = (Episode(base), 5, 7, base._gen.get_state())
    picks = {"push": lambda s, b, obs: np.array([0.4, 0.0], np.float32), "base": lambda s, b, obs: np.zeros(2)}
    rows = monte_carlo(ft, snapshot, picks, gamma=0.5, repeats=3)
    push, zero = np.array(rows["push"]["runs"]), np.array(rows["base"]["runs"])
    assert np.allclose(push - zero, 0.2)  # the same noise for both in every repeat: only the push differs
    assert len(set(np.round(zero, 9))) == 3  # each repeat its own draw
    first = torch.Generator()
    first.set_state(snapshot[3])
    draws = torch.rand(2, generator=first).tolist()
    assert zero[0] == pytest.approx(draws[0] + 0.5 * draws[1])  # repeat 0: the roll-in's own noise
    assert rows["push"]["mc"] == pytest.approx(push.mean()) and rows["push"]["q"] == pytest.approx(0.2)
    again = monte_carlo(ft, snapshot, picks, gamma=0.5, repeats=3)
    assert again["base"]["runs"] == rows["base"]["runs"]  # the later draws are seeded: reproducible


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
        rows = monte_carlo(ft, snap, picks, gamma, repeats=2)
        t = snap[1]
        went_on_to = sum(gamma ** k * r for k, r in enumerate(rewards[t:]))
        assert rows["residual"]["mc"] == pytest.approx(went_on_to, abs=1e-9)
        # the scripted base draws no noise: a second repeat returns the same
        assert rows["residual"]["runs"] == pytest.approx([went_on_to] * 2, abs=1e-9)
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


def test_the_report_names_the_command_that_wrote_it(saved_runs, monkeypatch, tmp_path):
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


def test_the_report_shows_the_split_halves_next_to_the_critic(saved_runs, monkeypatch, tmp_path):
    import arli.bench.critic as critic
    from arli.config import BenchCriticConfig

    overall = {"states": 2, "states_with_ranked_pairs": 2, "pairs": 12, "pairwise_accuracy": 0.6,
               "spearman": 0.2, "top1": 0.5, "q_mean": 0.4, "mc_mean": 0.5,
               "split_half": {"pairs": 12, "labels": 0.7, "critic": 0.55,
                              "by_gap": [{"gap": [1e-6, 0.01], "pairs": 9, "labels": 0.8, "critic": 0.6},
                                         {"gap": [0.1, None], "pairs": 3, "labels": 0.5, "critic": 0.4}]}}
    settings = {"critic_heads": 4, "critic_hidden": 128, "utd": 1, "critic_warmup_updates": 2000, "gamma": 0.99,
                "n_step": 3, "exploration_std": 0.1}
    fake = [{"run": "runs/a", "env": "peg_insert", "variant": "arli", "delay_steps": 8, "env_steps": 10,
             "states": [], "overall": overall, "settings": settings, "by_source": {}, "by_phase": {},
             "by_candidate": {}}]
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: fake)
    cfg = BenchCriticConfig(runs=["runs/a"], repeats=4, name="c", report_dir=str(tmp_path))
    assert critic.main(cfg) == 0
    md = (tmp_path / "c.md").read_text()
    assert "perturb_scale=0.5 repeats=4 seed=0" in md and "the mean of 4 rollouts" in md
    assert md.count("split halves: labels / critic (pairs) |") == 1 and "| 0.70 / 0.55 (12) |" in md
    assert "| 1e-06 – 0.01 | 9 | 0.80 | 0.60 |" in md and "| 0.1 – ∞ | 3 | 0.50 | 0.40 |" in md


def test_repeats_are_refused_on_a_base_that_draws_no_noise():
    from types import SimpleNamespace

    import torch

    from arli.bench.critic import check_repeats
    from arli.errors import ConfigError

    scripted = SimpleNamespace(base=object())
    with pytest.raises(ConfigError, match=r"repeats: 4 .* draws none: every repeat would be the same rollout"):
        check_repeats(scripted, 4, "runs/a")
    check_repeats(scripted, 1, "runs/a")  # one rollout: the measurement as it always was
    check_repeats(SimpleNamespace(base=SimpleNamespace(_gen=torch.Generator())), 4, "runs/a")


def test_roll_in_seeds_are_the_tune_seeds_or_a_range_clear_of_the_test_seeds():
    from arli.bench.critic import roll_in_seeds
    from arli.errors import ConfigError
    from arli.rl.config import RunSpec

    spec = RunSpec(tune_seed=10_000, test_seed=5_000_000, test_episodes=200)
    assert roll_in_seeds(spec, None, 3) == [10_000, 10_001, 10_002]
    assert roll_in_seeds(spec, 20_000, 2) == [20_000, 20_001]
    assert roll_in_seeds(spec, 4_999_990, 10) == list(range(4_999_990, 5_000_000))  # ends just before them
    for base, n in ((5_000_000, 1), (4_999_995, 10), (5_000_199, 5), (4_000_000, 2_000_000)):  # the last encloses them
        with pytest.raises(ConfigError, match=r"seed_base: .* overlaps the test seeds 5000000..5000199"):
            roll_in_seeds(spec, base, n)
    assert roll_in_seeds(spec, 5_000_200, 3)[0] == 5_000_200  # just after them
    few = RunSpec(tune_seed=10_000, test_seed=5_000_000, test_episodes=20)  # a run evaluated on fewer
    with pytest.raises(ConfigError, match="overlaps the test seeds 5000000..5000199"):
        roll_in_seeds(few, 5_000_100, 5)  # still the reported numbers' test seeds


def test_a_seed_base_on_the_test_seeds_is_refused_before_any_run_is_judged(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import arli.runs
    from arli.bench import critic
    from arli.config import BenchCriticConfig
    from arli.errors import ConfigError
    from arli.rl.config import RunSpec

    spec = RunSpec(tune_seed=10_000, test_seed=5_000_000, test_episodes=200)
    monkeypatch.setattr(arli.runs, "load_run_config", lambda run: SimpleNamespace(run=spec))
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: pytest.fail("judged a run"))
    cfg = BenchCriticConfig(runs=["runs/a", "runs/b"], seed_base=5_000_050, report_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="seed_base: 5000050..5000059 overlaps the test seeds"):
        critic.main(cfg)


def test_the_critics_shortfall_against_its_labels_carries_a_bootstrap_interval_over_states():
    from arli.bench.critic import split_half

    def state(q_right: bool) -> dict:  # the halves agree; the critic orders the pair rightly or not
        qx, qy = (0.9, 0.1) if q_right else (0.1, 0.9)
        return {"x": {"runs": [1.0, 1.0], "q": qx, "mc": 1.0}, "y": {"runs": [0.0, 0.0], "q": qy, "mc": 0.0}}

    wrong = split_half([state(False)] * 8)
    assert wrong["shortfall"] == 1.0 and wrong["shortfall_ci95"] == [1.0, 1.0] and wrong["critic_ci95"] == [0, 0]
    mixed = split_half([state(True)] * 6 + [state(False)] * 6)
    assert mixed["labels_ci95"] == [1.0, 1.0] and mixed["shortfall"] == pytest.approx(0.5)
    lo, hi = mixed["shortfall_ci95"]
    assert 0.1 < lo < 0.5 < hi < 0.9  # 12 states: the shortfall is known to within a state's share, not exactly
    assert split_half([state(True)] * 6 + [state(False)] * 6) == mixed  # the resampling is seeded
    # states of one roll-in episode move together: two episodes (one all right, one all wrong) leave the
    # critic's share anywhere from 0 to 1, where 12 independent states pin it near 1/2
    two = split_half([state(True)] * 6 + [state(False)] * 6, episodes=[0] * 6 + [1] * 6)
    assert two["shortfall"] == mixed["shortfall"] and two["critic_ci95"] == [0.0, 1.0]
    assert two["shortfall_ci95"] == [0.0, 1.0]


def test_report_only_rebuilds_the_report_from_its_judged_states_and_refuses_another_command(saved_runs, monkeypatch, tmp_path):
    import json

    import arli.bench.critic as critic
    from arli.config import BenchCriticConfig
    from arli.errors import ConfigError

    def cand(runs, q):
        return {"mc": float(np.mean(runs)), "q": q, "runs": runs}

    states = [{"source": "policy", "phase": "early", "t": 0, "seed": 1,
               "candidates": {"residual": cand([1.0, 1.0], 0.2), "base": cand([0.0, 0.0], 0.8)}},
              {"source": "expert", "phase": "middle", "t": 50, "seed": 2,
               "candidates": {"residual": cand([0.5, 0.4], 0.6), "base": cand([0.1, 0.2], 0.3)}}]
    settings = {"critic_heads": 4, "critic_hidden": 128, "utd": 1, "critic_warmup_updates": 2000, "gamma": 0.99,
                "n_step": 3, "exploration_std": 0.1}
    run = {"run": "runs/a", "env": "peg_insert", "variant": "arli", "delay_steps": 8, "env_steps": 10,
           "settings": settings, "seeds": {"split": "tune", "seed_base": 10_000, "episodes": 3}, "repeats": 2,
           **critic.summarize(states, ["policy", "expert"]), "states": states}
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: [json.loads(json.dumps(run))])
    cfg = dict(runs=["runs/a"], episodes=3, repeats=2, name="c", report_dir=str(tmp_path))
    assert critic.main(BenchCriticConfig(**cfg)) == 0
    first = (tmp_path / "c.md").read_text()
    saved = json.loads((tmp_path / "c.json").read_text())
    # an older report's metrics (here: no interval yet) are recomputed from its states, nothing rolled out again
    del saved["runs"][0]["overall"]["split_half"]["shortfall_ci95"]
    (tmp_path / "c.json").write_text(json.dumps(saved))
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: pytest.fail("report_only rolled out"))
    assert critic.main(BenchCriticConfig(**cfg, report_only=True)) == 0
    again = (tmp_path / "c.md").read_text()
    assert again.split("Machine:")[0] == first.split("Machine:")[0] and "| 1.00 / 0.50 (2) | +0.50 [" in again
    assert "rebuilt from the report's JSON" in again
    rebuilt = json.loads((tmp_path / "c.json").read_text())["runs"][0]
    assert rebuilt["overall"]["split_half"]["shortfall_ci95"] == run["overall"]["split_half"]["shortfall_ci95"]
    with pytest.raises(ConfigError, match=r"another command \(repeats=4 \(the report's: 2\)\)"):
        critic.main(BenchCriticConfig(**{**cfg, "repeats": 4}, report_only=True))
    # a report written before `states` and `seed` were stored: states is the most one source gave
    older = json.loads((tmp_path / "c.json").read_text())
    del older["states"], older["seed"]
    (tmp_path / "c.json").write_text(json.dumps(older))
    with pytest.raises(ConfigError, match=r"states=30 \(the report's: 1\)"):
        critic.main(BenchCriticConfig(**cfg, report_only=True))
    assert critic.main(BenchCriticConfig(**cfg, states=1, report_only=True)) == 0
    assert json.loads((tmp_path / "c.json").read_text())["rebuilt_from_json"] is True
    with pytest.raises(ConfigError, match="no .*nothing.json to rebuild"):
        critic.main(BenchCriticConfig(**{**cfg, "name": "nothing"}, report_only=True))
    with pytest.raises(ConfigError, match="name: .*the report to rebuild"):
        BenchCriticConfig(runs=["runs/a"], report_only=True).validate()


def test_split_halves_say_which_comparisons_the_critic_misses():
    from arli.bench.critic import split_half

    # the critic orders the base against a perturbation rightly and the two perturbations wrongly
    st = {"base": {"runs": [0.9, 0.9], "q": 0.9}, "perturbed_0": {"runs": [0.5, 0.5], "q": 0.2},
          "perturbed_1": {"runs": [0.6, 0.6], "q": 0.1}, "residual": {"runs": [0.9, 0.9], "q": 0.3}}
    st = {k: {**v, "mc": 0.0} for k, v in st.items()}
    out = split_half([st])
    rows = {tuple(g["pair"]): (g["pairs"], g["labels"], g["critic"]) for g in out["by_pair"]}
    # base = residual in half B: no pair; the residual's Q is below the base's but above both perturbations'
    assert rows == {("base", "perturbed"): (2, 1.0, 1.0), ("perturbed", "perturbed"): (1, 1.0, 0.0),
                    ("perturbed", "residual"): (2, 1.0, 1.0)}
    assert sum(g["pairs"] for g in out["by_pair"]) == out["pairs"] == 5 and out["critic"] == pytest.approx(4 / 5)
    # a tie in half A counts 1/2 per pair kind as it does overall
    st["perturbed_1"]["runs"] = [0.6, 0.5]
    tie = {tuple(g["pair"]): g["labels"] for g in split_half([st])["by_pair"]}
    assert tie[("perturbed", "perturbed")] == 0.5


def test_a_refit_critic_sees_the_action_through_its_treatment():
    """``executed`` passes the executed action a; ``residual`` (a - b) / scale with b read from the
    state's base-action slice; ``residual_std`` that over the exploration std."""
    import torch

    from arli.bench.critic_refit import ActionInputCritic
    from arli.policies.residual import EnsembleCritic

    state = torch.tensor([[5.0, 0.2, -0.1, 7.0]])  # base action at [1:3]
    action = torch.tensor([[0.5, -0.4]])
    inner = EnsembleCritic(4, 2, heads=2, hidden=8)
    seen = {}
    for t in ("executed", "residual", "residual_std"):
        critic = ActionInputCritic(inner, t, slice(1, 3), scale=0.3, exploration_std=0.1)
        seen[t] = critic.encode(state, action)
        assert torch.allclose(critic(state, action), inner(state, seen[t]))
        # value gating scores K candidates per state through the same treatment
        cands = torch.stack([action, -action, 0.5 * action])  # (K=3, B=1, m)
        many = critic.candidates(state, cands)
        for k in range(3):
            torch.testing.assert_close(many[:, k], critic(state, cands[k]), rtol=1e-5, atol=1e-5)
    assert torch.allclose(seen["executed"], action)
    assert torch.allclose(seen["residual"], torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(seen["residual_std"], torch.tensor([[10.0, -10.0]]))
    with pytest.raises(ValueError, match="refit: expected treatments"):
        ActionInputCritic(inner, "raw", slice(1, 3), 0.3, 0.1)
    with pytest.raises(ValueError, match="exploration_std, which is 0"):
        ActionInputCritic(inner, "residual_std", slice(1, 3), 0.3, 0.0)


def test_refits_are_compared_on_the_same_split_half_pairs_with_a_paired_interval():
    """Every refit ranks the same candidates: its share of the split halves' pairs ranked right
    minus the run's critic's and minus the ``executed`` refit's, paired per state."""
    from arli.bench.critic import refit_contrasts

    def state(seed, good_right, exec_right, run_right):
        def q(right):  # a Q ordering x above y (right) or below
            return (0.9, 0.1) if right else (0.1, 0.9)
        gx, gy, ex, ey, rx, ry = *q(good_right), *q(exec_right), *q(run_right)
        return {"source": "policy", "phase": "early", "t": 10, "seed": seed, "candidates": {
            "x": {"runs": [1.0, 1.0], "mc": 1.0, "q": rx, "q_refit": {"executed": ex, "residual_std": gx}},
            "y": {"runs": [0.0, 0.0], "mc": 0.0, "q": ry, "q_refit": {"executed": ey, "residual_std": gy}}}}

    # 10 states on 10 episodes: residual_std right on all, executed on 6, the run's critic on 5
    states = [state(i, True, i < 6, i < 5) for i in range(10)]
    out = refit_contrasts(states)
    assert set(out) == {"executed", "residual_std"}
    assert out["residual_std"]["ranking"]["split_half"]["critic"] == 1.0
    assert out["executed"]["ranking"]["split_half"]["critic"] == pytest.approx(0.6)
    assert out["residual_std"]["vs_executed"]["diff"] == pytest.approx(0.4)
    assert out["residual_std"]["vs_run_critic"]["diff"] == pytest.approx(0.5)
    lo, hi = out["residual_std"]["vs_executed"]["ci95"]
    assert 0.0 < lo <= 0.4 <= hi <= 0.8  # over 10 episodes: not 0, not exactly 0.4
    assert "vs_executed" not in out["executed"]  # the control is not compared with itself
    # without the control, or with a refit that diverged, the rest is still compared
    alone = [{**st, "candidates": {k: {**c, "q_refit": {"residual_std": c["q_refit"]["residual_std"], "residual": None}}
                                   for k, c in st["candidates"].items()}} for st in states]
    out_alone = refit_contrasts(alone)
    assert out_alone["residual"] == {"diverged": True} and "vs_executed" not in out_alone["residual_std"]
    assert out_alone["residual_std"]["vs_run_critic"] == out["residual_std"]["vs_run_critic"]
    plain = [{**st, "candidates": {k: {kk: vv for kk, vv in c.items() if kk != "q_refit"}
                                   for k, c in st["candidates"].items()}} for st in states]
    assert refit_contrasts(plain) == {}  # a report without refits


def test_refit_settings_are_checked_before_anything_runs():
    from arli.config import BenchCriticConfig
    from arli.errors import ConfigError

    with pytest.raises(ConfigError, match="refit"):
        BenchCriticConfig(runs=["a"], refit=["executed", "raw"]).validate()
    with pytest.raises(ConfigError, match="refit"):
        BenchCriticConfig(runs=["a"], refit=["residual", "residual"]).validate()
    with pytest.raises(ConfigError, match="refit_updates"):
        BenchCriticConfig(runs=["a"], refit=["residual"], refit_updates=0).validate()
    with pytest.raises(ConfigError, match="repeats: .*>= 2 with refit"):
        BenchCriticConfig(runs=["a"], refit=["residual"]).validate()
    BenchCriticConfig(runs=["a"], refit=["executed", "residual_std"], repeats=2).validate()
    from arli.config import parse_refit

    assert parse_refit("residual:critic_heads=10,anchor_ratio=0") == ("residual", {"critic_heads": 10,
                                                                                  "anchor_ratio": 0.0})
    assert parse_refit("executed") == ("executed", {})
    with pytest.raises(ConfigError, match="gamma and n_step are fixed by the replay"):
        parse_refit("executed:gamma=0.9")
    with pytest.raises(ConfigError, match="critic_heads as int"):
        parse_refit("executed:critic_heads=many")
    with pytest.raises(ConfigError, match="refit"):
        BenchCriticConfig(runs=["a"], refit=["executed", "executed:tau"], repeats=2).validate()
    with pytest.raises(ConfigError, match=r"tau twice"):
        parse_refit("executed:tau=0.1,tau=0.2")
    with pytest.raises(ConfigError, match="distinct critics"):
        BenchCriticConfig(runs=["a"], refit=["executed", "executed:"], repeats=2).validate()
    with pytest.raises(ConfigError, match="distinct critics"):
        BenchCriticConfig(runs=["a"], refit=["residual:tau=0.01", "residual:tau=0.010"], repeats=2).validate()


def test_a_report_with_refits_shows_them_and_is_rebuilt_only_by_the_same_refits(saved_runs, monkeypatch, tmp_path, capsys):
    import json

    import arli.bench.critic as critic
    from arli.config import BenchCriticConfig
    from arli.errors import ConfigError

    def cand(runs, q, qr):
        return {"mc": float(np.mean(runs)), "q": q, "runs": runs, "q_refit": {"executed": q, "residual": qr}}

    states = [{"source": "policy", "phase": "early", "t": 10 * i, "seed": i,
               "candidates": {"residual": cand([1.0, 1.0], 0.2, 0.9), "base": cand([0.0, 0.0], 0.8, 0.1)}}
              for i in range(4)]
    settings = {"critic_heads": 4, "critic_hidden": 128, "utd": 1, "critic_warmup_updates": 2000, "gamma": 0.99,
                "n_step": 3, "exploration_std": 0.1}
    run = {"run": "runs/a", "env": "peg_insert", "variant": "arli", "delay_steps": 8, "env_steps": 10,
           "settings": settings, "seeds": {"split": "tune", "seed_base": 10_000, "episodes": 4}, "repeats": 2,
           **critic.summarize(states, ["policy"]), "states": states}
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: [json.loads(json.dumps(run))])
    cfg = dict(runs=["runs/a"], episodes=4, states=4, repeats=2, refit=["executed", "residual"], refit_updates=50,
               name="c", report_dir=str(tmp_path))
    assert critic.main(BenchCriticConfig(**cfg)) == 0
    md = (tmp_path / "c.md").read_text()
    assert "'refit=[executed, residual]' refit_updates=50 name=c" in md
    assert "| `runs/a` | residual | +1.00 [+1.00, +1.00] | 1.00 / 1.00 (4) | +0.00 [+0.00, +0.00] | " \
           "1.00 [1.00, 1.00] | +1.00 [+1.00, +1.00] |" in md
    out = capsys.readouterr().out
    assert "| `runs/a` | residual | +1.00" in out and "## `runs/a`" not in out  # the refits on the console too
    monkeypatch.setattr(critic, "judge_runs", lambda cfg, sources: pytest.fail("report_only rolled out"))
    assert critic.main(BenchCriticConfig(**cfg, report_only=True)) == 0
    with pytest.raises(ConfigError, match=r"refit=\[\] \(the report's: \['executed', 'residual'\]\)"):
        critic.main(BenchCriticConfig(**{**cfg, "refit": []}, report_only=True))
    with pytest.raises(ConfigError, match=r"refit_updates=60 \(the report's: 50\)"):
        critic.main(BenchCriticConfig(**{**cfg, "refit_updates": 60}, report_only=True))


def test_a_refit_learns_the_returns_of_its_replay_and_leaves_the_residual_alone():
    """On a replay where one exploration step's sign decides the return, a refit critic with the
    action at the data's scale ranks the two moves at held-out states; the run's residual (the
    policy it evaluates) is not trained."""
    from types import SimpleNamespace

    import torch

    from arli.bench.critic_refit import refit_critic
    from arli.rl.config import LearnerConfig
    from arli.rl.learner import ResidualLearner
    from arli.rl.replay import ReplayBuffer

    D, m, scale, std = 6, 2, 0.3, 0.1
    lc = LearnerConfig(critic_heads=2, critic_hidden=32, batch_size=64, residual_scale=scale, exploration_std=std,
                       q_min=0.0, q_max=1.0)
    rng = np.random.default_rng(0)

    def rows(n):
        s = rng.standard_normal((n, D)).astype(np.float32)
        s[:, 2:4] = rng.uniform(-0.5, 0.5, (n, m))  # the base action b
        sign = rng.choice([-1.0, 1.0], n).astype(np.float32)
        a = s[:, 2:4] + scale * std * sign[:, None]  # one exploration step off the base, either way
        return s, a, (sign > 0).astype(np.float32)

    online = ReplayBuffer(2000, D, m)
    s, a, ret = rows(2000)
    for i in range(2000):  # one-step episodes: the return is the reward
        online.add({"state": s[i], "base": s[i, 2:4], "action": a[i], "ret": ret[i], "next_state": s[i],
                    "next_base": s[i, 2:4], "discount": 0.0})
    src = ResidualLearner(lc, D, m, seed=1)
    actor_before = {k: v.clone() for k, v in src.actor.state_dict().items()}
    ft = SimpleNamespace(spec=SimpleNamespace(learner=lc), learner=src, online=online, anchor=ReplayBuffer(10, D, m),
                         builder=SimpleNamespace(layout=SimpleNamespace(base_action=slice(2, 4))))
    torch.manual_seed(0)
    refit = refit_critic(ft, "residual_std:critic_hidden=24", updates=400, seed=0)
    s, a, ret = rows(200)  # held-out states
    q = refit.q_value(s, a)
    assert np.mean((q > 0.5) == (ret > 0.5)) > 0.9
    assert all(torch.equal(v, refit.actor.state_dict()[k]) for k, v in actor_before.items())
    assert refit.critic is not src.critic and refit.critic.inner.w1.shape == (D + m, 2, 24)  # the setting applied


def test_the_residual_candidate_is_the_actors_proposal_not_the_value_gated_pick():
    """A value-gated learner executes the critic's argmax over candidates that include the base:
    judged as "the residual", that pick's Q would be >= the base's by construction. The ranked
    residual is the actor's own r(s) (clipped with the base as executed), whatever the critic says."""
    from types import SimpleNamespace

    import torch

    from arli.bench.critic import _candidates
    from arli.rl.config import LearnerConfig
    from arli.rl.learner import ResidualLearner

    D, m = 12, 3
    cfg = LearnerConfig(critic_warmup_updates=0)
    learner = ResidualLearner(cfg, D, m, seed=0)
    torch.nn.init.normal_(learner.actor.net[-1].weight, std=1.0)  # a residual that moves
    learner.updates = 1  # past the warm-up: acting is value-gated
    ft = SimpleNamespace(learner=learner, expert=None, spec=SimpleNamespace(learner=cfg),
                         env=SimpleNamespace(action_space=SimpleNamespace(shape=(m,))))
    pick = _candidates(ft, perturbations=0, sigma=0.5, rng=np.random.default_rng(0))["residual"]
    rng = np.random.default_rng(1)
    overruled = 0
    for _ in range(20):
        s, b = rng.standard_normal(D).astype(np.float32), rng.uniform(-0.9, 0.9, m).astype(np.float32)
        with torch.no_grad():
            r = learner.actor(torch.as_tensor(s)[None])[0].numpy()
        want = (np.clip(b + cfg.residual_scale * r, -1, 1) - b) / cfg.residual_scale
        np.testing.assert_allclose(pick(s, b, None), want, atol=1e-6)
        gated = (learner.act(s, b, explore=False) - b) / cfg.residual_scale
        overruled += int(not np.allclose(gated, want, atol=1e-6))
    assert overruled > 0  # the gated pick differs: the test tells the two apart
