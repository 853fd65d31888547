"""Flow-matching conventions (pi0): t in (0, 1], t = 1 is noise, t = 0 is data.

x_t = t * eps + (1 - t) * A, target velocity u = eps - A, Euler from t = 1 to 0.
Real-Time Chunking guidance (Black et al. 2025) is written in data time tau = 1 - t.
Shapes: B batch, H chunk size, m action dim.
"""

from __future__ import annotations

import math

import torch


def sample_time(batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """t ~ Beta(1.5, 1) rescaled to (0.001, 1): more weight on noisy times. (B,)"""
    beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
    if generator is None:
        s = beta.sample((batch,))
    else:  # Beta has no generator argument: inverse-CDF of Beta(1.5, 1) is u^(1/1.5)
        s = torch.rand(batch, generator=generator) ** (1.0 / 1.5)
    return 0.001 + 0.999 * s


def interpolate(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t for actions/noise (B, H, m) and per-token times t (B, H)."""
    tt = t[..., None]
    return tt * noise + (1.0 - tt) * actions


def training_inputs(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor,
                    prefix_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of one flow-matching step with training-time RTC.

    actions, noise (B, H, m); t (B,) flow time; prefix_len (B,) committed slots per example
    (0 = plain flow matching). The first prefix_len slots are given clean (time 0) and get
    zero loss weight. Returns x_t (B, H, m), per-token t (B, H), target velocity (B, H, m),
    loss weight (B, H).
    """
    B, H, _ = actions.shape
    prefix = torch.arange(H)[None] < prefix_len[:, None]
    t_tok = torch.where(prefix, torch.zeros(B, H), t[:, None].expand(B, H))
    return interpolate(actions, noise, t_tok), t_tok, noise - actions, (~prefix).float()


def rtc_soft_mask(H: int, delay: int, execute_horizon: int) -> torch.Tensor:
    """Prefix weights W (H,): 1 on the committed prefix, exponential decay over the rest of
    the overlap with the previous chunk, 0 on actions the previous chunk never planned."""
    w = torch.zeros(H)
    end = H - execute_horizon
    for i in range(H):
        if i < delay:
            w[i] = 1.0
        elif i < end:
            c = (end - i) / (end - delay + 1)
            w[i] = c * (math.exp(c) - 1.0) / (math.e - 1.0)
    return w


def rtc_guidance_weight(tau: float, max_weight: float) -> float:
    """w(tau) = min(beta, (1 - tau)/tau * (tau^2 + (1 - tau)^2) / (1 - tau)^2)."""
    if tau <= 0.0:
        return max_weight
    if tau >= 1.0:
        return max_weight
    value = (1.0 - tau) / tau * (tau**2 + (1.0 - tau) ** 2) / (1.0 - tau) ** 2
    return min(max_weight, value)
