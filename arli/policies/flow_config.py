"""Configuration of the built-in flow policy (no torch import: the CLI schema uses it).

``FlowHyperparams`` is what a user sets (the ``policy`` group of ``arli pretrain``);
``FlowPolicyConfig`` adds what the data determines and is saved with the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arli.errors import require

RTC_MODES = ("none", "guidance", "prefix")


@dataclass
class FlowHyperparams:
    chunk_size: int = 16  # H
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    ff_dim: int = 256
    num_steps: int = 10  # Euler integration steps at inference
    rtc_mode: str = "guidance"  # none | guidance (inference-time RTC) | prefix (training-time RTC)
    rtc_max_weight: float = 5.0  # beta, clip of the guidance weight
    rtc_max_prefix: int = 6  # training-time RTC: max sampled delay
    execute_horizon: int = 8  # s of the RTC soft mask when a request does not carry the scheduler's

    def validate(self) -> None:
        """ConfigError naming the ``policy.*`` field that is out of range."""
        require(self.chunk_size >= 2, "policy.chunk_size", ">= 2", self.chunk_size)
        require(self.d_model >= 1 and self.n_heads >= 1 and self.d_model % self.n_heads == 0, "policy.d_model",
                f"a positive multiple of n_heads={self.n_heads}", self.d_model)
        require(self.num_steps >= 1, "policy.num_steps", ">= 1", self.num_steps)
        require(self.rtc_mode in RTC_MODES, "policy.rtc_mode", f"one of {RTC_MODES}", self.rtc_mode)
        require(1 <= self.execute_horizon <= self.chunk_size, "policy.execute_horizon",
                f"in [1, {self.chunk_size}]", self.execute_horizon)


@dataclass
class FlowPolicyConfig(FlowHyperparams):
    state_dim: int = 0
    action_dim: int = 5
    vocab_size: int = 512  # hashed word vocabulary of the instruction embedding
    image_size: int = 0  # 0 = state only
    cameras: list[str] = field(default_factory=list)  # camera names, one image token each
    state_names: list[str] = field(default_factory=list)
    instruction: str = ""

    def __post_init__(self) -> None:
        if self.image_size and not self.cameras:  # a checkpoint saved before cameras were named
            self.cameras = ["front"]

    def validate(self) -> None:
        super().validate()
        require(self.state_dim >= 1, "state_dim", ">= 1", self.state_dim)
        require(self.action_dim >= 1, "action_dim", ">= 1", self.action_dim)
