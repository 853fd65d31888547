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
    residual_scale: float = 0.5  # a = clip(b + scale * r); the base is far off under delay
    exploration_std: float = 0.1  # Gaussian noise on r during data collection
    target_noise: float = 0.1  # target policy smoothing (on r)
    target_noise_clip: float = 0.25
    policy_delay: int = 2  # actor / target updates every k critic updates
    anchor_ratio: float = 0.5  # share of each batch drawn from anchor replay
    anchor_weight: float = 2.5  # weight of the anchor (BC) term next to the unit-scaled Q term
    critic_warmup_updates: int = 500  # critic-only updates before the actor moves
    utd: int = 1  # updates per environment step
    buffer_size: int = 200_000

    def validate(self) -> None:
        checks = {
            "learner.gamma": 0 < self.gamma <= 1, "learner.n_step": self.n_step >= 1,
            "learner.batch_size": self.batch_size >= 2,
            "learner.critic_subset": 1 <= self.critic_subset <= self.critic_heads,
            "learner.anchor_ratio": 0 <= self.anchor_ratio <= 1,
            "learner.residual_scale": 0 < self.residual_scale <= 2,
            "learner.utd": self.utd >= 1, "learner.policy_delay": self.policy_delay >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid learner settings: {bad} (see LearnerConfig for allowed ranges)")


@dataclass
class RunSpec:
    """What one finetuning run is: task timing, state variant, data and budget."""

    variant: str = "arli"
    strategy: str = "naive"  # async switch strategy of the base policy
    execute_horizon: int = 8
    env_steps: int = 12_000
    anchor_episodes: int = 20  # intervener episodes collected before learning
    intervention_prob: float = 0.3  # share of training episodes the intervener takes over
    intervene_after: int = 50  # ... at this step, if the episode is still running
    learn_after: int = 1000  # transitions in replay before the first update
    eval_every: int = 2500
    eval_episodes: int = 20
    seed: int = 0
    learner: LearnerConfig = field(default_factory=LearnerConfig)


