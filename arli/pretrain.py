"""Behaviour cloning of the flow policy on demonstration chunks (CPU, minutes)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable

import torch
from tqdm import tqdm

from arli.policies.flow import FlowChunkModel, FlowPolicy
from arli.policies.flow_config import FlowHyperparams, FlowPolicyConfig


def build_policy(data: dict, hyper: FlowHyperparams) -> FlowPolicy:
    """Flow policy sized for ``data`` with normalisation statistics from it."""
    state, chunks = data["state"], data["chunks"]
    images = data.get("images")
    cfg = FlowPolicyConfig(state_dim=state.shape[1], action_dim=chunks.shape[2],
                           state_names=data["state_names"], instruction=data["task"],
                           image_size=0 if images is None else int(images.shape[1]), **asdict(hyper))
    model = FlowChunkModel(cfg)
    flat = chunks.reshape(-1, chunks.shape[2])
    with torch.no_grad():
        model.state_mean.copy_(torch.as_tensor(state.mean(0)))
        model.state_std.copy_(torch.as_tensor(state.std(0) + 1e-3))
        model.action_mean.copy_(torch.as_tensor(flat.mean(0)))
        model.action_std.copy_(torch.as_tensor(flat.std(0) + 1e-3))
    return FlowPolicy(cfg, model)


def train_flow(policy: FlowPolicy, data: dict, steps: int, batch_size: int, lr: float,
               weight_decay: float, seed: int,
               evaluate: Callable[[FlowPolicy], float] | None = None, eval_every: int = 0,
               log: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Adam on the flow-matching loss; returns the history of logged metrics."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = policy.model
    state = (torch.as_tensor(data["state"]) - model.state_mean) / model.state_std
    chunks = (torch.as_tensor(data["chunks"]) - model.action_mean) / model.action_std
    images = None if data.get("images") is None else torch.as_tensor(data["images"])  # uint8
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    history: list[dict] = []
    model.train()
    start, running = time.time(), None
    bar = tqdm(range(1, steps + 1), desc="pretrain", unit="step", mininterval=1.0)
    for step in bar:
        idx = torch.randint(0, state.shape[0], (batch_size,), generator=gen)
        image = None if images is None else images[idx].permute(0, 3, 1, 2).float() / 255.0
        loss = model.loss(state[idx], chunks[idx], image, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{running:.4f}")
        if evaluate is not None and eval_every and (step % eval_every == 0 or step == steps):
            model.eval()
            success = evaluate(policy)
            model.train()
            entry = {"step": step, "loss": running, "success": success, "time_s": time.time() - start}
            history.append(entry)
            tqdm.write(f"step {step}: loss {running:.4f}  eval success {success:.2f}")
            if log:
                log(step, entry)
    model.eval()
    return history


def make_evaluator(env_name: str, episodes: int, seed: int, dt: float = 0.05,
                   image_size: int = 0) -> Callable[[FlowPolicy], float]:
    """Success of synchronous, zero-delay execution (the policy itself, no latency)."""
    from arli.latency import FixedLatency  # noqa: PLC0415
    from arli.rollout import evaluate_policy  # noqa: PLC0415
    from sim_envs import make_env  # noqa: PLC0415

    env = make_env(env_name, dt=dt, image_size=image_size)

    def evaluate(policy: FlowPolicy) -> float:
        cell = evaluate_policy(env, policy, "sync", FixedLatency(0.0), episodes, seed,
                               policy.cfg.execute_horizon)
        return cell["success"]

    return evaluate
