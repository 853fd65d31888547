"""Hyperparameters of residual finetuning, in one place (no torch import: the CLI schema
uses these dataclasses directly)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from arli.compute import check_device
from arli.errors import require


ACTOR_UPDATES = ("dpg", "select", "awr")
AWR_ADVANTAGES = ("td", "q", "q_bounded")
AWR_WEIGHTS = ("advantage", "uniform")
NOISE_PROCESSES = ("white", "differenced")  # exploration without / with exploration_differenced


@dataclass
class LearnerConfig:
    """Residual TD learner (``arli.rl.learner``). Defaults follow DESIGN.md §7 and were
    measured on this repository's tasks (reports/learner.md)."""

    gamma: float = 0.99
    n_step: int = 3
    batch_size: int = 256
    hidden: int = 128  # actor width
    critic_hidden: int = 128
    critic_heads: int = 4  # ensemble size E (one batched matmul per layer)
    critic_subset: int = 2  # heads in the min of the TD target (REDQ-style)
    critic_lr: float = 3e-4
    actor_lr: float = 3e-5  # far below the critic's: the residual moves slowly
    tau: float = 0.005  # target network Polyak rate
    # a = clip(b + scale * r): the residual's reach. Small on purpose (ResFiT 0.1, Policy
    # Decorator 0.05-0.1): a bounded correction cannot wander far from the base while the
    # critic is still wrong
    residual_scale: float = 0.3
    exploration_std: float = 0.1  # Gaussian noise on r during data collection
    target_noise: float = 0.2  # target policy smoothing (on r)
    target_noise_clip: float = 0.5
    policy_delay: int = 2  # actor / target updates every k critic updates
    anchor_ratio: float = 0.5  # share of each batch drawn from anchor replay (RLPD 50/50)
    # how much the critic drives the actor (awr: the advantage's weight, dpg: the Q term) and
    # how much the anchor rows count. q_weight = 0 (with gate_candidates = 0): the behaviour-cloning control.
    q_weight: float = 1.0
    anchor_weight: float = 1.0
    # how the critic drives the actor (reports/learner_tuning.md has the measurements):
    # "select" (the default, with value gating below): regress onto the highest-Q of the gating
    #   candidates and the row's own action (PA-RL/EXPO-style); kept over "awr" with gating on
    #   three tune seeds (reports/tune_d8_50k_86ed35_form.md: awr's lower end 0.10 below it);
    # "awr": advantage-weighted regression onto the data's actions (`+recipe=awr`: the former
    #   default, without gating; the only update that did not collapse at 15k steps ungated);
    # "dpg": deterministic policy gradient + Q-filtered BC (TD3+BC-style).
    actor_update: str = "select"
    # value gating when acting (EXPO / PLD): execute the highest-Q of {pi, base, gate_candidates - 2
    # perturbations of pi (std gate_std on r)}; 0 or 1 = execute pi (with an update other than
    # select, which needs the candidates: `+recipe=awr` turns gating off). The robot's actor gates too
    # (the learner publishes the critic with the actor). On by default with the max-Q backup:
    # chosen on tune seeds (reports/tune_d8_50k_86ed35.md, 0.97 against 0.82) and confirmed on
    # fresh training seeds and the test episodes (reports/confirm_d8_50k_expo.md, +0.112
    # [+0.067, +0.160]); `+recipe=awr` is the learner without it (the former default)
    gate_candidates: int = 8
    gate_std: float = 0.3
    # confidence the gate needs to leave pi(s) (acting, the select target and the max-Q backup):
    # 0 = the highest mean-head Q; k > 0 = the highest mean - k * std over heads of each
    # candidate's advantage over pi(s), so pi(s) stays where the heads disagree about a candidate
    gate_confidence: float = 0.0
    # max-Q backup (EXPO / PLD): the TD target's next action is the highest-target-Q of
    # {pi'(s'), 0 (the base), backup_candidates - 2 perturbations of pi'(s') (std gate_std)},
    # so the critic values what a value-gated actor would do; 0 or 1 = pi'(s') (TD3)
    backup_candidates: int = 8
    # awr: weight exp(q_weight * advantage / awr_temperature), clipped. 0.02, not 0.05: at
    # d = 8 and 50k steps it lifted the start on 3 of 3 seeds (+0.15 mean), 0.05 by +0.05 on
    # seed 0 (reports/learner_tuning.md)
    awr_temperature: float = 0.02
    awr_max_weight: float = 20.0
    # awr's advantage: "q" = mean-head Q(s, a) - mean-head Q(s, pi(s)), the same online heads
    # and action treatment on both sides; "td" = R_n + gamma^n min-subset Q'(s_n, smoothed
    # pi'(s_n)) - mean-head Q(s, pi(s)) (target heads and a smoothed action on one side only).
    # "q_bounded" = "q" with Q(s, a) taken at the action the regression target stands for,
    # b + scale * clip((a - b) / scale) (an anchor row's expert action beyond the bound is
    # valued where the residual can reach, as Q(s, pi(s)) is).
    # "q" with the anchor fade below was chosen by `arli bench tune` on the tune seeds
    # (reports/tune_d8_50k.md: 0.68 against the former default's 0.48 at d = 8, 50k)
    awr_advantage: str = "q"
    # "uniform": every row (online and anchor) weighted 1 -- the critic steers nothing, the
    # actor regresses onto all the data's actions (the uniform-weight control)
    awr_weights: str = "advantage"
    # continued BC on anchor rows fades out: its weight falls linearly from anchor_weight to 0
    # over this many updates after the critic warm-up (0 = never fades). The 60
    # demonstrations are then a start and critic data, not a target fitted 1,400 times
    anchor_decay_updates: int = 20_000
    critic_warmup_updates: int = 2000  # critic-only updates before the actor moves
    pretrain_updates: int = 2000  # BC of the actor on anchor replay before online RL
    # 1e-4, not 1e-3: at 1e-3 the anchor-pretrained start swung between 0.42 and 0.86 success
    # from one stopping point to the next (peg_insert, d = 4) and fell below the base at d = 0;
    # at 1e-4 it is 0.87-0.89 after 2000 updates on 3 seeds (reports/learner_tuning.md)
    pretrain_lr: float = 1e-4
    utd: int = 1  # updates per environment step
    buffer_size: int = 200_000
    # reachable return range: sparse success reward 1, optional takeover penalty below 0;
    # TD targets are clipped into it, and |Q| beyond max_abs_q means the critic diverged
    q_min: float = 0.0
    q_max: float = 1.0
    max_abs_q: float = 100.0

    # -- experimental, off by default: each was measured and did not help at this budget
    # (reports/learner_tuning.md); kept together here for the learner studies that use them
    # temporal correlation of that noise: AR(1) e_t = rho e_{t-1} + sqrt(1 - rho^2) xi_t, reset at
    # every episode, marginal std exploration_std. 0 = independent per step (off).
    # A correlated drift changes outcomes more than per-step noise, but the state then carries
    # the past noise, E[e_t | s_t] != 0, and any regression onto the data's actions (AWR, the
    # online rows) learns to continue the drift: measured, it costs 0.11-0.36 success
    # (reports/learner_tuning.md). Only for updates that do not regress onto online actions
    exploration_corr: float = 0.0
    # differenced exploration: e_t = (xi_t - xi_{t-1}) / sqrt(2), xi white, xi_{-1} = 0 (marginal
    # std exploration_std from step 1). The actions are deltas the controller integrates into the
    # hand's target, so white noise on them walks the target away (std ~ sigma sqrt(t)), which is
    # what breaks the insertion; the running sum of differenced noise is sigma xi_t / sqrt(2),
    # bounded, so a larger per-step noise shows the critic an action's effect without drifting
    # the hand (reports/learner_tuning.md has what it did). Its conditional mean is not 0 either:
    # the state shows the running sum, and E[e_t | s_t] = -(that sum) / sqrt(2), a pull back that
    # a regression onto online actions (AWR) can learn
    exploration_differenced: bool = False
    # BC only on anchor rows whose action the critic values above the actor's (Q-filter,
    # Nair et al. 2018): the anchor pulls where it is better, the critic decides elsewhere
    q_filter: bool = False  # actor_update=dpg only
    # global gradient-norm clip for the critic and the actor (ResFiT: 1.0); 0 = off
    grad_clip: float = 0.0
    # trust region to the start: + start_weight * mean_B ||r(s) - r_start(s)||^2 on every row,
    # r_start the frozen anchor-pretrained actor (the zero residual, i.e. the base, without
    # pretraining). Unlike continued BC on the anchor rows, it holds the start without fitting
    # the 60 demonstrations any further (reports/learner_tuning.md)
    start_weight: float = 0.0
    # the trust region fades: its weight falls linearly to 0 over this many updates after the
    # critic warm-up (0 = never fades), so it holds the start while the young critic cannot rank
    # nearby actions and lets the actor go once it can
    start_decay_updates: int = 0
    # a conservative critic where the gate chooses (CQL, Kumar et al. 2020, on the gate's
    # candidates): + cql_weight * mean over heads and rows of
    # cql_temperature * logsumexp_K(Q(s, c_k) / cql_temperature) - Q(s, a), c_k the gating
    # candidates around pi(s) (gate_candidates, gate_std), a the row's own action. A small
    # temperature presses on the candidate the gate would pick, so a direction the data never
    # showed cannot win the gate on the critic's extrapolation alone (the temperature sits at the low
    # end of the 0.003-0.007 by which a young critic's candidates differed: drift_d8_at2000_gate3.md);
    # the row's own action is pushed up as much, so the weight bounds Q's bias on the data to
    # cql_weight / 2 where the candidates sit far from it. Screened at 0.1 on one seed: the start
    # collapsed as with the default (reports/learner_tuning.md, twenty-first session); 0 = off
    cql_weight: float = 0.0
    cql_temperature: float = 0.003

    def validate(self) -> None:
        checks = {
            "run.learner.gamma": (0 < self.gamma <= 1, "in (0, 1]"),
            "run.learner.n_step": (self.n_step >= 1, ">= 1"),
            "run.learner.batch_size": (self.batch_size >= 2, ">= 2"),
            "run.learner.hidden": (self.hidden >= 1, ">= 1"),
            "run.learner.critic_hidden": (self.critic_hidden >= 1, ">= 1"),
            "run.learner.critic_heads": (self.critic_heads >= 1, ">= 1"),
            "run.learner.critic_subset": (1 <= self.critic_subset <= self.critic_heads, "in [1, critic_heads]"),
            "run.learner.critic_lr": (self.critic_lr > 0, "> 0"),
            "run.learner.actor_lr": (self.actor_lr > 0, "> 0"),
            "run.learner.tau": (0 < self.tau <= 1, "in (0, 1]"),
            "run.learner.anchor_ratio": (0 <= self.anchor_ratio <= 1, "in [0, 1]"),
            "run.learner.residual_scale": (0 < self.residual_scale <= 2, "in (0, 2]"),
            "run.learner.exploration_std": (self.exploration_std >= 0, ">= 0"),
            "run.learner.exploration_corr": (0 <= self.exploration_corr < 1, "in [0, 1)"),
            "run.learner.exploration_differenced": (not (self.exploration_differenced and self.exploration_corr > 0),
                                                    "false while run.learner.exploration_corr > 0 (one noise "
                                                    "process: AR(1) or differenced)"),
            "run.learner.q_weight": (self.q_weight >= 0, ">= 0"),
            "run.learner.anchor_weight": (self.anchor_weight >= 0, ">= 0"),
            "run.learner.start_weight": (self.start_weight >= 0, ">= 0"),
            "run.learner.q_filter": (not self.q_filter or self.actor_update == "dpg",
                                 "false unless run.learner.actor_update=dpg (the Q-filter acts on dpg's BC term only)"),
            "run.learner.utd": (self.utd >= 1, ">= 1"),
            "run.learner.policy_delay": (self.policy_delay >= 1, ">= 1"),
            "run.learner.critic_warmup_updates": (self.critic_warmup_updates >= 0, ">= 0"),
            "run.learner.actor_update": (self.actor_update in ACTOR_UPDATES, f"one of {ACTOR_UPDATES}"),
            "run.learner.gate_candidates": (self.gate_candidates >= (2 if self.actor_update == "select" else 0),
                                            ">= 0, and >= 2 with run.learner.actor_update=select (its candidates "
                                            "are pi(s), the base and gate_candidates - 2 perturbations; fewer "
                                            "make it plain regression onto the data)"),
            "run.learner.gate_std": (self.gate_std >= 0, ">= 0"),
            "run.learner.gate_confidence": (self.gate_confidence >= 0 and (self.gate_confidence == 0
                                                                          or self.critic_heads >= 2),
                                            ">= 0, and 0 with one critic head (no disagreement to measure)"),
            "run.learner.awr_temperature": (self.awr_temperature > 0, "> 0"),
            "run.learner.awr_max_weight": (self.awr_max_weight >= 1, ">= 1"),
            "run.learner.awr_advantage": (self.awr_advantage in AWR_ADVANTAGES, f"one of {AWR_ADVANTAGES}"),
            "run.learner.awr_weights": (self.awr_weights in AWR_WEIGHTS, f"one of {AWR_WEIGHTS}"),
            "run.learner.anchor_decay_updates": (self.anchor_decay_updates >= 0, ">= 0 (0 = never fades)"),
            "run.learner.start_decay_updates": (self.start_decay_updates >= 0, ">= 0 (0 = never fades)"),
            "run.learner.backup_candidates": (self.backup_candidates >= 0, ">= 0"),
            "run.learner.grad_clip": (self.grad_clip >= 0, ">= 0 (0 = off)"),
            "run.learner.cql_weight": (self.cql_weight >= 0 and (self.cql_weight == 0 or self.gate_candidates >= 2),
                                       ">= 0, and 0 unless run.learner.gate_candidates >= 2 (it presses on "
                                       "the gate's candidates)"),
            "run.learner.cql_temperature": (self.cql_temperature > 0, "> 0"),
            "run.learner.pretrain_updates": (self.pretrain_updates >= 0, ">= 0"),
            "run.learner.buffer_size": (self.buffer_size >= self.batch_size, ">= batch_size"),
            "run.learner.q_max": (self.q_max > self.q_min, "> run.learner.q_min"),
            "run.learner.max_abs_q": (self.max_abs_q > 0, "> 0"),
        }
        check_fields(self, checks)
        for name in ("awr_advantage", "awr_weights"):
            require(self.actor_update == "awr" or getattr(self, name) == getattr(LearnerConfig, name),
                    f"run.learner.{name}", "its default unless run.learner.actor_update=awr (it shapes awr's "
                    "weights only)", getattr(self, name))
        # no term of the actor's loss pulls anywhere
        require(self.q_weight > 0 or self.anchor_weight > 0, "run.learner.anchor_weight",
                "> 0 when run.learner.q_weight is 0 (the actor would learn nothing); set one of them > 0",
                self.anchor_weight)


def check_fields(obj, checks: dict[str, tuple[bool, str]]) -> None:
    """``require`` for each ``"group.field": (ok, allowed)`` check, with the field's value."""
    for name, (ok, allowed) in checks.items():
        require(ok, name, allowed, getattr(obj, name.split(".")[-1]))


INTERVENTION_MODES = ("takeover", "corrective")


@dataclass
class InterventionSpec:
    """The online intervener's settings (``arli.runtime.intervention.Intervention``)."""

    prob: float = 1.0  # share of training episodes the intervener watches
    after: int = 0  # it never acts before this step
    mode: str = "corrective"  # takeover: acts until the end | corrective: short segments on deviation
    threshold: float = 0.6  # corrective: max |a_robot - a_expert| that counts as a deviation
    patience: int = 3  # corrective: consecutive deviating steps before it takes over
    segment: int = 15  # corrective: steps it keeps control before handing back
    judged_dims: int = 4  # corrective: action entries judged (4 = motion dx dy dz dyaw; 0 = all)
    max_steps: int = 0  # cap on online intervention steps over the run (0 = no cap)
    # RLIF-style: reward -takeover_penalty on the robot's step that made the intervener take
    # over, so the residual learns to avoid states that need rescue
    takeover_penalty: float = 0.0

    def validate(self) -> None:
        checks = {"run.intervention.prob": (0 <= self.prob <= 1, "in [0, 1]"),
                  "run.intervention.after": (self.after >= 0, ">= 0"),
                  "run.intervention.mode": (self.mode in INTERVENTION_MODES, f"one of {INTERVENTION_MODES}"),
                  "run.intervention.threshold": (self.threshold >= 0, ">= 0"),
                  "run.intervention.patience": (self.patience >= 1, ">= 1"),
                  "run.intervention.segment": (self.segment >= 1, ">= 1"),
                  "run.intervention.judged_dims": (self.judged_dims >= 0, ">= 0 (0 = every entry)"),
                  "run.intervention.max_steps": (self.max_steps >= 0, ">= 0 (0 = no cap)"),
                  "run.intervention.takeover_penalty": (self.takeover_penalty >= 0, ">= 0")}
        check_fields(self, checks)


def q_floor(learner: LearnerConfig, intervention: InterventionSpec, online_intervener: bool) -> float:
    """The lowest reachable return, where TD targets are clipped from below. The success
    reward is >= 0; each takeover costs ``takeover_penalty`` on the robot's step before it.
    A takeover intervener takes over once an episode; a corrective one hands back after
    ``segment`` steps and needs ``patience`` more to take over again, so its penalties are at
    least that far apart: -penalty / (1 - gamma^(segment + patience)) bounds their sum."""
    penalty = intervention.takeover_penalty if online_intervener else 0.0
    if penalty == 0:
        return learner.q_min
    if intervention.mode == "takeover":
        return min(learner.q_min, -penalty)
    return min(learner.q_min, -penalty / (1 - learner.gamma ** (intervention.segment + intervention.patience)))


REGIMES = ("rl", "hil")
DEMONSTRATIONS = ("expert", "bounded")
REPORTED_TEST_EPISODES = 200  # the fewest test episodes a reported number rests on
# training episodes (demonstrations, online) of training seed k: the first 1000 draw their
# episode seeds from TRAIN_SEED_BASE + 1000 k .., later ones (a 200k-step run has ~1700) from a
# block of LONG_RUN_EPISODES per seed, so neighbouring seeds never share an episode; tune and
# test seeds stay out of both blocks
TRAIN_SEED_BASE, FIRST_EPISODES, MAX_TRAIN_SEED = 100_000, 1000, 1000
LONG_RUN_SEED_BASE, LONG_RUN_EPISODES = 100_000_000, 1_000_000
TRAIN_SEED_BLOCKS = (range(TRAIN_SEED_BASE, TRAIN_SEED_BASE + FIRST_EPISODES * MAX_TRAIN_SEED),
                     range(LONG_RUN_SEED_BASE, LONG_RUN_SEED_BASE + LONG_RUN_EPISODES * MAX_TRAIN_SEED))


def train_episode_seed(seed: int, episode: int) -> int:
    """The episode seed of training episode ``episode`` (0, 1, ..) of training seed ``seed``."""
    if episode < FIRST_EPISODES:
        return TRAIN_SEED_BASE + FIRST_EPISODES * seed + episode
    return LONG_RUN_SEED_BASE + LONG_RUN_EPISODES * seed + episode


def train_seed_ranges(seed: int, episodes: int) -> list[range]:
    """The episode seeds of the first ``episodes`` training episodes of training seed ``seed``."""
    first = TRAIN_SEED_BASE + FIRST_EPISODES * seed
    out = [range(first, first + min(episodes, FIRST_EPISODES))]
    if episodes > FIRST_EPISODES:
        long = LONG_RUN_SEED_BASE + LONG_RUN_EPISODES * seed
        out.append(range(long + FIRST_EPISODES, long + episodes))
    return out


def disjoint(a: range, b: range) -> bool:
    return a.stop <= b.start or b.stop <= a.start


def outside_training(r: range) -> bool:
    """Whether no seed of ``r`` is a training episode's seed (of any training seed)."""
    return all(disjoint(r, block) for block in TRAIN_SEED_BLOCKS)


@dataclass
class RunSpec:
    """What one finetuning run is: task timing, state variant, data and budget."""

    variant: str = "arli"
    # rl: anchor = demonstrations relabelled through the scheduler, no online intervener;
    # hil: the intervener also acts online (``intervention``), its segments join the anchor
    regime: str = "rl"
    env_steps: int = 15_000
    anchor_episodes: int = 60  # demonstration episodes (expert in the async loop) before learning
    # how the demonstrator acts in them: "expert" = the expert's own action for whole episodes
    # (its states, targets the bound may clip); "bounded" = the expert's correction of the
    # running base, projected into the residual's reach (run.learner.residual_scale), as an
    # operator correcting the running policy with bounded authority: every target is one the
    # residual can reach, from states of base + a correction within that reach (not the
    # expert's own). "bounded" was chosen on the tune
    # seeds: anchored start 0.74 against 0.47 at d = 8 (reports/anchor_start_demonstrations/)
    demonstrations: str = "bounded"
    # recorded intervention datasets (`arli record`, `arli actor record_root=...`): their
    # intervention steps join the anchor, the robot's own steps the online replay
    datasets: list[str] = field(default_factory=list)
    intervention: InterventionSpec = field(default_factory=InterventionSpec)
    learn_after: int = 1000  # transitions in replay before the first update
    # evaluation on two disjoint seed ranges: the learning curve (and every choice of a
    # setting) on the tune episodes, the final numbers on the test episodes no choice saw
    eval_every: int = 2500
    eval_episodes: int = 30  # tune episodes per curve point: seeds tune_seed ..
    tune_seed: int = 10_000
    test_episodes: int = REPORTED_TEST_EPISODES  # final evaluation: base alone, anchored start and finetuned, same seeds
    test_seed: int = 5_000_000
    seed: int = 0
    # do no harm before RL starts: the anchored start and the base alone on the tune
    # episodes; a start below the base is dropped and RL starts from the zero residual
    start_guard: bool = True
    # do no harm after RL: the finetuned residual and the one RL started from on the guard's
    # tune episodes (guard_episodes); a finetuned residual below its start is
    # dropped and the start deployed (the final numbers are then the start's; the trained
    # residual's own test outcomes are kept as "trained")
    end_guard: bool = True
    # tune episodes each guard compares on (paired seeds tune_seed .., as counts): more than a
    # curve point's, because a guard's decision is final and one of 30 episodes is 0.033; what
    # was measured on the same seeds and weights (the curve's first eval_episodes, the start
    # guard's start) is reused. 0 = eval_episodes (runs saved before the key)
    guard_episodes: int = 200
    device: str = "auto"  # where the learner's networks and updates run: auto (CUDA if torch sees one) | cpu | cuda
    learner: LearnerConfig = field(default_factory=LearnerConfig)



    def guard_count(self) -> int:
        """Tune episodes each guard compares on."""
        return self.guard_episodes or self.eval_episodes

    def tune_range(self) -> range:
        """Episode seeds of the learning curve, the guards and every choice of a setting."""
        return range(self.tune_seed, self.tune_seed + max(self.eval_episodes, self.guard_count()))

    def test_range(self) -> range:
        """Episode seeds of the final numbers."""
        return range(self.test_seed, self.test_seed + self.test_episodes)

    def validate(self) -> None:
        from arli.augment import VARIANTS  # noqa: PLC0415 - augment imports numpy only, but later

        require(self.variant in VARIANTS, "run.variant", f"one of {VARIANTS}", self.variant)
        require(self.regime in REGIMES, "run.regime", f"one of {REGIMES}", self.regime)
        require(self.demonstrations in DEMONSTRATIONS, "run.demonstrations", f"one of {DEMONSTRATIONS}",
                self.demonstrations)
        check_device(self.device, "run.device")
        for name in ("env_steps", "eval_every", "eval_episodes", "test_episodes"):
            require(getattr(self, name) >= 1, f"run.{name}", ">= 1", getattr(self, name))
        require(self.guard_episodes >= 0, "run.guard_episodes", ">= 0 (0: run.eval_episodes)", self.guard_episodes)
        self.check_seeds(self.tune_range(), self.test_range())

    def check_seeds(self, tune: range, test: range) -> None:
        """Refuse tune and test episode seeds that overlap each other or the training seeds."""
        require(disjoint(tune, test), "run.test_seed", f"a test range disjoint from the tune seeds "
                f"[{tune.start}, {tune.stop}) (tune on one, report on the other)", f"[{test.start}, {test.stop})")
        blocks = " and ".join(f"[{b.start}, {b.stop})" for b in TRAIN_SEED_BLOCKS)
        for name, r in (("run.tune_seed", tune), ("run.test_seed", test)):
            require(outside_training(r), name, f"seeds outside the training episodes' {blocks}",
                    f"[{r.start}, {r.stop})")
        require(0 <= self.seed < MAX_TRAIN_SEED, "run.seed", f"an integer in [0, {MAX_TRAIN_SEED}) (each training "
                "seed has its own block of training episode seeds)", self.seed)
        require(self.anchor_episodes >= 0, "run.anchor_episodes", ">= 0", self.anchor_episodes)
        require(self.learn_after >= 1, "run.learn_after", ">= 1", self.learn_after)
        for root in self.datasets:
            require(os.path.isdir(root), "run.datasets", "paths of recorded LeRobotDatasets", root)
        self.intervention.validate()
        self.learner.validate()
