"""Built-in pi0-style base policy: observation encoder + transformer trunk + flow-matching
action expert that samples a chunk of ``chunk_size`` actions.

Tokens: [state, language, (image)] + H action tokens (noisy actions + per-token flow time).
Per-token time makes training-time RTC natural: committed-prefix tokens carry clean actions
at time 0 ("data") and are excluded from the loss.
Checkpoint = one directory: ``config.json`` + ``model.safetensors`` (weights and
normalisation statistics).
"""

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import asdict

import numpy as np
import torch
from torch import nn

from arli.policies.base import BasePolicy, BatchRequestError, with_prefix
from arli.policies.flow_config import RTC_MODES, FlowPolicyConfig  # noqa: F401 - re-export
from arli.policies.flow_math import (rtc_guidance_weight, rtc_soft_mask, sample_time,
                                     training_inputs)
from arli.types import PolicyRequest

def hash_tokens(text: str, vocab: int, max_len: int = 16) -> torch.Tensor:
    """Deterministic word-hash token ids (max_len,), 0 = padding."""
    ids = [1 + zlib.crc32(w.encode()) % (vocab - 1) for w in text.lower().split()][:max_len]
    return torch.tensor(ids + [0] * (max_len - len(ids)), dtype=torch.long)


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of flow times t (...,) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)
    ang = t[..., None] * freqs * 100.0
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)


class FlowChunkModel(nn.Module):
    """v_theta(x_t, o, t): (B, H, m) velocities."""

    def __init__(self, cfg: FlowPolicyConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d = cfg.d_model
        self.state_enc = nn.Sequential(nn.Linear(cfg.state_dim, d), nn.GELU(), nn.Linear(d, d))
        self.lang_emb = nn.EmbeddingBag(cfg.vocab_size, d, mode="mean", padding_idx=0)
        self.image_enc = None
        if cfg.image_size:
            self.image_enc = nn.Sequential(
                nn.Conv2d(3, 16, 5, stride=2), nn.GELU(), nn.Conv2d(16, 32, 3, stride=2), nn.GELU(),
                nn.Conv2d(32, 32, 3, stride=2), nn.GELU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                nn.Linear(128, d))
        # one image token per camera from the shared encoder; several cameras are told apart
        # by a learned embedding (one camera needs none, which keeps older checkpoints loading)
        self.camera_emb = nn.Parameter(torch.zeros(len(cfg.cameras), d)) if len(cfg.cameras) > 1 else None
        self.action_in = nn.Linear(cfg.action_dim, d)
        self.time_mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.pos = nn.Parameter(torch.zeros(cfg.chunk_size, d))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(d, cfg.n_heads, cfg.ff_dim, dropout=0.0,
                                           batch_first=True, norm_first=True, activation="gelu")
        self.trunk = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, cfg.action_dim))
        # normalisation statistics, saved with the weights
        self.register_buffer("state_mean", torch.zeros(cfg.state_dim))
        self.register_buffer("state_std", torch.ones(cfg.state_dim))
        self.register_buffer("action_mean", torch.zeros(cfg.action_dim))
        self.register_buffer("action_std", torch.ones(cfg.action_dim))
        self.register_buffer("lang_tokens", hash_tokens(cfg.instruction, cfg.vocab_size))

    def context(self, state: torch.Tensor, images: torch.Tensor | None = None,
                lang: torch.Tensor | None = None) -> torch.Tensor:
        """Observation tokens (B, T_obs, d) from normalised state (B, n), camera images
        (B, C, 3, S, S) in ``cfg.cameras`` order (or (B, 3, S, S) for one camera) and
        instruction token ids (B, L) (default: the instruction trained on)."""
        B = state.shape[0]
        tokens = self.lang_tokens[None].expand(B, -1) if lang is None else lang
        toks = [self.state_enc(state)[:, None], self.lang_emb(tokens)[:, None]]
        if self.image_enc is not None:
            if images is None:
                raise ValueError(f"this policy needs camera(s) {list(self.cfg.cameras)} of shape "
                                 f"({self.cfg.image_size}, {self.cfg.image_size}, 3); the observation has none")
            if images.ndim == 4:
                images = images[:, None]
            C = images.shape[1]
            feats = self.image_enc(images.reshape(B * C, *images.shape[2:])).view(B, C, -1)
            if self.camera_emb is not None:
                feats = feats + self.camera_emb[None, :C]
            toks.append(feats)
        return torch.cat(toks, dim=1)

    def velocity(self, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """ctx (B, T_obs, d), x (B, H, m), per-token t (B, H) -> (B, H, m)."""
        a = self.action_in(x) + self.pos + self.time_mlp(time_embedding(t, self.cfg.d_model))
        h = self.trunk(torch.cat([ctx, a], dim=1))
        return self.out(h[:, ctx.shape[1]:])

    # -- training ----------------------------------------------------------------------
    def loss(self, state: torch.Tensor, actions: torch.Tensor, image: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Flow-matching loss on normalised state (B, n) and action chunks (B, H, m)."""
        B = actions.shape[0]
        noise = torch.randn(actions.shape, generator=generator)
        t = sample_time(B, generator)
        prefix_len = torch.zeros(B, dtype=torch.long)
        if self.cfg.rtc_mode == "prefix":  # training-time RTC: random committed prefix
            prefix_len = torch.randint(0, self.cfg.rtc_max_prefix + 1, (B,), generator=generator)
        x, t_tok, target, weight = training_inputs(actions, noise, t, prefix_len)
        v = self.velocity(self.context(state, image), x, t_tok)
        err = ((v - target) ** 2).mean(-1)
        return (err * weight).sum() / weight.sum().clamp(min=1.0)

    # -- sampling ----------------------------------------------------------------------
    def sample(self, state: torch.Tensor, image: torch.Tensor | None = None,
               prefix: torch.Tensor | None = None, delay: int | list[int] = 0,
               generator: torch.Generator | None = None, execute_horizon: int | list[int | None] | None = None,
               lang: torch.Tensor | None = None, prefix_len: list[int] | None = None,
               noise: torch.Tensor | None = None) -> torch.Tensor:
        """Euler sampling of normalised chunks (B, H, m).

        prefix: (B, L, m) normalised actions of the previous chunk for slots 0..L-1 (the
        first ``delay`` are committed); rows of a batch may differ: ``prefix_len`` (B,) valid
        slots per row (default L), ``delay`` and ``execute_horizon`` one per row or one for
        all. rtc_mode 'prefix' writes the committed ones in; 'guidance' pulls the chunk toward
        the prefix with the soft mask (one VJP per step) spanning ``execute_horizon`` (the
        scheduler's s; default the one trained with). ``noise`` (B, H, m): the starting point
        (default drawn from ``generator``).
        """
        cfg = self.cfg
        B, H, m = state.shape[0], cfg.chunk_size, cfg.action_dim
        dev = self.pos.device
        # noise is drawn on the CPU generator whatever the device: a seed gives the same chunk on both
        x = (torch.randn((B, H, m), generator=generator) if noise is None else noise).to(dev)
        n = cfg.num_steps
        lengths = [0] * B
        if prefix is not None and prefix.shape[1] > 0:
            lengths = list(prefix_len) if prefix_len is not None else [prefix.shape[1]] * B
        use_prefix = any(lengths) and cfg.rtc_mode != "none"
        with torch.no_grad():
            ctx = self.context(state, image, lang)
        if use_prefix:
            delays = list(delay) if isinstance(delay, (list, tuple)) else [delay] * B
            horizons = list(execute_horizon) if isinstance(execute_horizon, (list, tuple)) else [execute_horizon] * B
            target = torch.zeros(B, H, m)
            clean = torch.zeros(B, H, dtype=torch.bool)
            mask = torch.zeros(B, H, 1)
            for b in range(B):  # per-row masks: robots in one batch wait for different prefixes
                L = min(lengths[b], H)
                if L == 0:
                    continue
                target[b, :L] = prefix[b, :L]
                d = min(delays[b], L)
                if cfg.rtc_mode == "prefix":
                    clean[b, :d] = True
                else:
                    s = cfg.execute_horizon if horizons[b] is None else horizons[b]
                    w = rtc_soft_mask(H, d, max(s, d))
                    w[L:] = 0.0
                    mask[b, :, 0] = w
            target, clean, mask = target.to(dev), clean.to(dev), mask.to(dev)
        for k in range(n):
            t_now = 1.0 - k / n
            t = torch.full((B, H), t_now, device=dev)
            if use_prefix and cfg.rtc_mode == "prefix":
                x = torch.where(clean[..., None], target, x)
                t = torch.where(clean, torch.zeros_like(t), t)
            if use_prefix and cfg.rtc_mode == "guidance":
                x_req = x.detach().requires_grad_(True)
                with torch.enable_grad():
                    v = self.velocity(ctx, x_req, t)
                    a_hat = x_req - t[..., None] * v  # clean-chunk estimate
                    err = mask * (target - a_hat)
                    (g,) = torch.autograd.grad(a_hat, x_req, grad_outputs=err)
                w = rtc_guidance_weight(1.0 - t_now, cfg.rtc_max_weight)
                x = (x + (-v.detach() + w * g) / n).detach()
            else:
                with torch.no_grad():
                    x = x - self.velocity(ctx, x, t) / n
        if use_prefix and cfg.rtc_mode == "prefix":
            x = torch.where(clean[..., None], target, x)
        return x.detach()


class FlowPolicy(BasePolicy):
    """Base-policy wrapper: numpy in, numpy out, normalisation, save/load."""

    batchable = True

    def __init__(self, cfg: FlowPolicyConfig, model: FlowChunkModel | None = None):
        self.cfg = cfg
        self.model = model or FlowChunkModel(cfg)
        self.model.eval()
        self.chunk_size, self.action_dim = cfg.chunk_size, cfg.action_dim
        self._gen = torch.Generator().manual_seed(0)
        self.device = torch.device("cpu")

    def to(self, device: str) -> "FlowPolicy":
        """Serve from ``device`` (cpu, cuda, cuda:1); sampling noise stays on the CPU generator."""
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self._gen.manual_seed(seed)

    def _norm_state(self, state: np.ndarray) -> torch.Tensor:
        s = torch.as_tensor(np.asarray(state, np.float32), device=self.device)
        if s.ndim != 1 or s.shape[0] != self.cfg.state_dim:
            raise ValueError(f"observation.state must have shape ({self.cfg.state_dim},) "
                             f"{self.cfg.state_names or ''}, got {tuple(s.shape)}")
        return ((s - self.model.state_mean) / self.model.state_std)[None]

    def camera_shapes(self) -> dict[str, tuple[int, int, int]]:
        size = self.cfg.image_size
        return {name: (size, size, 3) for name in self.cfg.cameras} if size else {}

    def _images(self, images: dict[str, np.ndarray]) -> torch.Tensor | None:
        """Cameras by name -> (1, C, 3, S, S) in ``cfg.cameras`` order; errors name the camera."""
        cfg = self.cfg
        if not cfg.image_size:
            return None
        size, out = cfg.image_size, []
        for name in cfg.cameras:
            if name not in images:
                raise ValueError(f"camera {name!r} missing: this policy needs "
                                 f"{ {c: (size, size, 3) for c in cfg.cameras} } (h, w, 3) uint8, the observation "
                                 f"has {sorted(images)}")
            image = np.asarray(images[name])
            if image.shape != (size, size, 3) or image.dtype != np.uint8:
                raise ValueError(f"camera {name!r} must be a ({size}, {size}, 3) uint8 image, got "
                                 f"{image.shape} {image.dtype}")
            out.append(torch.as_tensor(image, device=self.device).float().permute(2, 0, 1) / 255.0)
        return torch.stack(out)[None]

    def _lang(self, instruction: str) -> torch.Tensor | None:
        """Token ids (1, L) of the request's instruction; None: the one trained on."""
        if not instruction or instruction == self.cfg.instruction:
            return None
        return hash_tokens(instruction, self.cfg.vocab_size)[None].to(self.device)

    def infer(self, request: PolicyRequest) -> np.ndarray:
        """request -> actions (H, m). ``guidance`` (L, m): previous chunk over the overlap
        (defaults to the committed prefix)."""
        return self.infer_batch([request])[0]

    def infer_batch(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        """B requests (several robots) -> B chunks (H, m) from one forward pass per flow step;
        each row keeps its own state, cameras, instruction, prefix, delay and horizon. A
        request that does not fit the policy raises ValueError naming it (and its camera)."""
        m = self.model
        prefixes = [r.guidance if r.guidance is not None else r.committed_prefix for r in requests]
        lengths = [0 if p is None else len(p) for p in prefixes]
        p = None
        if any(lengths):
            p = torch.zeros(len(requests), max(lengths), self.action_dim, device=self.device)
            for b, prefix in enumerate(prefixes):
                if lengths[b]:
                    p[b, :lengths[b]] = (torch.as_tensor(np.array(prefix, np.float32), device=self.device)
                                         - m.action_mean) / m.action_std
        states, images, langs = [], [], []
        for b, r in enumerate(requests):
            try:
                states.append(self._norm_state(r.state))
                images.append(self._images(r.images))
                langs.append(self._lang(r.instruction))
            except ValueError as exc:
                raise (BatchRequestError(b, str(exc)) if len(requests) > 1 else exc) from None
        lang = None
        if any(tok is not None for tok in langs):
            lang = torch.cat([m.lang_tokens[None] if tok is None else tok for tok in langs])
        x = m.sample(torch.cat(states), None if images[0] is None else torch.cat(images), p,
                     [r.delay for r in requests], self._gen, [r.execute_horizon for r in requests], lang, lengths)
        chunks = (x * m.action_std + m.action_mean).cpu().numpy()
        return [with_prefix(chunks[b], r.committed_prefix) for b, r in enumerate(requests)]

    def save(self, path: str) -> None:
        from safetensors.torch import save_file  # noqa: PLC0415

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fh:
            json.dump({"type": "arli_flow", **asdict(self.cfg)}, fh, indent=1)
        state = {k: v.contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, os.path.join(path, "model.safetensors"))

    @classmethod
    def load(cls, path: str) -> "FlowPolicy":
        from safetensors.torch import load_file  # noqa: PLC0415

        cfg_path = os.path.join(path, "config.json")
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"no policy checkpoint at {path} (missing config.json); "
                                    "run `arli pretrain` first")
        raw = json.load(open(cfg_path, encoding="utf-8"))
        if raw.pop("type", None) != "arli_flow":
            raise ValueError(f"{cfg_path} is not an arli_flow checkpoint")
        cfg = FlowPolicyConfig(**raw)
        model = FlowChunkModel(cfg)
        model.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return cls(cfg, model)
