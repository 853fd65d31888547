"""Offline refits of a run's critic (another action input or critic settings): ``arli bench critic refit=[...]``.

The learner's critic sees the executed action ``a = clip(b + scale * r)`` (m of its D + m
inputs, in action units). The actions its replay holds at one state differ by the run's
exploration, ``scale * exploration_std`` (0.03 action units by default): tiny next to the
normalised observation. A refit asks whether the critic ranks such moves once it sees them at
the data's scale. Each treatment trains a fresh critic on the run's own replay (online and
anchor rows, the learner's batch mix, TD targets, target heads and smoothing) for ``updates``
critic steps while the run's residual stays fixed: the learner's own off-policy TD evaluation
of that residual (the judged Monte-Carlo returns continue with it). The same candidates on the
same states are then scored by every refit, so treatments are compared on identical labels.

Treatments (``TREATMENTS``):

* ``executed``: the learner's own input, a (B, m) — the control (a fresh critic on a fixed replay);
* ``residual``: r = (a - b) / scale (B, m), the residual units the actor acts in;
* ``residual_std``: r / exploration_std (B, m), one unit = one exploration step;

each optionally with other critic settings (``"executed:anchor_ratio=0,critic_heads=10"``,
``REFIT_SETTINGS``), so critic settings too are compared on the same data and labels.

A diagnostic only: no run trains with it (the learner's critic is unchanged).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
from torch import nn

from arli.config import REFIT_TREATMENTS as TREATMENTS, parse_refit
from arli.errors import ConfigError
from arli.policies.residual import EnsembleCritic
from arli.rl.flat_adam import FlatAdam, FlatParameters
from arli.rl.learner import LearnerDiverged, ResidualLearner


class ActionInputCritic(nn.Module):
    """An ensemble critic that sees the action through a treatment: s (B, D), a (B, m) -> (E, B)
    (or (k, B) for ``heads``); b is read from the state's base-action slice ``base``."""

    def __init__(self, inner: EnsembleCritic, treatment: str, base: slice, scale: float, exploration_std: float):
        super().__init__()
        if treatment not in TREATMENTS:
            raise ValueError(f"refit: expected treatments from {TREATMENTS}, got {treatment!r}")
        if treatment == "residual_std" and exploration_std <= 0:
            raise ValueError("refit: residual_std divides by the run's exploration_std, which is 0")
        self.inner, self.treatment, self.base = inner, treatment, base
        self.gain = 1.0 / scale / (exploration_std if treatment == "residual_std" else 1.0)

    def encode(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The action as this critic sees it: state (B, D), action (B, m) or (K, B, m)."""
        return action if self.treatment == "executed" else (action - state[..., self.base]) * self.gain

    def forward(self, state: torch.Tensor, action: torch.Tensor, heads: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner(state, self.encode(state, action), heads)

    def candidates(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """K candidate actions per state, as ``EnsembleCritic.candidates``: (K, B, m) -> (E, K, B)."""
        return self.inner.candidates(state, self.encode(state, actions))


def refit_critic(ft, entry: str, updates: int, seed: int = 0, bar=None) -> ResidualLearner:
    """A learner whose fresh critic (``entry``: its action input, optionally with other critic
    settings, ``parse_refit``) was trained ``updates`` critic steps on ``ft``'s replay with ``ft``'s
    residual fixed as the policy it evaluates; score candidates with its
    ``q_value(states (N, D), actions (N, m)) -> (N,)``. ``bar`` advances once per update."""
    treatment, overrides = parse_refit(entry)
    lc = ft.learner.cfg  # the run learner's own (its q_min accounts for a takeover penalty; the spec's does not)
    # the actor never steps (its warm-up outlasts the refit): the critic evaluates the run's residual
    cfg = dataclasses.replace(lc, critic_warmup_updates=updates + 1, **overrides)
    src = ft.learner
    learner = ResidualLearner(cfg, src.state_dim, src.action_dim, seed=seed, device="cpu")
    for name in ("actor", "actor_target"):
        getattr(learner, name).load_state_dict(src.actor.state_dict())
    critic = ActionInputCritic(EnsembleCritic(src.state_dim, src.action_dim, cfg.critic_heads, cfg.critic_hidden),
                               treatment, ft.builder.layout.base_action, cfg.residual_scale, cfg.exploration_std)
    # the learner's optimiser and Polyak run on flat views of its critic's parameters: rebind them
    learner.critic, learner.critic_target = critic, copy.deepcopy(critic).requires_grad_(False)
    learner.critic_flat, learner.critic_target_flat = FlatParameters(critic), FlatParameters(learner.critic_target)
    learner.critic_opt = FlatAdam(learner.critic_flat, lr=cfg.critic_lr)
    for _ in range(updates):
        learner.update(ft.online, ft.anchor)
        if bar is not None:
            bar.update(1)
    return learner


def refit_scores(ft, treatments: list[str], updates: int, states: np.ndarray, actions: np.ndarray,
                 seed: int = 0, bar=None) -> dict[str, np.ndarray | None]:
    """treatment -> mean-head Q (N,) of each refit for candidate states (N, D) and actions (N, m);
    None for a refit whose critic diverged."""
    out: dict[str, np.ndarray | None] = {}
    for treatment in treatments:
        try:
            learner = refit_critic(ft, treatment, updates, seed, bar)
        except (LearnerDiverged, ConfigError) as exc:
            # one refit's failure (e.g. critic_subset above this run's heads) keeps the others' scores and the labels
            print(f"refit {treatment}: {exc}", flush=True)
            out[treatment] = None
            continue
        out[treatment] = learner.q_value(states, actions).astype(float)
    return out
