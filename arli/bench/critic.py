"""``arli bench critic 'runs=[<run dir>, ...]'``: does a finetune run's critic rank actions?

From states the run's residual visits (and states the scripted expert visits, as its
demonstrations do), the whole sim episode — MuJoCo state, scheduler, requests in flight,
the base's sampling generator — is copied, and K candidate residuals are tried from it: the
residual's own ``r(s)``, ``r(s)`` with one draw of the run's exploration noise (what training
executed there), zero (the base alone), the expert projected into the bound, and
``perturbations`` random moves of ``r(s)``. Each candidate runs for one step and the run's
residual continues (deterministic) to the episode's end: the discounted return is a
Monte-Carlo Q(s, a). The critic's mean-head Q(s, a) of the same candidates is then judged by
pairwise ranking accuracy (pairs whose returns differ), Spearman correlation per state,
top-1 (is its favourite the best?) and calibration, per state source and task phase.

One continuation is one draw of the base's sampling noise: on a contact-rich task a return
from it is a noisy label. ``repeats`` > 1 rolls every candidate out again under fresh draws
(the same draws for every candidate) and takes the mean; the labels' own reliability is then
measured by split halves (the mean of the odd repeats ranking the mean of the even ones),
next to the critic ranking the same half. Half A is a noisy label too, so its share is a lower
bound on what a critic knowing the expected returns would reach, and labels - critic a lower
bound on the critic's shortfall.

Several runs made at different learner settings (heads, width, UTD, warm-up, gamma, n)
are judged on their own states, each with its settings. Sim state restore is a diagnostic
only: no learner uses it (a robot cannot restore a state).
"""

from __future__ import annotations

import copy
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np
from tqdm import tqdm

from arli.bench.common import figure, machine_info, publish, run_configs
from arli.config import BenchCriticConfig
from arli.interfaces import StepController
from arli.types import Observation, StepInfo

PHASES = ("early", "middle", "late")  # thirds of the episode's step limit
# split halves per size of the return difference: a step sooner or later (gamma^k apart) / more /
# a success against a failure
GAPS = (0.01, 0.1)


class FirstStepForced(StepController):
    """Executes candidate ``pick(s, b, obs)`` (residual units, (m,)) at its first step and
    records (s, a); afterwards ``inner`` acts. Sums the discounted reward from that step on."""

    def __init__(self, inner, builder, scale: float, gamma: float, pick):
        self.inner, self.builder, self.scale, self.gamma, self.pick = inner, builder, scale, gamma, pick
        self.first: tuple[np.ndarray, np.ndarray] | None = None  # (ARLI state (D,), executed action (m,))
        self.ret, self.k = 0.0, 0

    def begin_episode(self) -> None:
        self.inner.begin_episode()

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        if self.first is not None:
            return self.inner.act(t, obs, info)
        state = self.builder.build(obs.state, info)
        base = np.asarray(info.base_action, np.float32)
        r = np.clip(self.pick(state, base, obs), -1.0, 1.0)
        action = np.clip(base + self.scale * r, -1.0, 1.0).astype(np.float32)
        self.first = (state, action)
        return action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        self.ret += self.gamma ** self.k * float(reward)
        self.k += 1
        if self.k > 1:
            self.inner.after_step(t, reward, terminated, truncated)

    def end(self, obs, info, terminated: bool, truncated: bool) -> None:
        self.inner.end(obs, info, terminated, truncated)


def _candidates(ft, perturbations: int, sigma: float, rng: np.random.Generator) -> dict:
    """Candidate rules name -> pick(s, b, obs) -> r (m,): the residual (the actor's r(s), not a
    value-gated choice), the residual with one draw of the run's own exploration noise (an
    action as training executed it), the base, the expert projected into the bound, and fixed
    random moves of the residual (one draw per state)."""
    import torch  # noqa: PLC0415

    from arli.policies.residual_np import compose_numpy  # noqa: PLC0415

    learner, scale = ft.learner, ft.spec.learner.residual_scale

    def policy(s, b, obs):
        # the actor's own proposal r(s), as executed (clipped into [-1, 1] with the base), never
        # the value-gated pick: that is the critic's argmax over candidates that include the
        # base, so its Q would be >= the base's by construction and flatter the ranking
        with torch.no_grad():
            r = learner.actor(torch.as_tensor(s, dtype=torch.float32, device=learner.device)[None])[0]
        return (compose_numpy(b, r.cpu().numpy(), scale) - b) / scale

    m = ft.env.action_space.shape[0]
    explore = (rng.standard_normal(m) * ft.spec.learner.exploration_std).astype(np.float32)
    picks = {"residual": policy, "explored": lambda s, b, obs: policy(s, b, obs) + explore,
             "base": lambda s, b, obs: np.zeros_like(b)}
    if ft.expert is not None:
        picks["expert"] = lambda s, b, obs: (np.asarray(ft.expert(obs.state), np.float32) - b) / scale
    for k in range(perturbations):
        u = rng.standard_normal(m)
        u *= sigma / max(np.linalg.norm(u), 1e-9) * np.sqrt(m)  # sigma per entry, on average
        picks[f"perturbed_{k}"] = (lambda du: lambda s, b, obs: policy(s, b, obs) + du)(u.astype(np.float32))
    return picks


def _snapshots(ft, source: str, seeds: list[int], every: int, limit: int) -> list[tuple]:
    """(episode copy before step t, t, seed) every ``every`` steps of roll-ins driven by the
    run's residual (``policy``) or by the scripted expert (``expert``)."""
    from arli.bench.ceiling import ProjectedExpert  # noqa: PLC0415
    from arli.rollout import sim_episode  # noqa: PLC0415

    memo_keep = (ft.base, ft.learner, ft.builder, ft.expert)
    out = []
    for seed in seeds:
        ctl = ft.evaluation_controller() if source == "policy" else \
            ProjectedExpert(ft.expert, 2.0, grip_authority=True)  # bound 2 covers [-1, 1]: the expert itself
        episode = sim_episode(ft.env, ft.base, ft.scheduler, ft.latency, np.random.default_rng(seed), seed, ctl)
        while not episode.done and len(out) < limit:
            if episode.t % every == 0 and episode.t > 0:
                gen = getattr(ft.base, "_gen", None)
                out.append((_copy(episode, memo_keep), episode.t, seed,
                            None if gen is None else gen.get_state()))
            episode.step()
        episode.finish()
        if len(out) >= limit:
            break
    return out


def _copy(episode, keep):
    return copy.deepcopy(episode, {id(x): x for x in keep if x is not None})


def monte_carlo(ft, snapshot, picks: dict, gamma: float, repeats: int = 1) -> dict:
    """Every candidate from one snapshot: its MC return (the mean over ``repeats`` rollouts,
    each listed in ``runs``) and the critic's Q of it. Repeat 0 continues with the base's noise
    as the roll-in left it; repeat j > 0 with a fresh draw seeded by (episode seed, t, j); every
    candidate of a repeat sees the same draw (common random numbers). Q and the action are
    repeat 0's (the first step's base action is the same in every repeat unless a chunk lands
    at that very step)."""
    episode0, t, seed, gen_state = snapshot
    scale = ft.spec.learner.residual_scale
    learner_state = ft.learner.generator.get_state()
    rows: dict[str, dict] = {}
    for j in range(repeats):
        for name, pick in picks.items():
            episode = _copy(episode0, (ft.base, ft.learner, ft.builder, ft.expert))
            if gen_state is not None:
                ft.base._gen.set_state(gen_state)
                if j:
                    ft.base._gen.manual_seed(int(np.random.SeedSequence([seed, t, j]).generate_state(1)[0]))
            ft.learner.generator.set_state(learner_state)  # and the learner's (value gating draws from it)
            inner = ft.evaluation_controller()
            inner.begin_episode()
            forced = FirstStepForced(inner, ft.builder, scale, gamma, pick)
            episode.ctl = forced
            while not episode.done:
                episode.step()
            episode.finish()
            if j == 0:
                state, action = forced.first
                rows[name] = {"q": float(ft.learner.q_value(state[None], action[None])[0]), "action": action,
                              "state": state, "runs": []}
            rows[name]["runs"].append(forced.ret)
    for row in rows.values():
        row["mc"] = float(np.mean(row["runs"]))
    return rows


def _pair_tallies(st: dict, edges: tuple, tol: float) -> np.ndarray:
    """One state's split-half tallies per gap bin (bins, 3): pairs, labels right, critic right."""
    a = np.array([np.mean(v["runs"][1::2]) for v in st.values()])
    b = np.array([np.mean(v["runs"][0::2]) for v in st.values()])
    q = np.array([v["q"] for v in st.values()])
    tally = np.zeros((len(edges) - 1, 3))
    for i in range(len(b)):
        for j in range(i + 1, len(b)):
            gap = abs(b[i] - b[j])
            if gap <= tol:
                continue
            sign = np.sign(b[i] - b[j])
            tally[int(np.searchsorted(edges, gap, side="left")) - 1] += (
                1, 0.5 if abs(a[i] - a[j]) <= tol else float(np.sign(a[i] - a[j]) == sign),
                float(np.sign(q[i] - q[j]) == sign))
    return tally


def _resampled(rows: np.ndarray, episodes: list | None, resamples: int) -> np.ndarray:
    """Bootstrap sums of per-state tallies ``rows`` (S, k): roll-in episodes (``episodes``, one
    id per state; None: states) drawn with replacement, their states' rows summed -> (resamples, k)."""
    ids = list(range(len(rows))) if episodes is None else list(episodes)
    keys = list(dict.fromkeys(ids))
    clusters = np.stack([rows[[i for i, e in enumerate(ids) if e == k]].sum(axis=0) for k in keys])
    rng = np.random.default_rng(0)
    return clusters[rng.integers(0, len(clusters), (resamples, len(clusters)))].sum(axis=1)


def _kind(name: str) -> str:
    """A candidate's kind: ``perturbed_3`` -> ``perturbed``; the others are their own."""
    return name.split("_")[0] if name.startswith("perturbed_") else name


def _kind_tallies(st: dict, tol: float) -> dict[tuple[str, str], np.ndarray]:
    """One state's split-half tallies (pairs, labels right, critic right) per pair of candidate
    kinds, e.g. (base, perturbed): which comparisons the critic misses."""
    names = list(st)
    out: dict[tuple[str, str], np.ndarray] = {}
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            pair = {names[i]: st[names[i]], names[j]: st[names[j]]}
            t = _pair_tallies(pair, (tol, np.inf), tol)[0]
            if t[0]:
                key = tuple(sorted((_kind(names[i]), _kind(names[j]))))
                out[key] = out.get(key, np.zeros(3)) + t
    return out


def split_half(states: list[dict], tol: float = 1e-6, resamples: int = 2000,
               episodes: list | None = None) -> dict | None:
    """How well the labels rank themselves: over pairs whose mean return over the even repeats
    (half B) differs, the share the mean over the odd repeats (half A) orders the same way (a tie
    in A counts 1/2), and the share the critic's Q orders that way; overall and per size of the
    half-B difference (``by_gap``, edges ``GAPS``) and per pair of candidate kinds (``by_pair``:
    the perturbations, moves beyond the run's exploration, against the rest). ``shortfall``:
    labels - critic. Half A is a noisy label itself, so its share is a lower bound on what a
    critic knowing the expected returns would reach, and the shortfall a lower bound on the
    critic's. 95% intervals: a bootstrap over roll-in episodes (``episodes``, one id per state;
    states of one episode share its history; None: every state its own). None unless every
    candidate has >= 2 repeats."""
    if not states or any(len(v.get("runs", ())) < 2 for st in states for v in st.values()):
        return None
    edges = (tol, *GAPS, np.inf)
    per_state = np.stack([_pair_tallies(st, edges, tol) for st in states])  # (S, bins, 3)

    def share(n, right):
        return float(right / n) if n else None

    total = per_state.sum(axis=(0, 1))
    out = {"pairs": int(total[0]), "labels": share(total[0], total[1]), "critic": share(total[0], total[2]),
           "by_gap": [{"gap": [float(lo), None if np.isinf(hi) else float(hi)], "pairs": int(n),
                       "labels": share(n, lab), "critic": share(n, cri)}
                      for lo, hi, (n, lab, cri) in zip(edges[:-1], edges[1:], per_state.sum(axis=0))]}
    by_pair: dict[tuple[str, str], np.ndarray] = {}
    for st in states:
        for (x, y), t in _kind_tallies(st, tol).items():
            by_pair[(x, y)] = by_pair.get((x, y), np.zeros(3)) + t
    out["by_pair"] = [{"pair": list(k), "pairs": int(n), "labels": share(n, lab), "critic": share(n, cri)}
                      for k, (n, lab, cri) in sorted(by_pair.items())]
    if total[0]:
        out["shortfall"] = out["labels"] - out["critic"]
        boot = _resampled(per_state.sum(axis=1), episodes, resamples)  # (resamples, 3)
        boot = boot[boot[:, 0] > 0]
        lab, cri = boot[:, 1] / boot[:, 0], boot[:, 2] / boot[:, 0]
        for key, x in (("labels_ci95", lab), ("critic_ci95", cri), ("shortfall_ci95", lab - cri)):
            out[key] = [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))]
    return out


def ranking(states: list[dict], tol: float = 1e-6, episodes: list | None = None) -> dict:
    """Pairwise accuracy, Spearman, top-1 and calibration over states (each: name -> {mc, q});
    95% bootstrap interval of the pairwise accuracy over roll-in episodes (``episodes``, one id
    per state; None: over states)."""
    correct, total, per_state, spear, top1, q_all, g_all, tallies = 0, 0, [], [], [], [], [], []
    for st in states:
        g = np.array([v["mc"] for v in st.values()])
        q = np.array([v["q"] for v in st.values()])
        q_all += list(q)
        g_all += list(g)
        c = n = 0
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                if abs(g[i] - g[j]) > tol:
                    n += 1
                    c += int(np.sign(q[i] - q[j]) == np.sign(g[i] - g[j]))
        correct, total = correct + c, total + n
        tallies.append((c, n))
        if n:
            per_state.append((c, n))
            rg, rq = np.argsort(np.argsort(g)), np.argsort(np.argsort(q))
            spear.append(float(np.corrcoef(rg, rq)[0, 1]) if np.std(rq) > 0 else 0.0)
            top1.append(float(g[int(np.argmax(q))] >= g.max() - tol))
    out = {"states": len(states), "states_with_ranked_pairs": len(per_state), "pairs": total,
           "pairwise_accuracy": correct / total if total else None,
           "spearman": float(np.mean(spear)) if spear else None, "top1": float(np.mean(top1)) if top1 else None,
           "q_mean": float(np.mean(q_all)) if q_all else None, "mc_mean": float(np.mean(g_all)) if g_all else None,
           "q_mc_corr": float(np.corrcoef(q_all, g_all)[0, 1]) if len(q_all) > 2 and np.std(g_all) > 0 else None,
           "split_half": split_half(states, tol, episodes=episodes)}
    if per_state:
        boot = _resampled(np.array(tallies, float), episodes, 2000)
        acc = boot[boot[:, 1] > 0, 0] / boot[boot[:, 1] > 0, 1]
        out["pairwise_accuracy_ci95"] = [float(np.percentile(acc, 2.5)), float(np.percentile(acc, 97.5))]
    return out


def check_repeats(ft, repeats: int, run_dir: str) -> None:
    """Refuse ``repeats`` > 1 on a base that draws no sampling noise (a scripted expert, a
    deterministic LeRobot policy): its repeats would all be the same rollout, and split halves
    of identical labels would claim a perfect ranking."""
    if repeats > 1 and getattr(ft.base, "_gen", None) is None:
        from arli.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(f"repeats: {repeats} asks for fresh draws of the base's sampling noise, but the base of "
                          f"{run_dir} ({type(ft.base).__name__}) draws none: every repeat would be the same rollout; "
                          "use repeats=1 with it")


def roll_in_seeds(spec, seed_base: int | None, episodes: int) -> list[int]:
    """The roll-in episodes' seeds: the run's tune seeds, or ``seed_base``.. where that range
    stays clear of the test seeds (a diagnostic that judges settings never sees those), at least
    the ``REPORTED_TEST_EPISODES`` that reported numbers use even where the run evaluated fewer."""
    from arli.rl.config import REPORTED_TEST_EPISODES, disjoint  # noqa: PLC0415

    if seed_base is None:
        return list(range(spec.tune_seed, spec.tune_seed + episodes))
    seeds, run_test = range(seed_base, seed_base + episodes), spec.test_range()
    test = range(run_test.start, max(run_test.stop, run_test.start + REPORTED_TEST_EPISODES))
    if not disjoint(seeds, test):
        from arli.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(f"seed_base: {seeds.start}..{seeds.stop - 1} overlaps the test seeds {test.start}.."
                          f"{test.stop - 1}, which only final numbers may use; leave seed_base unset "
                          f"(the run's tune seeds {spec.tune_seed}..) or move it clear of them")
    return list(seeds)


def judge_run(run_dir: str, cfg: BenchCriticConfig, bar=None) -> dict:
    """One run's critic against Monte-Carlo returns on its own states; ``bar`` (optional)
    advances by one per judged state."""
    from arli.runs import make_finetuner  # noqa: PLC0415

    (run_cfg,) = run_configs([run_dir])
    ft, name, delay = make_finetuner(run_cfg)
    ft.load(os.path.join(run_dir, "checkpoint"))
    check_repeats(ft, cfg.repeats, run_dir)
    spec, lc = run_cfg.run, run_cfg.run.learner
    seeds = roll_in_seeds(spec, cfg.seed_base, cfg.episodes)
    seed_base = seeds[0]
    rng = np.random.default_rng(cfg.seed)
    sources = ["policy"] + (["expert"] if ft.expert is not None else [])
    T = ft.env.unwrapped.max_episode_steps
    states, inputs = [], []  # inputs: (ARLI state (D,), executed action (m,)) of every candidate, in order
    for source in sources:
        for snap in _snapshots(ft, source, seeds, cfg.every, cfg.states):
            rows = monte_carlo(ft, snap, _candidates(ft, cfg.perturbations, cfg.perturb_scale, rng), lc.gamma,
                               cfg.repeats)
            phase = PHASES[min(int(3 * snap[1] / T), 2)]
            states.append({"source": source, "phase": phase, "t": snap[1], "seed": snap[2],
                           "candidates": {k: {"mc": v["mc"], "q": v["q"], "runs": v["runs"]}
                                          for k, v in rows.items()}})
            inputs += [(v["state"], v["action"]) for v in rows.values()]
            if bar is not None:
                bar.update(1)
    if cfg.refit and inputs:
        _score_refits(ft, cfg, states, inputs, progress=bar is not None)
    return {"run": run_dir, "env": name, "delay_steps": delay, "variant": spec.variant, "env_steps": ft.env_steps,
            "settings": {"critic_heads": lc.critic_heads, "critic_hidden": lc.critic_hidden, "utd": lc.utd,
                         "critic_warmup_updates": lc.critic_warmup_updates, "gamma": lc.gamma, "n_step": lc.n_step,
                         "exploration_std": lc.exploration_std, "actor_update": lc.actor_update},
            "seeds": {"split": "tune" if cfg.seed_base is None else "given", "seed_base": seed_base,
                      "episodes": cfg.episodes}, "repeats": cfg.repeats, **summarize(states, sources), "states": states}


def _score_refits(ft, cfg: BenchCriticConfig, states: list[dict], inputs: list[tuple], progress: bool) -> None:
    """Every candidate of ``states`` gets ``q_refit`` {treatment: Q} from a fresh critic per
    treatment of ``cfg.refit`` (critic_refit.py), ``inputs`` its (state, action) in order."""
    from arli.bench.critic_refit import refit_scores  # noqa: PLC0415

    s, a = (np.stack(x) for x in zip(*inputs))
    with tqdm(total=len(cfg.refit) * cfg.refit_updates, desc="refit critics", unit="update", mininterval=2.0,
              disable=not progress) as bar:
        scores = refit_scores(ft, cfg.refit, cfg.refit_updates, s, a, seed=cfg.seed, bar=bar)
    i = 0
    for st in states:
        for cand in st["candidates"].values():
            cand["q_refit"] = {t: None if q is None else float(q[i]) for t, q in scores.items()}
            i += 1


def _as_refit(states: list[dict], treatment: str) -> list[dict]:
    """``states`` with each candidate's ``q`` the refit critic's of ``treatment``."""
    return [{**st, "candidates": {k: {**c, "q": c["q_refit"][treatment]} for k, c in st["candidates"].items()}}
            for st in states]


def refit_contrasts(states: list[dict], tol: float = 1e-6, resamples: int = 2000) -> dict:
    """Per refit treatment, its ranking (``ranking``) and, on the split halves' pairs (the same
    pairs for every critic), its share right minus the run's own critic's and minus the
    ``executed`` refit's (the control: a fresh critic on the same data and input), each with a
    95% bootstrap interval over roll-in episodes. {} when no candidate has refits."""
    if not states or "q_refit" not in next(iter(states[0]["candidates"].values())):
        return {}
    treatments = [t for t, q in next(iter(states[0]["candidates"].values()))["q_refit"].items() if q is not None]
    episodes = _episodes(states)
    out = {}
    diverged = [t for t, q in next(iter(states[0]["candidates"].values()))["q_refit"].items() if q is None]
    out.update({t: {"diverged": True} for t in diverged})
    for t in treatments:
        res = {"ranking": ranking([st["candidates"] for st in _as_refit(states, t)], tol, episodes)}
        if res["ranking"].get("split_half"):
            others = [("vs_run_critic", states)]
            if "executed" in treatments and t != "executed":
                others.insert(0, ("vs_executed", _as_refit(states, "executed")))
            for name, other in others:
                mine = [_pair_tallies(st["candidates"], (tol, np.inf), tol)[0] for st in _as_refit(states, t)]
                theirs = [_pair_tallies(st["candidates"], (tol, np.inf), tol)[0] for st in other]
                rows = np.array([[m[0], m[2], o[2]] for m, o in zip(mine, theirs)])  # pairs, right, right
                boot = _resampled(rows, episodes, resamples)
                boot = boot[boot[:, 0] > 0]
                diff = (boot[:, 1] - boot[:, 2]) / boot[:, 0]
                total = rows.sum(axis=0)
                res[name] = {"diff": float((total[1] - total[2]) / total[0]) if total[0] else None,
                             "ci95": [float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))]
                             if len(diff) else None}
        out[t] = res
    return out


def _episodes(states: list[dict]) -> list[tuple]:
    """The roll-in episode each judged state was taken from: (source, episode seed)."""
    return [(s["source"], s["seed"]) for s in states]


def summarize(states: list[dict], sources: list[str]) -> dict:
    """A run's metrics from its judged states (each: source, phase, candidates name -> {mc, q,
    runs}): ``overall``, ``by_source``, ``by_phase`` (``ranking`` each) and ``by_candidate``
    (mean Monte-Carlo return and mean Q per candidate)."""
    cands = [s["candidates"] for s in states]
    by = {"source": {}, "phase": {}}
    for key, values in (("source", sources), ("phase", PHASES)):
        for v in values:
            chosen = [s for s in states if s[key] == v]
            if chosen:
                by[key][v] = ranking([s["candidates"] for s in chosen], episodes=_episodes(chosen))
    per_candidate = {k: {"mc_mean": float(np.mean([c[k]["mc"] for c in cands])),
                         "q_mean": float(np.mean([c[k]["q"] for c in cands]))} for k in cands[0]} if cands else {}
    return {"overall": ranking(cands, episodes=_episodes(states)), "by_source": by["source"], "by_phase": by["phase"],
            "by_candidate": per_candidate, "refits": refit_contrasts(states)}


def _fmt(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def _shortfall(sh: dict) -> str:
    """What the critic leaves of what its labels allow, with its interval: ``+0.25 [+0.18, +0.31]``."""
    ci = sh.get("shortfall_ci95")
    return "—" if ci is None else f"{sh['shortfall']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _contrast(c: dict | None) -> str:
    """A paired difference with its interval: ``+0.12 [+0.05, +0.19]``."""
    if not c or c.get("diff") is None:
        return "—"
    ci = c.get("ci95")
    return f"{c['diff']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")


def _judge_alone(run_dir: str, cfg: BenchCriticConfig) -> dict:
    """``judge_run`` in a worker process, on one torch thread."""
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    return judge_run(run_dir, cfg)


def judge_runs(cfg: BenchCriticConfig, sources: int) -> list[dict]:
    """Every run of ``cfg.runs`` judged, ``cfg.workers`` at a time, in ``cfg.runs``' order."""
    if cfg.workers == 1 or len(cfg.runs) == 1:
        with tqdm(total=len(cfg.runs) * sources * cfg.states, desc="states", unit="state", mininterval=1.0) as bar:
            return [judge_run(run, cfg, bar) for run in cfg.runs]
    results: dict[str, dict] = {}
    with ProcessPoolExecutor(min(cfg.workers, len(cfg.runs))) as pool:
        futures = {pool.submit(_judge_alone, run, cfg): run for run in cfg.runs}
        for fut in tqdm(as_completed(futures), total=len(futures), desc="runs judged", unit="run"):
            try:
                results[futures[fut]] = fut.result()
            except Exception as exc:  # say which run, and do not judge the rest for nothing
                for other in futures:
                    other.cancel()
                raise RuntimeError(f"runs: judging {futures[fut]} failed: {type(exc).__name__}: {exc}") from exc
    return [results[run] for run in cfg.runs]


def rebuilt(cfg: BenchCriticConfig) -> tuple[list[dict], str]:
    """The runs of ``reports/<name>.json`` with every metric recomputed from their judged states,
    and the machine that judged them. Refused unless the command is the one that wrote it."""
    from arli.errors import ConfigError  # noqa: PLC0415

    path = os.path.join(cfg.report_dir, f"{cfg.name}.json")
    if not os.path.exists(path):
        raise ConfigError(f"report_only: no {path} to rebuild; run the command without report_only=true first")
    with open(path) as fh:
        saved = json.load(fh)
    runs = saved.get("runs", [])
    # reports written before `states` was stored: the most states one source gave (a source that
    # ran out of roll-in steps gives fewer); `seed` (the perturbations' draws) cannot be recovered
    # from them and is taken from the command
    most = max((sum(s["source"] == src for s in r["states"]) for r in runs
                for src in {s["source"] for s in r["states"]}), default=cfg.states)
    stored = {"runs": [r.get("run") for r in runs], "every": saved.get("every"),
              "perturbations": saved.get("perturbations"), "perturb_scale": saved.get("perturb_scale"),
              "states": saved.get("states", most), "seed": saved.get("seed", cfg.seed), "refit": saved.get("refit", [])}
    if stored["refit"]:
        stored["refit_updates"] = saved.get("refit_updates")
    for r in runs:
        stored.setdefault("repeats", r.get("repeats", 1))
        stored.setdefault("episodes", r["seeds"]["episodes"])
        stored.setdefault("seed_base", None if r["seeds"]["split"] == "tune" else r["seeds"]["seed_base"])
    wrong = [f"{k}={getattr(cfg, k)!r} (the report's: {v!r})" for k, v in stored.items() if getattr(cfg, k) != v]
    if wrong:
        raise ConfigError(f"report_only: {path} was written by another command ({'; '.join(wrong)}); give the "
                          "command its first line shows, plus report_only=true")
    for r in runs:
        r.update(summarize(r["states"], list(dict.fromkeys(s["source"] for s in r["states"]))))
    return runs, saved.get("machine") or "not stored"


def main(cfg: BenchCriticConfig) -> int:
    import torch  # noqa: PLC0415

    from arli.errors import ConfigError  # noqa: PLC0415

    if not cfg.runs:
        raise ConfigError("runs: expected at least one `arli finetune` run directory, e.g. "
                          "'runs=[outputs/finetune_peg_insert_arli_d8_<time>]'")
    torch.set_num_threads(1)
    if not cfg.report_only:  # a missing run or an overlapping seed_base: refused before any run is judged
        for run_cfg in run_configs(list(cfg.runs)):
            roll_in_seeds(run_cfg.run, cfg.seed_base, cfg.episodes)
    if cfg.report_only:
        results, machine = rebuilt(cfg)
    else:
        results, machine = judge_runs(cfg, sources=2), machine_info()  # sources: the residual's states, the expert's
    name = cfg.name or f"critic_{results[0]['env']}"
    split = any(r["overall"].get("split_half") for r in results)
    payload = {"runs": results, "states": cfg.states, "every": cfg.every, "perturbations": cfg.perturbations,
               "perturb_scale": cfg.perturb_scale, "seed": cfg.seed, "refit": cfg.refit,
               "refit_updates": cfg.refit_updates, "machine": machine,
               "rebuilt_from_json": cfg.report_only}
    os.makedirs(cfg.report_dir, exist_ok=True)
    with figure(os.path.join(cfg.report_dir, f"{name}.png"), figsize=(5.5, 4.5)) as ax:
        for res in results:
            for kind, marker in (("residual", "o"), ("base", "s"), ("expert", "^"), ("perturbed", ".")):
                pts = [(c["mc"], c["q"]) for s in res["states"] for k, c in s["candidates"].items()
                       if k.startswith(kind)]
                if pts:
                    g, q = np.array(pts).T
                    ax.scatter(g, q, s=12, marker=marker, alpha=0.6, label=f"{kind}")
        ax.plot([0, 1], [0, 1], color="grey", lw=0.6, ls=":")
        ax.set_xlabel("Monte-Carlo return from (s, a)")
        ax.set_ylabel("critic Q(s, a) (mean of heads)")
        ax.legend(fontsize=7)
    refits = [f'"{e}"' if ":" in e else e for e in cfg.refit]  # Hydra reads no unquoted '=' inside a list
    md = ["# Critic diagnostics: does the critic rank actions?", "",
          f"`arli bench critic 'runs=[{', '.join(cfg.runs)}]' states={cfg.states} episodes={cfg.episodes} "
          f"every={cfg.every} perturbations={cfg.perturbations} perturb_scale={cfg.perturb_scale}"
          + (f" repeats={cfg.repeats}" if cfg.repeats != 1 else "")
          + (f" seed_base={cfg.seed_base}" if cfg.seed_base is not None else "") + f" seed={cfg.seed}"
          + (f" 'refit=[{', '.join(refits)}]' refit_updates={cfg.refit_updates}" if cfg.refit else "")
          + f" name={name}"
          + (f" report_dir={cfg.report_dir}" if cfg.report_dir != "reports" else "")
          + "` — from states the run's residual visits and states the scripted "
          f"expert visits (a state every {cfg.every} steps of {cfg.episodes} roll-in episodes per source, at most "
          f"{cfg.states} per source), each candidate (the residual r(s), r(s) with one draw of the run's exploration "
          f"noise, the base, the expert projected into the bound, {cfg.perturbations} moves of r(s) of {cfg.perturb_scale} residual units) runs one step from a "
          "copy of the whole sim episode, then the run's residual continues: the discounted return is a "
          "Monte-Carlo Q" + (f" (the mean of {cfg.repeats} rollouts, each under its own draw of the base's sampling "
                             "noise, the same draws for every candidate)" if cfg.repeats > 1 else "")
          + ". Pairwise accuracy counts pairs of candidates whose returns differ (chance: 0.5)."
          + (" Split halves: over pairs whose mean return over the even repeats differs, how often the mean over "
             "the odd repeats orders them the same way (labels: what the labels themselves allow) and how often "
             "the critic does; labels − critic is the critic's shortfall (half A is a noisy label itself: both are "
             "lower bounds on what a critic knowing the expected returns would reach and on its shortfall). 95% "
             "intervals: "
             "a bootstrap over roll-in episodes (states of one episode share its history)." if split else
             " 95% intervals: a bootstrap over roll-in episodes."), "",
          "| run | heads × width | UTD | warm-up | γ | n | exploration | states (ranked) | pairwise acc. [95% CI] | "
          "Spearman | top-1 | mean Q | mean MC |"
          + (" split halves: labels / critic (pairs) | labels − critic [95% CI] |" if split else ""),
          "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|" + ("---:|---|" if split else "")]
    for r in results:
        o, s = r["overall"], r["settings"]
        ci, sh = o.get("pairwise_accuracy_ci95"), o.get("split_half")
        md.append(f"| `{r['run']}` ({r['variant']}, d={r['delay_steps']}, {r['env_steps']} steps) | "
                  f"{s['critic_heads']} × {s['critic_hidden']} | {s['utd']} | {s['critic_warmup_updates']} | "
                  f"{s['gamma']} | {s['n_step']} | {s['exploration_std']} | {o['states']} ({o['states_with_ranked_pairs']}) | "
                  f"{_fmt(o['pairwise_accuracy'])} " + (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") +
                  f" | {_fmt(o['spearman'])} | {_fmt(o['top1'])} | {_fmt(o['q_mean'], '.3f')} | "
                  f"{_fmt(o['mc_mean'], '.3f')} |"
                  + (f" {_fmt(sh['labels'])} / {_fmt(sh['critic'])} ({sh['pairs']}) | {_shortfall(sh)} |" if sh else
                     (" — | — |" if split else "")))
    if any(r.get("refits") for r in results):
        md += ["", "## Offline refits: the same candidates, fresh critics with another action input or settings", "",
               f"Each refit trains a fresh critic for {cfg.refit_updates} critic updates on the run's final replay "
               "(the learner's own off-policy TD evaluation — batch mix, n-step targets, target heads and smoothing — "
               "with the run's residual held fixed as the policy); `executed` sees the executed action as the "
               "learner's critic does (the control), `residual` sees (a − b) / residual_scale, `residual_std` that "
               "over the run's exploration_std; `<input>:<field>=<value>,...` also changes those critic settings. "
               "Refits differ only in those (same seed, replay and number of updates), so `− the executed refit` "
               "is their effect; `− the run's critic` also differs in update count, "
               "a moving actor and a growing replay (context only). Both are shares of the split halves' pairs "
               "(half A's returns against half B's order) ranked right, paired on the same pairs, with 95% intervals "
               "from a bootstrap over roll-in episodes; pairwise acc. uses the mean of all repeats instead, so it "
               "does not subtract to them.", "",
               "| run | refit (input: settings) | − the `executed` refit [95% CI] | "
               "split halves: labels / critic (pairs) | labels − critic [95% CI] | pairwise acc. [95% CI] | "
               "− the run's critic [95% CI] |",
               "|---|---|---|---:|---|---|---|"]
        for r in results:
            for t, res in r.get("refits", {}).items():
                if res.get("diverged"):
                    md.append(f"| `{r['run']}` | {t} | diverged or refused (see the log: no scores) | | | | |")
                    continue
                o = res["ranking"]
                ci, sh = o.get("pairwise_accuracy_ci95"), o.get("split_half")
                md.append(f"| `{r['run']}` | {t} | {_contrast(res.get('vs_executed'))}"
                          + (f" | {_fmt(sh['labels'])} / {_fmt(sh['critic'])} ({sh['pairs']}) | {_shortfall(sh)}"
                             if sh else " | — | —")
                          + f" | {_fmt(o['pairwise_accuracy'])} " + (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
                          + f" | {_contrast(res.get('vs_run_critic'))} |")
    shown = len(md)  # the console shows the main table and the refits' (the per-run sections are in the file)
    for r in results:
        md += ["", f"## `{r['run']}`", "", "| slice | states (ranked) | pairs | pairwise acc. [95% CI] | Spearman | "
               "top-1 |", "|---|---:|---:|---|---:|---:|"]
        for key in ("by_source", "by_phase"):
            for v, o in r[key].items():
                ci = o.get("pairwise_accuracy_ci95")
                md.append(f"| {key[3:]} = {v} | {o['states']} ({o['states_with_ranked_pairs']}) | {o['pairs']} | "
                          f"{_fmt(o['pairwise_accuracy'])} " + (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") +
                          f" | {_fmt(o['spearman'])} | {_fmt(o['top1'])} |")
        sh = r["overall"].get("split_half")
        if sh:
            md += ["", "| split halves: pairs whose half-B returns differ by | pairs | labels | critic |",
                   "|---|---:|---:|---:|"]
            md += [f"| {g['gap'][0]:g} – {'∞' if g['gap'][1] is None else format(g['gap'][1], 'g')} | "
                   f"{g['pairs']} | {_fmt(g['labels'])} | {_fmt(g['critic'])} |" for g in sh["by_gap"]]
        if sh and sh.get("by_pair"):
            md += ["", "| split halves by the candidates compared | pairs | labels | critic |", "|---|---:|---:|---:|"]
            md += [f"| {' – '.join(g['pair'])} | {g['pairs']} | {_fmt(g['labels'])} | {_fmt(g['critic'])} |"
                   for g in sh["by_pair"]]
        md += ["", "| candidate | mean MC return | mean Q |", "|---|---:|---:|"]
        md += [f"| {k} | {v['mc_mean']:.3f} | {v['q_mean']:.3f} |" for k, v in r["by_candidate"].items()]
    md += ["", f"![Q vs Monte-Carlo return]({name}.png)", "", f"Machine: {machine}"
           + (" (rebuilt from the report's JSON with `report_only=true`: no rollout ran again)" if cfg.report_only
              else ""), ""]
    return publish(cfg.report_dir, name, payload, md, slice(6, shown),
                   {r["run"]: r["overall"]["pairwise_accuracy"] for r in results} if cfg.json else None)
