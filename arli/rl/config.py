"""Hyperparameters of residual finetuning, in one place (no torch import: the CLI schema
uses these dataclasses directly)."""

from __future__ import annotations

from dataclasses import dataclass, field


ACTOR_UPDATES = ("dpg", "select", "awr")


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
    # how much the anchor rows count. q_weight = 0: the behaviour-cloning control.
    q_weight: float = 1.0
    anchor_weight: float = 1.0
    # how the critic drives the actor (reports/learner_tuning.md has the measurements):
    # "awr": advantage-weighted regression onto the data's actions, advantages from the
    #   critic's TD targets (the default: the only one that did not collapse at 15k steps);
    # "dpg": deterministic policy gradient + Q-filtered BC (TD3+BC-style);
    # "select": regress onto the highest-Q of nearby candidates and the row's own action
    #   (PA-RL/EXPO-style).
    actor_update: str = "awr"
    # awr: weight exp(q_weight * advantage / awr_temperature), clipped. 0.02, not 0.05: at
    # d = 8 and 50k steps it lifted the start on 3 of 3 seeds (+0.15 mean), 0.05 by +0.05 on
    # seed 0 (reports/learner_tuning.md)
    awr_temperature: float = 0.02
    awr_max_weight: float = 20.0
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
    # BC only on anchor rows whose action the critic values above the actor's (Q-filter,
    # Nair et al. 2018): the anchor pulls where it is better, the critic decides elsewhere
    q_filter: bool = False  # actor_update=dpg only
    # value gating when acting (EXPO): execute the highest-Q of {pi, base, gate_candidates - 2
    # perturbations of pi (std gate_std on r)}; 0 or 1 = execute pi. Off by default: at this
    # budget the critic does not rank nearby actions reliably (see the tuning report)
    gate_candidates: int = 0
    gate_std: float = 0.3
    # trust region to the start: + start_weight * mean_B ||r(s) - r_start(s)||^2 on every row,
    # r_start the frozen anchor-pretrained actor (the zero residual, i.e. the base, without
    # pretraining). Unlike continued BC on the anchor rows, it holds the start without fitting
    # the 60 demonstrations any further (reports/learner_tuning.md)
    start_weight: float = 0.0

    def validate(self) -> None:
        checks = {
            "learner.gamma": (0 < self.gamma <= 1, "in (0, 1]"),
            "learner.n_step": (self.n_step >= 1, ">= 1"),
            "learner.batch_size": (self.batch_size >= 2, ">= 2"),
            "learner.hidden": (self.hidden >= 1, ">= 1"),
            "learner.critic_hidden": (self.critic_hidden >= 1, ">= 1"),
            "learner.critic_heads": (self.critic_heads >= 1, ">= 1"),
            "learner.critic_subset": (1 <= self.critic_subset <= self.critic_heads, "in [1, critic_heads]"),
            "learner.critic_lr": (self.critic_lr > 0, "> 0"),
            "learner.actor_lr": (self.actor_lr > 0, "> 0"),
            "learner.tau": (0 < self.tau <= 1, "in (0, 1]"),
            "learner.anchor_ratio": (0 <= self.anchor_ratio <= 1, "in [0, 1]"),
            "learner.residual_scale": (0 < self.residual_scale <= 2, "in (0, 2]"),
            "learner.exploration_std": (self.exploration_std >= 0, ">= 0"),
            "learner.exploration_corr": (0 <= self.exploration_corr < 1, "in [0, 1)"),
            "learner.q_weight": (self.q_weight >= 0, ">= 0"),
            "learner.anchor_weight": (self.anchor_weight >= 0, ">= 0"),
            "learner.start_weight": (self.start_weight >= 0, ">= 0"),
            "learner.q_filter": (not self.q_filter or self.actor_update == "dpg",
                                 "false unless learner.actor_update=dpg (the Q-filter acts on dpg's BC term only)"),
            "learner.utd": (self.utd >= 1, ">= 1"),
            "learner.policy_delay": (self.policy_delay >= 1, ">= 1"),
            "learner.critic_warmup_updates": (self.critic_warmup_updates >= 0, ">= 0"),
            "learner.actor_update": (self.actor_update in ACTOR_UPDATES, f"one of {ACTOR_UPDATES}"),
            "learner.gate_candidates": (self.gate_candidates >= 0, ">= 0"),
            "learner.gate_std": (self.gate_std >= 0, ">= 0"),
            "learner.awr_temperature": (self.awr_temperature > 0, "> 0"),
            "learner.awr_max_weight": (self.awr_max_weight >= 1, ">= 1"),
            "learner.pretrain_updates": (self.pretrain_updates >= 0, ">= 0"),
            "learner.buffer_size": (self.buffer_size >= self.batch_size, ">= batch_size"),
            "learner.q_max": (self.q_max > self.q_min, "> learner.q_min"),
            "learner.max_abs_q": (self.max_abs_q > 0, "> 0"),
        }
        raise_bad(self, checks)
        if self.q_weight == 0 and self.anchor_weight == 0:  # no term of the actor's loss pulls anywhere
            raise ValueError("learner.anchor_weight: expected > 0 when learner.q_weight is 0 (the actor would "
                             "learn nothing), got 0.0; set one of them > 0")


def raise_bad(obj, checks: dict[str, tuple[bool, str]]) -> None:
    """ValueError naming every failed ``"group.field": (ok, allowed)`` check and its value."""
    bad = [f"{k}: expected {allowed}, got {getattr(obj, k.split('.')[1])!r}" for k, (ok, allowed) in checks.items()
           if not ok]
    if bad:
        raise ValueError("; ".join(bad))


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
        checks = {"intervention.prob": (0 <= self.prob <= 1, "in [0, 1]"),
                  "intervention.after": (self.after >= 0, ">= 0"),
                  "intervention.mode": (self.mode in INTERVENTION_MODES, f"one of {INTERVENTION_MODES}"),
                  "intervention.threshold": (self.threshold >= 0, ">= 0"),
                  "intervention.patience": (self.patience >= 1, ">= 1"),
                  "intervention.segment": (self.segment >= 1, ">= 1"),
                  "intervention.judged_dims": (self.judged_dims >= 0, ">= 0 (0 = every entry)"),
                  "intervention.max_steps": (self.max_steps >= 0, ">= 0 (0 = no cap)"),
                  "intervention.takeover_penalty": (self.takeover_penalty >= 0, ">= 0")}
        raise_bad(self, checks)


REGIMES = ("rl", "hil")


@dataclass
class RunSpec:
    """What one finetuning run is: task timing, state variant, data and budget."""

    variant: str = "arli"
    # rl: anchor = demonstrations relabelled through the scheduler, no online intervener;
    # hil: the intervener also acts online (``intervention``), its segments join the anchor
    regime: str = "rl"
    strategy: str = "naive"  # async switch strategy of the base policy
    execute_horizon: int = 8
    env_steps: int = 15_000
    anchor_episodes: int = 60  # demonstration episodes (expert in the async loop) before learning
    # recorded intervention datasets (`arli record`, `arli actor record_root=...`): their
    # intervention steps join the anchor, the robot's own steps the online replay
    datasets: list[str] = field(default_factory=list)
    intervention: InterventionSpec = field(default_factory=InterventionSpec)
    learn_after: int = 1000  # transitions in replay before the first update
    eval_every: int = 2500
    eval_episodes: int = 30
    seed: int = 0
    learner: LearnerConfig = field(default_factory=LearnerConfig)


