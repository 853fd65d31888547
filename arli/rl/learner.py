"""Replay-anchored residual TD learner (TD3-style with an ensemble critic), top to bottom.

Anchor pretraining (``pretrain_actor``): before any online data, the actor is behaviour-cloned
onto anchor replay, so the executed action starts near the intervener's.
Critic: E LayerNorm heads; target = R_n + discount * min over a random subset of target
heads at (s', clip(b' + scale * (pi_targ(s') + smoothing noise))).
Actor: ``anchor_weight`` times the anchor term (executed action vs anchor action on the
anchor rows of each mixed batch: demonstrations and intervention segments), minus
``q_weight`` times the mean head's Q of the executed action divided by its mean magnitude
(TD3+BC-style). Warm-up: the first ``critic_warmup_updates`` updates train only the critic,
so the actor moves only once the critic means something.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from tqdm import tqdm

from arli.policies.residual import EnsembleCritic, ResidualActor, compose_action
from arli.rl.config import LearnerConfig
from arli.rl.replay import ReplayBuffer, mixed_batch


def anchor_term(action: torch.Tensor, anchor_action: torch.Tensor, is_anchor: torch.Tensor) -> torch.Tensor:
    """Mean squared distance (summed over action dims) between executed actions (B, m) and
    anchor actions (B, m) over the rows flagged in ``is_anchor`` (B,)."""
    per_row = ((action - anchor_action) ** 2).sum(-1)
    return (per_row * is_anchor).sum() / is_anchor.sum().clamp(min=1.0)


class ResidualLearner:
    """Owns the actor, critic, their targets and optimisers; one ``update`` = one gradient step."""

    def __init__(self, cfg: LearnerConfig, state_dim: int, action_dim: int, seed: int = 0):
        cfg.validate()
        torch.manual_seed(seed)
        self.cfg, self.state_dim, self.action_dim = cfg, state_dim, action_dim
        self.actor = ResidualActor(state_dim, action_dim, cfg.hidden)
        self.critic = EnsembleCritic(state_dim, action_dim, cfg.critic_heads, cfg.hidden)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0

    # -- acting --------------------------------------------------------------------------
    @torch.no_grad()
    def residual(self, state: np.ndarray, explore: bool) -> np.ndarray:
        """r (m,) in [-1, 1] for one state (D,)."""
        r = self.actor(torch.as_tensor(state, dtype=torch.float32)[None])[0]
        if explore:
            r = r + self.cfg.exploration_std * torch.randn(r.shape, generator=self.generator)
        return r.clamp(-1.0, 1.0).numpy()

    def executed(self, base: np.ndarray, residual: np.ndarray) -> np.ndarray:
        return compose_action(base, residual, self.cfg.residual_scale)

    # -- learning ------------------------------------------------------------------------
    def update(self, online: ReplayBuffer, anchor: ReplayBuffer) -> dict[str, float]:
        cfg = self.cfg
        b = mixed_batch(online, anchor, cfg.batch_size, cfg.anchor_ratio, self.generator)
        scale = cfg.residual_scale
        with torch.no_grad():
            noise = (torch.randn(b["next_base"].shape, generator=self.generator) * cfg.target_noise)
            r_next = (self.actor_target(b["next_state"]) + noise.clamp(-cfg.target_noise_clip,
                                                                        cfg.target_noise_clip)).clamp(-1, 1)
            q_next = self.critic_target(b["next_state"], compose_action(b["next_base"], r_next, scale))
            heads = torch.randperm(cfg.critic_heads, generator=self.generator)[: cfg.critic_subset]
            target = b["ret"] + b["discount"] * q_next[heads].min(dim=0).values
        q = self.critic(b["state"], b["action"])  # (E, B)
        critic_loss = ((q - target[None]) ** 2).mean()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        self.updates += 1
        stats = {"critic_loss": critic_loss.item(), "q_mean": q.mean().item()}

        if self.updates > cfg.critic_warmup_updates and self.updates % cfg.policy_delay == 0:
            action = compose_action(b["base"], self.actor(b["state"]), scale)
            bc = anchor_term(action, b["action"], b["is_anchor"])
            actor_loss = cfg.anchor_weight * bc
            if cfg.q_weight > 0:
                q_pi = self.critic(b["state"], action).mean(0)
                # unit-scaled (TD3+BC-style) so q_weight keeps its meaning as returns grow
                actor_loss = actor_loss - cfg.q_weight * (q_pi / q_pi.abs().mean().detach().clamp(min=1e-3)).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_opt.step()
            self._polyak()
            stats.update(actor_loss=actor_loss.item(), anchor_bc=bc.item())
        elif self.updates % cfg.policy_delay == 0:
            self._polyak(actor=False)
        return stats

    def pretrain_actor(self, anchor: ReplayBuffer, updates: int, progress: bool = False) -> float:
        """Anchor pretraining: behaviour-clone the executed action onto anchor actions before
        any online data exists (the base under delay can be far off; starting the residual
        from the anchor data is what makes a small online budget enough). Returns the last loss.
        Uses its own optimiser so the actor's RL optimiser state starts fresh."""
        if updates <= 0 or len(anchor) == 0:
            return float("nan")
        opt = torch.optim.Adam(self.actor.parameters(), lr=self.cfg.pretrain_lr)
        loss = torch.zeros(())
        for _ in tqdm(range(updates), desc="anchor pretraining", unit="upd", disable=not progress,
                      mininterval=1.0):
            b = anchor.sample(self.cfg.batch_size, self.generator)
            action = compose_action(b["base"], self.actor(b["state"]), self.cfg.residual_scale)
            loss = anchor_term(action, b["action"], torch.ones(len(action)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        self.actor_target.load_state_dict(self.actor.state_dict())
        return float(loss.item())

    @torch.no_grad()
    def _polyak(self, actor: bool = True) -> None:
        pairs = [(self.critic, self.critic_target)] + ([(self.actor, self.actor_target)] if actor else [])
        for net, targ in pairs:
            for p, tp in zip(net.parameters(), targ.parameters()):
                tp.lerp_(p, self.cfg.tau)

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "actor_target": self.actor_target.state_dict(),
                "critic_target": self.critic_target.state_dict(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "generator": self.generator.get_state(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        for name in ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt"):
            getattr(self, name).load_state_dict(state[name])
        self.generator.set_state(state["generator"])
        self.updates = int(state["updates"])
