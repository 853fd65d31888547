"""Behaviour cloning of the flow policy on demonstration chunks (CPU, minutes), and the
pretraining job the commands and benchmarks run when the default base checkpoint is missing."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from typing import Callable

import torch
from tqdm import tqdm

from arli.config import PretrainConfig
from arli.demos import collect_demos, load_chunk_dataset

from arli.policies.flow import FlowChunkModel, FlowPolicy
from arli.policies.load import policy_digest
from arli.policies.flow_config import FlowHyperparams, FlowPolicyConfig


def build_policy(data: dict, hyper: FlowHyperparams) -> FlowPolicy:
    """Flow policy sized for ``data`` with normalisation statistics from it."""
    state, chunks = data["state"], data["chunks"]
    images = data.get("images")  # (N, C, S, S, 3) or None
    cfg = FlowPolicyConfig(state_dim=state.shape[1], action_dim=chunks.shape[2],
                           state_names=data["state_names"], instruction=data["task"],
                           image_size=0 if images is None else int(images.shape[2]),
                           cameras=list(data.get("cameras") or []) if images is not None else [], **asdict(hyper))
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
        image = None if images is None else images[idx].permute(0, 1, 4, 2, 3).float() / 255.0  # (B, C, 3, S, S)
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
                   image_size: int = 0, cameras: list[str] | None = None) -> Callable[[FlowPolicy], float]:
    """Success of synchronous, zero-delay execution (the policy itself, no latency)."""
    from arli.chunking import ChunkingConfig  # noqa: PLC0415
    from arli.latency import FixedLatency  # noqa: PLC0415
    from arli.rollout import evaluate_policy  # noqa: PLC0415
    from sim_envs import make_env  # noqa: PLC0415

    env = make_env(env_name, dt=dt, image_size=image_size, cameras=cameras or ["front"])

    def evaluate(policy: FlowPolicy) -> float:
        sync = ChunkingConfig(strategy="sync", execute_horizon=policy.cfg.execute_horizon)
        cell = evaluate_policy(env, policy, sync, FixedLatency(0.0), episodes, seed)
        return cell["success"]

    return evaluate


def ensure_demos(cfg: PretrainConfig) -> None:
    """Collect ``cfg.demos`` demonstrations if ``dataset_root`` holds none; say so when the
    dataset there has another count (an interrupted collection keeps its committed batches)."""
    info = os.path.join(cfg.dataset_root, "meta", "info.json")
    if not os.path.exists(info):
        print(f"no demos at {cfg.dataset_root}: collecting {cfg.demos} with the scripted expert")
        collect_demos(cfg.env.name, cfg.demos, cfg.dataset_root, cfg.seed, cfg.env.dt,
                      cfg.env.image_size, cameras=cfg.env.cameras)
        return
    with open(info, encoding="utf-8") as fh:
        have = int(json.load(fh).get("total_episodes", 0))
    if have != cfg.demos:
        print(f"warning: {cfg.dataset_root} holds {have} episodes, not demos={cfg.demos}; pretraining on "
              f"those {have} (delete the directory to collect {cfg.demos} afresh)")


def ensure_base_policy(checkpoint: str, pretrain_cfg: PretrainConfig, env_cfg) -> None:
    """Pretrain (collecting demos first if needed) when the *default* checkpoint holds no
    policy. Any other path must exist: a mistyped checkpoint is an error, not a 5-15 minute
    pretraining into the typo."""
    if checkpoint == "expert" or os.path.exists(os.path.join(checkpoint, "config.json")):
        return
    default = f"checkpoints/base_{env_cfg.name}"
    if os.path.normpath(checkpoint) != os.path.normpath(default):
        from arli.config import ConfigError  # noqa: PLC0415

        raise ConfigError(f"checkpoint: no policy at {checkpoint} (no config.json there); pass an existing "
                          f"checkpoint directory or 'expert', or train one: arli pretrain env={env_cfg.name} "
                          f"output_dir={checkpoint}")
    print(f"no base policy at {checkpoint}: running arli pretrain")
    pretrain_cfg.output_dir, pretrain_cfg.env = checkpoint, env_cfg
    pretrain(pretrain_cfg)


def pretrain(cfg: PretrainConfig) -> dict:
    """Train + save the base policy; returns the summary written next to the checkpoint."""
    ensure_demos(cfg)
    start = time.time()
    data = load_chunk_dataset(cfg.dataset_root, cfg.policy.chunk_size)
    # seeded before the network is built: its initial weights come from the global generator,
    # and an unseeded init made every fresh clone's base policy a different one
    torch.manual_seed(cfg.seed)
    policy = build_policy(data, cfg.policy)
    evaluate = make_evaluator(cfg.env.name, cfg.eval_episodes, seed=50_000, dt=cfg.env.dt,
                              image_size=policy.cfg.image_size, cameras=policy.cfg.cameras)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        history = train_flow(policy, data, cfg.steps, cfg.batch_size, cfg.lr, cfg.weight_decay,
                             cfg.seed, evaluate, cfg.eval_every)
    finally:
        torch.set_num_threads(threads)
    policy.save(cfg.output_dir)
    summary = {"env": cfg.env.name, "frames": int(len(data["state"])),
               "episodes": int(data["episode_index"].max() + 1), "steps": cfg.steps, "threads": cfg.threads,
               "digest": policy_digest(cfg.output_dir),
               "train_time_s": round(time.time() - start, 1), "history": history}
    with open(os.path.join(cfg.output_dir, "pretrain_summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    return summary
