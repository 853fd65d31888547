"""Replay-anchored residual TD learner (TD3-style, ensemble critic), top to bottom.

Critic: E LayerNorm heads trained on mixed batches (online + anchor rows); target
``R_n + discount * min over a random subset of target heads`` at
``(s', clip(b' + scale * (pi_targ(s') + clipped noise)))``, clipped to the reachable return
range [q_min, q_max] (sparse success reward, episodes end on success).

Actor (every ``policy_delay`` updates, after ``critic_warmup_updates`` critic-only ones), in
residual units r in [-1, 1]^m; ``actor_update`` picks how the critic drives it:

* ``awr``: advantage-weighted regression onto the batch's own residuals,
  weight exp(q_weight * A / awr_temperature), A = Q(s, a) - Q(s, pi(s)) (``awr_advantage=q``)
  or TD target - Q(s, pi(s)) (``td``); anchor rows count ``anchor_weight`` times, fading to 0
  over ``anchor_decay_updates`` (``q_weight=0``, ungated: plain BC on anchor rows, the control;
  ``awr_weights=uniform``: every row weighted 1, the uniform control);
* ``dpg``: -q_weight * Q(s, pi(s)) / mean|Q| + anchor_weight * Q-filtered BC (TD3+BC-style);
* ``select`` (default): regression onto the highest-Q of nearby candidates (PA-RL/EXPO-style),
  anchor rows counting ``anchor_weight`` times as in ``awr``.

Anchor rows' weight can fade out after the warm-up (``anchor_decay_updates``), the TD
backup can take the max-Q of candidates around pi'(s') (``backup_candidates``, EXPO / PLD)
and acting the max-Q of candidates around pi(s) (``gate_candidates``; both 8 by default: value
gating, the base always a candidate); ``awr_advantage="q"``
computes awr's advantage as Q(s, a) - Q(s, pi(s)) from the same heads on both sides.
Every variant adds the trust region ``start_weight * ||r(s) - r_start(s)||^2``, r_start the
frozen actor RL started from (0 = off).

Anchor pretraining (``pretrain_actor``): before any online step the actor is behaviour-cloned
onto anchor replay, so RL starts from the anchored policy (the ``anchor_only`` control), and
that policy becomes r_start.
"""

from __future__ import annotations

import copy
import zlib

import numpy as np
import torch
from tqdm import tqdm

from arli.compute import retain_freed_memory
from arli.policies.residual import EnsembleCritic, ResidualActor, compose_action
from arli.policies.residual_np import GATE_PICKS, gate_pick
from arli.rl.config import LearnerConfig
from arli.rl.flat_adam import FlatAdam, FlatParameters
from arli.rl.replay import ReplayBuffer, mixed_batch
from arli.types import SOURCES


def gate_shares(picks: dict[str, int]) -> str:
    """``pi 0.62 base 0.08 perturbed 0.30``: each pick's share of the gate's choices counted."""
    total = max(sum(picks.values()), 1)
    return " ".join(f"{k} {v / total:.2f}" for k, v in picks.items())


class LearnerDiverged(RuntimeError):
    """A non-finite loss or a Q value outside the reachable range: training must stop."""

    exit_code = 3  # what a command stops with: a supervisor does not restart it (same checkpoint, same end)


def anchor_term(action: torch.Tensor, anchor_action: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted mean squared distance (summed over action dims) between executed actions
    (B, m) and anchor actions (B, m); ``weight`` (B,) is 0 on rows that do not count."""
    per_row = ((action - anchor_action) ** 2).sum(-1)
    return (per_row * weight).sum() / weight.sum().clamp(min=1.0)


def advantage_spread(advantage: torch.Tensor, heads: torch.Tensor | None, weight: torch.Tensor,
                     max_weight: float) -> dict[str, float]:
    """What AWR's weights carry: advantages A (B,) across the batch against the critic heads'
    disagreement about them (``heads`` (E, B): each head's own A; None for the TD advantage),
    and the weights' (B,) effective sample size as a share of the batch (1 = uniform, the
    critic steers nothing). ``advantage_snr`` < 1: the heads disagree about a row's advantage
    by more than the rows differ, so the weights mostly follow critic noise."""
    a = advantage.abs()
    out = {"advantage_std": advantage.std().item(), "advantage_abs_p50": a.median().item(),
           "awr_weight_ess": (weight.sum() ** 2 / (weight**2).sum().clamp(min=1e-12) / len(weight)).item(),
           "awr_weight_clipped": (weight >= max_weight).float().mean().item()}
    if heads is not None and len(heads) > 1:
        disagreement = heads.std(0).mean()
        out["advantage_head_std"] = disagreement.item()
        out["advantage_snr"] = (advantage.std() / disagreement.clamp(min=1e-12)).item()
    return out


class ResidualLearner:
    """Owns the actor, critic, their targets and optimisers; one ``update`` = one gradient step."""

    def __init__(self, cfg: LearnerConfig, state_dim: int, action_dim: int, seed: int = 0, device: str = "cpu"):
        """``device``: where the networks and updates run (a resolved torch device). Every
        random draw stays on the CPU generator, so a seed means the same run on any device."""
        cfg.validate()
        retain_freed_memory()  # per-update activations reuse heap pages (no page faults)
        torch.manual_seed(seed)
        self.cfg, self.state_dim, self.action_dim = cfg, state_dim, action_dim
        self.device = torch.device(device)
        self.actor = ResidualActor(state_dim, action_dim, cfg.hidden).to(self.device)
        self.critic = EnsembleCritic(state_dim, action_dim, cfg.critic_heads, cfg.critic_hidden).to(self.device)
        self._actor_init = copy.deepcopy(self.actor.state_dict())  # the zero residual
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_start = copy.deepcopy(self.actor).requires_grad_(False)  # the trust region's centre
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        # every network's parameters are views of one flat buffer: Adam, zeroing and Polyak
        # are then a few whole-buffer operations instead of a loop over tensors (flat_adam.py)
        self.actor_flat, self.critic_flat = FlatParameters(self.actor), FlatParameters(self.critic)
        self.actor_target_flat = FlatParameters(self.actor_target)
        self.critic_target_flat = FlatParameters(self.critic_target)
        self.actor_opt = FlatAdam(self.actor_flat, lr=cfg.actor_lr)
        self.critic_opt = FlatAdam(self.critic_flat, lr=cfg.critic_lr)
        self.generator = torch.Generator().manual_seed(seed)
        self._acting_generator = torch.Generator()  # evaluation's gating draws (``_state_seeded``)
        # value gating acts once the critic is past its warm-up; not for the start deployed in
        # place of a trained residual (``revert_to_start``): it was judged acting alone
        self.gating = True
        # the gate's choices while acting gated (GATE_PICKS): what ran, but for the exploration noise added
        # after the choice, a takeover, and `standard`'s planned slots a new chunk or the episode's end drops
        self.gate_picks = np.zeros(len(GATE_PICKS), np.int64)
        self.updates = 0
        self._noise: torch.Tensor | None = None  # the exploration process's last value (1, m)

    # -- acting --------------------------------------------------------------------------
    def candidates(self, r_pi: torch.Tensor, count: int, std: float,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Residual candidates around the actor's r_pi (B, m) -> (count, B, m): r_pi itself,
        zero (the base action) and ``count - 2`` Gaussian perturbations of r_pi (drawn from
        ``generator``, default the training stream)."""
        noise = torch.randn((max(count - 2, 0), *r_pi.shape), generator=generator or self.generator).to(r_pi.device)
        noise = noise * std
        return torch.cat([r_pi[None], torch.zeros_like(r_pi)[None], (r_pi[None] + noise).clamp(-1, 1)])[:count]

    def best_candidate(self, state: torch.Tensor, base: torch.Tensor, cands: torch.Tensor,
                       critic: EnsembleCritic | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidate residual (B, m) of ``cands`` (K, B, m) that ``choose`` picks from the Q
        of ``critic`` (default: the online critic), and every head's Q there (E, B)."""
        K, B, m = cands.shape
        best, q = self.best_index(state, base, cands, critic)
        return cands.gather(0, best.view(1, B, 1).expand(1, B, m))[0], q.gather(1, best.view(1, 1, B).expand(
            q.shape[0], 1, B))[:, 0]

    def best_index(self, state: torch.Tensor, base: torch.Tensor, cands: torch.Tensor,
                   critic: EnsembleCritic | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Index (B,) into ``cands`` (K, B, m) of the candidate ``choose`` picks, and every
        head's Q of every candidate (E, K, B)."""
        q = (critic or self.critic).candidates(state, compose_action(base, cands, self.cfg.residual_scale))
        return self.choose(q), q

    def choose(self, q: torch.Tensor) -> torch.Tensor:
        """Index (B,) of the chosen candidate from every head's Q (E, K, B) of K candidates, the
        first being the actor's own: the highest mean-head Q, or with ``gate_confidence`` k > 0
        the highest lower bound of the advantage over the first, mean_E(A) - k std_E(A) with
        A = Q_e(c) - Q_e(first) per head (the first's bound is 0, so it stays unless some
        candidate's advantage is positive beyond the heads' disagreement about it)."""
        k = self.cfg.gate_confidence
        if k == 0:
            return q.mean(0).argmax(0)
        advantage = q - q[:, :1]
        return (advantage.mean(0) - k * advantage.std(0)).argmax(0)

    def begin_episode(self) -> None:
        """Restarts the exploration process (its correlation never spans two episodes)."""
        self._noise = None

    def exploration_noise(self, shape: torch.Size) -> torch.Tensor:
        """Next unit-variance exploration sample of ``shape`` (1, m): independent per step,
        AR(1) with correlation ``exploration_corr`` within an episode (stationary from its
        first step, so its marginal std never changes), or differenced white noise
        (xi_t - xi_{t-1}) / sqrt(2) (``exploration_differenced``; xi_{-1} = 0)."""
        xi = torch.randn(shape, generator=self.generator)
        if self.cfg.exploration_differenced:
            prev, self._noise = self._noise, xi
            return xi / 2**0.5 if prev is None else (xi - prev) / 2**0.5
        rho = self.cfg.exploration_corr
        if rho > 0 and self._noise is not None:
            xi = rho * self._noise + (1.0 - rho * rho) ** 0.5 * xi
        self._noise = xi
        return xi

    @torch.no_grad()
    def act(self, state: np.ndarray, base: np.ndarray, explore: bool) -> np.ndarray:
        """Executed action a (m,) for one state (D,) and base action b (m,).

        With ``gate_candidates`` K > 1 (value gating, EXPO-style) the residual is the
        highest-Q of {pi(s), 0 (the base), K - 2 perturbations of pi(s)}, so the critic
        decides what runs; exploration noise is added after the choice, while training."""
        cfg = self.cfg
        s = torch.as_tensor(state, dtype=torch.float32, device=self.device)[None]
        r = self.actor(s)
        # an untrained critic (no update yet, even with no warm-up) does not choose: pi(s) acts
        if self.gating and cfg.gate_candidates > 1 and self.updates >= max(1, cfg.critic_warmup_updates):
            # without exploration the perturbations are seeded by the state: the gated policy is then
            # a function of the state (an evaluated episode replays, as its video does) and an
            # evaluation draws nothing from the training stream (its cadence changes no training)
            generator = self.generator if explore else self._state_seeded(state)
            cands = self.candidates(r, cfg.gate_candidates, cfg.gate_std, generator)
            best = int(self.best_index(s, torch.as_tensor(base, dtype=torch.float32, device=self.device)[None],
                                       cands)[0][0])
            r = cands[best]
            self.gate_picks[gate_pick(best)] += 1
        if explore:
            r = r + cfg.exploration_std * self.exploration_noise(r.shape).to(self.device)
        return compose_action(np.asarray(base, np.float32), r[0].clamp(-1.0, 1.0).cpu().numpy(), cfg.residual_scale)

    def _state_seeded(self, state: np.ndarray) -> torch.Generator:
        """A generator seeded by the state's bytes (CRC-32): the same state, the same draws."""
        self._acting_generator.manual_seed(zlib.crc32(np.ascontiguousarray(state, np.float32).tobytes()))
        return self._acting_generator

    @torch.no_grad()
    def q_value(self, state: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Mean-head Q for states (N, D) and executed actions (N, m) -> (N,)."""
        return self.critic(torch.as_tensor(state, dtype=torch.float32, device=self.device),
                           torch.as_tensor(action, dtype=torch.float32, device=self.device)).mean(0).cpu().numpy()

    # -- learning ------------------------------------------------------------------------
    def update(self, online: ReplayBuffer, anchor: ReplayBuffer, diagnostics: bool = False) -> dict[str, float]:
        """One critic step (and every ``policy_delay``-th an actor step). ``diagnostics``
        adds per-source TD errors, gradient norms and residual magnitude to the stats."""
        cfg = self.cfg
        b = self._to_device(mixed_batch(online, anchor, cfg.batch_size, cfg.anchor_ratio, self.generator))
        scale = cfg.residual_scale
        with torch.no_grad():
            noise = torch.randn(b["next_base"].shape, generator=self.generator).to(self.device) * cfg.target_noise
            r_next = (self.actor_target(b["next_state"])
                      + noise.clamp(-cfg.target_noise_clip, cfg.target_noise_clip)).clamp(-1, 1)
            q_next = None
            if cfg.backup_candidates > 1:  # max-Q backup (EXPO / PLD): what a value-gated actor does
                r_next, q_next = self.best_candidate(b["next_state"], b["next_base"],
                                                     self.candidates(r_next, cfg.backup_candidates, cfg.gate_std),
                                                     self.critic_target)
            heads = torch.randperm(cfg.critic_heads, generator=self.generator)[: cfg.critic_subset]
            # the chosen candidate's heads were scored already while choosing: reuse them
            q_next = (self.critic_target(b["next_state"], compose_action(b["next_base"], r_next, scale), heads)
                      if q_next is None else q_next[heads])
            # returns live in [q_min, q_max]: clipping keeps an extrapolating head from inflating all
            target = (b["ret"] + b["discount"] * q_next.min(dim=0).values).clamp(cfg.q_min, cfg.q_max)
        q = self.critic(b["state"], b["action"])  # (E, B)
        td = q - target[None]
        critic_loss = (td**2).mean()
        stats = {"critic_loss": critic_loss.item(), "q_mean": q.detach().mean().item()}
        if cfg.cql_weight > 0:  # stats' critic_loss stays the TD part; the gap is reported beside it
            gap = self._cql_gap(b, q)
            critic_loss = critic_loss + cfg.cql_weight * gap
            stats["cql_gap"] = gap.item()
        if not (np.isfinite(stats["critic_loss"]) and abs(stats["q_mean"]) <= cfg.max_abs_q):
            raise LearnerDiverged(f"critic diverged at update {self.updates}: loss {stats['critic_loss']:.3g}, "
                                  f"mean Q {stats['q_mean']:.3g} (returns are in [{cfg.q_min}, {cfg.q_max}]); "
                                  "lower run.learner.critic_lr or run.learner.tau")
        self.critic_opt.zero_grad()
        critic_loss.backward()
        grad_norm = self._clip(self.critic_flat, diagnostics)
        if diagnostics:
            stats["critic_grad_norm"] = grad_norm
            err = td.detach().abs().mean(0)
            for code, name in enumerate(SOURCES):
                rows = b["source"] == code
                if rows.any():
                    stats[f"td_abs/{name}"] = err[rows].mean().item()
                    stats[f"q/{name}"] = q.detach().mean(0)[rows].mean().item()
        self.critic_opt.step()
        self.updates += 1

        if self.updates > cfg.critic_warmup_updates and self.updates % cfg.policy_delay == 0:
            stats.update(self._actor_step(b, q.detach().mean(0), target, diagnostics))
            self._polyak(actor=True)
        elif self.updates % cfg.policy_delay == 0:
            self._polyak(actor=False)
        return stats

    def _cql_gap(self, b: dict[str, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """CQL's gap on the gate's candidates: mean over heads and rows of the soft maximum
        T logsumexp_K(Q_e(s, c_k) / T) of the K candidates around pi(s) minus Q_e(s, a) of the
        row's own action (``q``: (E, B)); the actor is fixed here (its residual detached)."""
        cfg = self.cfg
        with torch.no_grad():
            cands = self.candidates(self.actor(b["state"]), cfg.gate_candidates, cfg.gate_std)  # (K, B, m)
        K, B, m = cands.shape
        actions = compose_action(b["base"], cands, cfg.residual_scale).reshape(K * B, m)
        # the forward pass with gradient (``candidates`` scores without one)
        q_c = self.critic(b["state"].repeat(K, 1), actions).view(-1, K, B)  # (E, K, B)
        t = cfg.cql_temperature
        return (t * torch.logsumexp(q_c / t, dim=1) - q).mean()

    def _actor_step(self, b: dict[str, torch.Tensor], q_data: torch.Tensor, target: torch.Tensor,
                    diagnostics: bool) -> dict[str, float]:
        """``q_data`` (B,): the critic's mean Q of the batch's own actions (from the critic step,
        before its optimiser step: the Q-filter's reference, no second forward pass);
        ``target`` (B,): the rows' TD targets R_n + gamma^n Q'(s_n, pi'(s_n))."""
        if self.cfg.actor_update == "select":
            return self._select_step(b, diagnostics)
        if self.cfg.actor_update == "awr":
            return self._awr_step(b, target, diagnostics)
        cfg = self.cfg
        r = self.actor(b["state"])
        action = compose_action(b["base"], r, cfg.residual_scale)
        weight = b["is_anchor"]
        loss = torch.zeros(())
        q_pi = None
        if cfg.q_weight > 0 or cfg.q_filter:
            q_pi = self.critic(b["state"], action).mean(0)
        if cfg.q_filter and self.anchor_weight() > 0:
            weight = weight * (q_data > q_pi.detach()).float()
        bc = anchor_term(action, b["action"], weight)
        loss = loss + self.anchor_weight() * bc
        if cfg.q_weight > 0:
            loss = loss - cfg.q_weight * (q_pi / q_pi.abs().mean().detach().clamp(min=1e-3)).mean()
        stats = {"anchor_bc": bc.item(), "anchor_kept": (weight.sum() / b["is_anchor"].sum().clamp(min=1)).item()}
        if diagnostics and q_pi is not None:
            stats["q_pi"] = q_pi.detach().mean().item()
        return self._actor_apply(loss + self._start_term(b["state"], r), r, stats, diagnostics)

    def _awr_step(self, b: dict[str, torch.Tensor], target: torch.Tensor, diagnostics: bool) -> dict[str, float]:
        """Advantage-weighted regression onto the data's own actions (online and anchor rows):
        A = Q(s, a) - Q(s, pi(s)) with the mean of the online heads on both sides
        (``awr_advantage=q``), or ``target`` (B,) - Q(s, pi(s)) with the row's TD target
        R_n + gamma^n Q'(s_n, pi'(s_n)) (``td``); weight exp(A / awr_temperature) clipped at
        awr_max_weight. The targets never leave the data's support. ``q_weight = 0``: plain
        BC on anchor rows (the control); ``awr_weights=uniform``: every row weighted 1."""
        cfg = self.cfg
        r = self.actor(b["state"])
        r_data = ((b["action"] - b["base"]) / cfg.residual_scale).clamp(-1, 1)
        if cfg.awr_weights == "uniform":  # the control: the critic steers nothing
            advantage, weight = torch.zeros_like(target), torch.ones_like(target)
        elif cfg.q_weight > 0:
            advantage, heads, weight = self._awr_weights(b, r.detach(), r_data, target)
            stats = {"advantage": advantage.mean().item()}
            if diagnostics:
                stats.update(advantage_spread(advantage, heads, weight, cfg.awr_max_weight))
            return self._regress(b, r, r_data, weight, stats, diagnostics)
        else:
            advantage, weight = torch.zeros_like(target), b["is_anchor"]
        return self._regress(b, r, r_data, weight, {"advantage": advantage.mean().item()}, diagnostics)

    @torch.no_grad()
    def _awr_weights(self, b: dict[str, torch.Tensor], r: torch.Tensor, r_data: torch.Tensor,
                     target: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """AWR's advantage A (B,), each head's own A (E, B) (None for ``td``) and the weights
        (B,) for a batch, the actor's residuals r (B, m) and the data's r_data (B, m)."""
        cfg = self.cfg
        value_heads = self.critic(b["state"], compose_action(b["base"], r, cfg.residual_scale))
        if cfg.awr_advantage == "td":
            q_data, heads = target, None
        else:  # "q": the data's action; "q_bounded": where the regression target r_data acts
            action = b["action"] if cfg.awr_advantage == "q" else compose_action(b["base"], r_data, cfg.residual_scale)
            q_heads = self.critic(b["state"], action)
            q_data, heads = q_heads.mean(0), q_heads - value_heads
        # "q": both sides from the same online heads, Q(s, a) - V(s) with V(s) = Q(s, pi(s))
        advantage = q_data - value_heads.mean(0)
        weight = torch.exp(cfg.q_weight * advantage / cfg.awr_temperature).clamp(max=cfg.awr_max_weight)
        return advantage, heads, weight

    @torch.no_grad()
    def measure_awr(self, replay: ReplayBuffer, rows: int = 2048) -> dict[str, float]:
        """AWR's advantage spread and weight ESS (``advantage_spread``) on ``rows`` rows of
        ``replay`` at the current critic and actor: what a run's checkpoint says about how much
        its critic steers the actor. Needs a Q-based advantage (``awr_advantage`` q or
        q_bounded: the TD advantage needs each row's target)."""
        if self.cfg.awr_advantage == "td":
            raise ValueError("run.learner.awr_advantage=td: the advantage needs each row's TD target; measure a run "
                             "with awr_advantage=q or q_bounded")
        # its own generator: measuring a run mid-way leaves its draws (and so the run) unchanged
        b = self._to_device(replay.sample(rows, torch.Generator().manual_seed(0)))
        r_data = ((b["action"] - b["base"]) / self.cfg.residual_scale).clamp(-1, 1)
        advantage, heads, weight = self._awr_weights(b, self.actor(b["state"]), r_data, None)
        return advantage_spread(advantage, heads, weight, self.cfg.awr_max_weight)

    def _select_step(self, b: dict[str, torch.Tensor], diagnostics: bool) -> dict[str, float]:
        """Critic-selected regression (PA-RL / EXPO-style): the target of every row is the
        highest-Q of {pi(s), 0, perturbations of pi(s), the row's own action (anchor rows;
        online rows too)}, and the actor regresses onto it. The critic decides what the actor
        becomes, but only among actions near the actor and the data — never off support.
        ``q_weight = 0`` makes it plain BC on anchor rows (the control)."""
        cfg = self.cfg
        r = self.actor(b["state"])
        r_data = ((b["action"] - b["base"]) / cfg.residual_scale).clamp(-1, 1)
        if cfg.q_weight > 0:
            with torch.no_grad():
                cands = torch.cat([self.candidates(r.detach(), cfg.gate_candidates, cfg.gate_std), r_data[None]])
                target = self.best_candidate(b["state"], b["base"], cands)[0]
            weight = torch.ones_like(b["is_anchor"])
        else:
            target, weight = r_data, b["is_anchor"]
        stats = {"moved_to_data": ((target - r_data).abs().sum(-1) < 1e-6).float().mean().item()}
        return self._regress(b, r, target, weight, stats, diagnostics)

    def _faded(self, weight: float, decay_updates: int) -> float:
        """``weight`` falling linearly to 0 over ``decay_updates`` updates after the critic
        warm-up (0 = never fades)."""
        if decay_updates == 0:
            return weight
        done = max(0, self.updates - self.cfg.critic_warmup_updates) / decay_updates
        return weight * max(0.0, 1.0 - done)

    def anchor_weight(self) -> float:
        """The anchor rows' weight in the actor's loss now: ``anchor_weight``, fading over
        ``anchor_decay_updates``."""
        return self._faded(self.cfg.anchor_weight, self.cfg.anchor_decay_updates)

    def start_weight(self) -> float:
        """The trust region's weight now: ``start_weight``, fading over ``start_decay_updates``."""
        return self._faded(self.cfg.start_weight, self.cfg.start_decay_updates)

    def _clip(self, params: FlatParameters, diagnostics: bool) -> float | None:
        """Scales the flat gradient to norm ``grad_clip`` when above it (0 = off). Returns the
        norm *before* clipping when ``diagnostics`` (what says whether the clip is active)."""
        if self.cfg.grad_clip <= 0:
            return params.grad_norm() if diagnostics else None
        norm = torch.linalg.vector_norm(params.grad)
        params.grad.mul_((self.cfg.grad_clip / (norm + 1e-6)).clamp(max=1.0))
        return norm.item() if diagnostics else None

    def _start_term(self, state: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Trust region: start_weight * mean_B ||r - r_start(s)||^2 for states (B, D) and the
        actor's residuals r (B, m); zero when the weight (``start_weight()``) is 0."""
        weight = self.start_weight()
        if weight == 0:
            return torch.zeros(())
        with torch.no_grad():
            r_start = self.actor_start(state)
        return weight * ((r - r_start) ** 2).sum(-1).mean()

    def _regress(self, b: dict[str, torch.Tensor], r: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
                 stats: dict[str, float], diagnostics: bool) -> dict[str, float]:
        """One actor step on the weighted regression of r (B, m) onto target (B, m), weight (B,),
        plus the trust region to the start at the batch's states. Anchor rows count
        ``anchor_weight`` times (0: after pretraining, only online rows are regressed onto)."""
        weight = weight * (1 - b["is_anchor"] + self.anchor_weight() * b["is_anchor"])
        stats["weight_online"] = ((weight * (1 - b["is_anchor"])).sum() / weight.sum().clamp(min=1e-6)).item()
        loss = (((r - target) ** 2).sum(-1) * weight).sum() / weight.sum().clamp(min=1.0)
        return self._actor_apply(loss + self._start_term(b["state"], r), r, stats, diagnostics)

    def _actor_apply(self, loss: torch.Tensor, r: torch.Tensor, stats: dict[str, float],
                     diagnostics: bool) -> dict[str, float]:
        """One actor optimiser step on ``loss`` (a finite scalar, else the run stops), with the
        gradient clipped; adds the loss (and with ``diagnostics`` the pre-clip gradient norm and
        the mean |residual| of the batch's r (B, m) in action units) to ``stats``."""
        if not torch.isfinite(loss):
            raise LearnerDiverged(f"actor loss is not finite at update {self.updates}")
        self.actor_opt.zero_grad()
        loss.backward()
        grad_norm = self._clip(self.actor_flat, diagnostics)
        stats["actor_loss"] = loss.item()
        if diagnostics:
            stats["actor_grad_norm"] = grad_norm
            stats["residual_abs"] = (self.cfg.residual_scale * r.detach()).abs().mean().item()
        self.actor_opt.step()
        return stats

    def pretrain_actor(self, anchor: ReplayBuffer, updates: int, progress: bool = False) -> float:
        """Anchor pretraining: behaviour-clone the executed action onto anchor actions before
        any online data exists. Returns the last loss. Uses its own optimiser so the actor's
        RL optimiser state starts fresh."""
        if updates <= 0 or len(anchor) == 0:
            return float("nan")
        opt = FlatAdam(self.actor_flat, lr=self.cfg.pretrain_lr)
        loss = torch.zeros(())
        for _ in tqdm(range(updates), desc="anchor pretraining", unit="upd", disable=not progress,
                      mininterval=1.0):
            b = self._to_device(anchor.sample(self.cfg.batch_size, self.generator))
            action = compose_action(b["base"], self.actor(b["state"]), self.cfg.residual_scale)
            loss = anchor_term(action, b["action"], torch.ones(len(action), device=self.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.actor_start.load_state_dict(self.actor.state_dict())
        return float(loss.item())

    def revert_to_start(self) -> None:
        """Back to the actor RL started from (``actor_start``), its target with it, and a fresh
        actor optimiser; the critic keeps what it learned, and acting is ungated again: the start
        is deployed as it acted when RL began and as the guards judged it."""
        for net in (self.actor, self.actor_target):
            net.load_state_dict(self.actor_start.state_dict())
        self.actor_opt = FlatAdam(self.actor_flat, lr=self.cfg.actor_lr)
        self.gating = False

    def reset_actor(self) -> None:
        """Back to the initial actor (exactly zero residual: the base acts), its target and the
        trust region's centre with it, and a fresh actor optimiser."""
        for net in (self.actor, self.actor_target, self.actor_start):
            net.load_state_dict(self._actor_init)
        self.actor_opt = FlatAdam(self.actor_flat, lr=self.cfg.actor_lr)

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A replay batch (sampled on the CPU) on the learner's device (a no-op on the CPU)."""
        return batch if self.device.type == "cpu" else {k: v.to(self.device, non_blocking=True)
                                                         for k, v in batch.items()}

    @torch.no_grad()
    def _polyak(self, actor: bool = True) -> None:
        self.critic_target_flat.data.lerp_(self.critic_flat.data, self.cfg.tau)
        if actor:
            self.actor_target_flat.data.lerp_(self.actor_flat.data, self.cfg.tau)

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "actor_target": self.actor_target.state_dict(), "actor_start": self.actor_start.state_dict(),
                "critic_target": self.critic_target.state_dict(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "generator": self.generator.get_state(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        for name in ("actor", "critic", "actor_target", "actor_start", "critic_target", "actor_opt", "critic_opt"):
            getattr(self, name).load_state_dict(state[name])
        self.generator.set_state(state["generator"])
        self.updates = int(state["updates"])
        self.gating = True  # the trained learner acts gated; ``revert_to_start`` deploys its start ungated
