"""Hyperparameters of residual finetuning, in one place (no torch import: the CLI schema
uses these dataclasses directly)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LearnerConfig:
    gamma: float = 0.99
    n_step: int = 3
    batch_size: int = 256
    hidden: int = 256
    critic_heads: int = 4  # ensemble size E
    critic_subset: int = 2  # heads in the min of the TD target (REDQ-style)
    critic_lr: float = 3e-4
    actor_lr: float = 1e-4  # well below the critic's: the residual moves slowly
    tau: float = 0.005  # target network Polyak rate
    # a = clip(b + scale * r). 2 lets the residual reach any action from any base action:
    # under async naive at d = 4 the base is off by ~1 per dimension (measured), and smaller
    # scales cap what the residual can correct (BC ceiling 0.42 at 0.5 vs 0.82 at 2.0)
    residual_scale: float = 2.0
    exploration_std: float = 0.1  # Gaussian noise on r during data collection
    target_noise: float = 0.1  # target policy smoothing (on r)
    target_noise_clip: float = 0.25
    policy_delay: int = 2  # actor / target updates every k critic updates
    anchor_ratio: float = 0.5  # share of each batch drawn from anchor replay
    anchor_weight: float = 1.0  # weight of the anchor (BC) term in the actor loss
    # weight of the unit-scaled Q term (deterministic policy gradient). 0 by default: at the
    # budgets this CPU affords (<= 12k env steps) the critic's action-gradient moved a
    # pretrained actor away from the anchor data at every weight tried (2.5 .. 0.01
    # relative; Adam rescales even a small term once the anchor term has converged), see README
    q_weight: float = 0.0
    critic_warmup_updates: int = 500  # critic-only updates before the actor moves
    pretrain_updates: int = 3000  # anchor pretraining (BC of the actor on anchor replay) before online RL
    pretrain_lr: float = 1e-3
    utd: int = 1  # updates per environment step
    buffer_size: int = 200_000

    def validate(self) -> None:
        checks = {
            "learner.gamma": 0 < self.gamma <= 1, "learner.n_step": self.n_step >= 1,
            "learner.batch_size": self.batch_size >= 2,
            "learner.critic_subset": 1 <= self.critic_subset <= self.critic_heads,
            "learner.anchor_ratio": 0 <= self.anchor_ratio <= 1,
            "learner.residual_scale": 0 < self.residual_scale <= 2,
            "learner.q_weight": self.q_weight >= 0, "learner.anchor_weight": self.anchor_weight >= 0,
            "learner.utd": self.utd >= 1, "learner.policy_delay": self.policy_delay >= 1,
            "learner.pretrain_updates": self.pretrain_updates >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid learner settings: {bad} (see LearnerConfig for allowed ranges)")


INTERVENTION_MODES = ("takeover", "corrective")


@dataclass
class InterventionSpec:
    """The simulated human intervener (see ``arli.rl.collect.Intervention``)."""

    prob: float = 1.0  # share of training episodes the intervener watches
    after: int = 0  # it never acts before this step
    mode: str = "corrective"  # takeover: acts until the end | corrective: short segments on deviation
    threshold: float = 0.6  # corrective: max |a_robot - a_expert| that counts as a deviation
    patience: int = 3  # corrective: consecutive deviating steps before it takes over
    segment: int = 15  # corrective: steps it keeps control before handing back

    def validate(self) -> None:
        checks = {"intervention.prob": 0 <= self.prob <= 1, "intervention.after": self.after >= 0,
                  "intervention.mode": self.mode in INTERVENTION_MODES,
                  "intervention.threshold": self.threshold >= 0,
                  "intervention.patience": self.patience >= 1, "intervention.segment": self.segment >= 1}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid intervention settings: {bad} (modes: {INTERVENTION_MODES}; prob in "
                             "[0, 1]; threshold >= 0; patience, segment >= 1)")


@dataclass
class RunSpec:
    """What one finetuning run is: task timing, state variant, data and budget."""

    variant: str = "arli"
    strategy: str = "naive"  # async switch strategy of the base policy
    execute_horizon: int = 8
    env_steps: int = 12_000
    anchor_episodes: int = 60  # intervener episodes collected before learning
    intervention: InterventionSpec = field(default_factory=InterventionSpec)
    learn_after: int = 1000  # transitions in replay before the first update
    eval_every: int = 2500
    eval_episodes: int = 20
    seed: int = 0
    learner: LearnerConfig = field(default_factory=LearnerConfig)


