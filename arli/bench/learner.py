"""``arli bench learner``: updates/s of the residual learner (its AWR update without value gating,
`+recipe=awr`) vs a straightforward CleanRL-style PyTorch implementation of the same update,
measured in the same run, and the gated default's updates/s beside them.

Both do, per update: sample a 50/50 online/anchor batch, one TD step on an E-head LayerNorm
critic (target = min over a random pair of target heads at the smoothed target action,
clipped to the return range), and every ``policy_delay``-th update an actor step (``awr``:
advantage-weighted regression onto the rows' actions) and Polyak averaging. Shapes are the defaults for the default
task (``arli`` state of peg_insert, m = 5). The reference keeps E separate ``nn.Sequential``
critics looped in Python, evaluates every target head, and averages targets parameter by
parameter — what one writes first.
"""

from __future__ import annotations

import copy
import json
import os
import time

import numpy as np
import torch
from torch import nn

from arli.augment import StateBuilder
from arli.bench.common import cpu_model, machine_info, print_last_line_json, write_report
from arli.compute import resolve_device
from arli.config import BenchLearnerConfig
from arli.errors import ConfigError
from arli.policies.residual import ResidualActor, compose_action
from arli.rl.config import LearnerConfig

# the reference's update (AWR, acting with pi, the TD3 backup): the former default, `+recipe=awr`
TD3_BACKUP = {"actor_update": "awr", "gate_candidates": 0, "backup_candidates": 0}
from arli.rl.learner import ResidualLearner, anchor_term
from arli.rl.replay import ReplayBuffer, mixed_batch
from arli.types import DEMO


class ReferenceLearner:
    """CleanRL-style: one nn.Sequential per critic head, Python loops, the same math."""

    def __init__(self, cfg: LearnerConfig, state_dim: int, action_dim: int, seed: int = 0, device: str = "cpu"):
        torch.manual_seed(seed)
        self.cfg = cfg
        self.device = torch.device(device)

        def critic() -> nn.Module:
            h = cfg.critic_hidden
            return nn.Sequential(nn.Linear(state_dim + action_dim, h), nn.LayerNorm(h, elementwise_affine=False),
                                 nn.ReLU(), nn.Linear(h, h), nn.LayerNorm(h, elementwise_affine=False), nn.ReLU(),
                                 nn.Linear(h, 1))

        self.critics = nn.ModuleList([critic() for _ in range(cfg.critic_heads)]).to(self.device)
        self.critics_target = copy.deepcopy(self.critics)
        self.actor = ResidualActor(state_dim, action_dim, cfg.hidden).to(self.device)
        self.actor_target = copy.deepcopy(self.actor)
        self.critic_opt = torch.optim.Adam(self.critics.parameters(), lr=cfg.critic_lr)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0

    def q_all(self, critics: nn.ModuleList, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([state, action], -1)
        return torch.stack([c(x).squeeze(-1) for c in critics])

    def update(self, online: ReplayBuffer, anchor: ReplayBuffer) -> None:
        cfg = self.cfg
        b = {k: v.to(self.device) for k, v in
             mixed_batch(online, anchor, cfg.batch_size, cfg.anchor_ratio, self.generator).items()}
        with torch.no_grad():
            noise = (torch.randn(b["next_base"].shape, device=self.device)
                     * cfg.target_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
            r_next = (self.actor_target(b["next_state"]) + noise).clamp(-1, 1)
            next_action = compose_action(b["next_base"], r_next, cfg.residual_scale)
            q_next = self.q_all(self.critics_target, b["next_state"], next_action)
            pair = torch.randperm(cfg.critic_heads, device=self.device)[: cfg.critic_subset]
            target = (b["ret"] + b["discount"] * q_next[pair].min(0).values).clamp(cfg.q_min, cfg.q_max)
        q = self.q_all(self.critics, b["state"], b["action"])
        loss = sum(((q[e] - target) ** 2).mean() for e in range(cfg.critic_heads)) / cfg.critic_heads
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        self.updates += 1
        if self.updates % cfg.policy_delay:
            return
        r = self.actor(b["state"])  # AWR actor step, as the learner's under `+recipe=awr`
        r_data = ((b["action"] - b["base"]) / cfg.residual_scale).clamp(-1, 1)
        with torch.no_grad():
            value = self.q_all(self.critics, b["state"], compose_action(b["base"], r, cfg.residual_scale)).mean(0)
            weight = torch.exp(cfg.q_weight * (target - value) / cfg.awr_temperature).clamp(max=cfg.awr_max_weight)
        actor_loss = (((r - r_data) ** 2).sum(-1) * weight).sum() / weight.sum()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()
        with torch.no_grad():
            for net, targ in ((self.critics, self.critics_target), (self.actor, self.actor_target)):
                for p, tp in zip(net.parameters(), targ.parameters()):
                    tp.data.mul_(1 - cfg.tau).add_(cfg.tau * p.data)


def filled_buffers(state_dim: int, action_dim: int, rows: int, seed: int) -> tuple[ReplayBuffer, ReplayBuffer]:
    """Online and anchor replay with ``rows`` random transitions each."""
    rng = np.random.default_rng(seed)
    bufs = []
    for source in (0, DEMO):
        buf = ReplayBuffer(rows, state_dim, action_dim)
        n = rows
        buf.data["state"][:] = rng.normal(size=(n, state_dim))
        buf.data["next_state"][:] = rng.normal(size=(n, state_dim))
        for key in ("base", "action", "next_base"):
            buf.data[key][:] = rng.uniform(-1, 1, (n, action_dim))
        buf.data["ret"][:] = rng.random(n) < 0.1
        buf.data["discount"][:] = 0.99**3
        buf.data["source"][:] = source
        buf.size = n
        bufs.append(buf)
    return bufs[0], bufs[1]


def rate(update, seconds: float, warmup: int, device: str = "cpu") -> float:
    """Updates per second of ``update()`` over about ``seconds`` (at least 10 calls) after
    ``warmup`` calls. On a GPU each block of 10 waits for its queued kernels, so a rate counts
    finished work, not launches."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        update()
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            update()
        sync()
        count += 10
    return count / (time.perf_counter() - start)


def update_flops(cfg: LearnerConfig, state_dim: int, action_dim: int) -> float:
    """Matmul FLOPs of one update (critic step + the actor step amortised over policy_delay)."""
    B, E, h, ha = cfg.batch_size, cfg.critic_heads, cfg.critic_hidden, cfg.hidden
    critic_fwd = 2 * B * ((state_dim + action_dim) * h + h * h + h)  # one head, forward
    actor_fwd = 2 * B * (state_dim * ha + ha * ha + ha * action_dim)
    critic_step = 3 * E * critic_fwd + cfg.critic_subset * critic_fwd + actor_fwd  # fwd+bwd, target
    actor_step = 3 * actor_fwd + E * critic_fwd  # pi forward + backward, V(s) = Q(s, pi(s)) forward
    return critic_step + actor_step / cfg.policy_delay


def matmul_peak_gflops(device: str = "cpu", seconds: float = 1.0) -> float:
    """Dense float32 matmul throughput of ``device``, GFLOP/s (1024 x 1024 on the CPU, 8192 x
    8192 on a GPU, where 1024 is launch-bound)."""
    n = 1024 if device == "cpu" else 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return rate(lambda: a @ b, seconds, 3, device) * 2 * n**3 / 1e9


def sweep(cfg: BenchLearnerConfig, device: str, state_dim: int, online: ReplayBuffer,
          anchor: ReplayBuffer) -> list[dict]:
    """Updates/s of the learner (TD3 backup, as the reference) at each ``[batch, critic heads, critic hidden]`` of
    ``cfg.shapes`` (the target's min stays over 2 heads): what a bigger ensemble (ResFiT: 10
    heads) or batch costs on this device."""
    rows = []
    for batch, heads, hidden in cfg.shapes:
        shape_cfg = LearnerConfig(critic_warmup_updates=0, batch_size=batch, critic_heads=heads,
                                  critic_hidden=hidden, **TD3_BACKUP)
        learner = ResidualLearner(shape_cfg, state_dim, cfg.action_dim, cfg.seed, device=device)
        per_s = rate(lambda: learner.update(online, anchor), cfg.seconds, 3, device)
        flops = update_flops(shape_cfg, state_dim, cfg.action_dim)
        rows.append({"batch_size": batch, "critic_heads": heads, "critic_hidden": hidden,
                     "updates_per_s": round(per_s, 1), "update_ms": round(1000 / per_s, 2),
                     "gflop_per_update": round(flops / 1e9, 3), "achieved_gflop_s": round(per_s * flops / 1e9, 1)})
    return rows


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else cpu_model()


def report_name(device: str) -> str:
    """``learner`` for the CPU report, ``learner_cuda`` for a GPU's (never overwriting the CPU one)."""
    return "learner" if device == "cpu" else "learner_cuda"


def measure(cfg: BenchLearnerConfig) -> dict:
    """Run the measurements; the report's JSON payload (everything ``report_md`` needs)."""
    torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    # the reference's math (acting with pi, the TD3 backup): the default's value gating adds the
    # scoring of its backup candidates, measured on its own below (``gated_updates_per_s``)
    learner_cfg = LearnerConfig(critic_warmup_updates=0, **TD3_BACKUP)  # the full update, actor included
    D = StateBuilder("arli", cfg.obs_dim, cfg.action_dim, cfg.chunk_size).dim
    online, anchor = filled_buffers(D, cfg.action_dim, 20_000, cfg.seed)
    ours = ResidualLearner(learner_cfg, D, cfg.action_dim, cfg.seed, device=device)
    ref = ReferenceLearner(learner_cfg, D, cfg.action_dim, cfg.seed, device=device)
    # interleaved, best of two rounds each: this machine's speed drifts between seconds
    gated = ResidualLearner(LearnerConfig(critic_warmup_updates=0), D, cfg.action_dim, cfg.seed, device=device)
    ours_rate = ref_rate = gated_rate = 0.0
    for _ in range(2):
        ours_rate = max(ours_rate, rate(lambda: ours.update(online, anchor), cfg.seconds, 20, device))
        ref_rate = max(ref_rate, rate(lambda: ref.update(online, anchor), cfg.seconds, 20, device))
        gated_rate = max(gated_rate, rate(lambda: gated.update(online, anchor), cfg.seconds, 20, device))
    # what bounds it: the same update with tiny networks (the per-update dispatch floor) and
    # the device's dense matmul peak
    tiny_cfg = LearnerConfig(critic_warmup_updates=0, hidden=4, critic_hidden=4, batch_size=8)
    tiny = ResidualLearner(tiny_cfg, D, cfg.action_dim, cfg.seed, device=device)
    floor_ms = 1000 / rate(lambda: tiny.update(online, anchor), cfg.seconds, 20, device)
    peak = matmul_peak_gflops(device)
    flops = update_flops(learner_cfg, D, cfg.action_dim)
    payload = {"device": device, "device_name": device_name(device), "torch": torch.__version__,
               "cuda": torch.version.cuda,
               "command": "arli bench learner --json" + ("" if device == "cpu" else f" device={cfg.device}"),
               "seconds": cfg.seconds,
               "updates_per_s": round(ours_rate, 1), "reference_updates_per_s": round(ref_rate, 1),
               "ratio": round(ours_rate / ref_rate, 2), "gflop_per_update": round(flops / 1e9, 3),
               "gated_updates_per_s": round(gated_rate, 1),
               "gate_candidates": LearnerConfig.gate_candidates, "backup_candidates": LearnerConfig.backup_candidates,
               "achieved_gflop_s": round(ours_rate * flops / 1e9, 1), "matmul_peak_gflop_s": round(peak, 1),
               "dispatch_floor_ms": round(floor_ms, 2), "update_ms": round(1000 / ours_rate, 2),
               "compute_gflop_s": round(flops / 1e9 / max(1000 / ours_rate - floor_ms, 1e-3) * 1000, 1),
               "state_dim": D, "action_dim": cfg.action_dim,
               "batch_size": learner_cfg.batch_size, "critic_heads": learner_cfg.critic_heads,
               "critic_hidden": learner_cfg.critic_hidden, "actor_hidden": learner_cfg.hidden,
               "policy_delay": learner_cfg.policy_delay, "threads": cfg.threads,
               "sweep": sweep(cfg, device, D, online, anchor), "machine": machine_info()}
    if device == "cpu":
        payload["target_updates_per_s"] = 150
    return payload


def report_md(p: dict) -> str:
    """The Markdown report, from the JSON payload alone (so ``report_only`` rewrites it from a
    committed JSON). Keys that reports written earlier lack read the defaults those runs had."""
    device = p["device"]
    on_cpu = device == "cpu"
    command = p.get("command", "arli bench learner --json" + ("" if on_cpu else f" device={device}"))
    name = p.get("device_name", device)
    threads = f"{p['threads']} CPU thread{'s' * (p['threads'] != 1)}"
    where = threads if on_cpu else f"{name}, replay sampled on the CPU with {threads}"
    ours_rate, ref_rate, floor_ms = p["updates_per_s"], p["reference_updates_per_s"], p["dispatch_floor_ms"]
    update_ms, flops, peak = p["update_ms"], p["gflop_per_update"] * 1e9, p["matmul_peak_gflop_s"]
    compute = p.get("compute_gflop_s", flops / 1e9 / max(update_ms - floor_ms, 1e-3) * 1000)
    seconds = p.get("seconds", BenchLearnerConfig.seconds)
    # reports written before value gating was the default measured the default, then ungated
    label = "TD3 backup, acting with pi" if "gated_updates_per_s" in p else "default `LearnerConfig`"
    md = (f"# Learner update speed{'' if on_cpu else ' on ' + name}\n\n"
          f"Command: `{command}` ({where}, best of 2 interleaved {seconds:g} s measurements)\n\n"
          f"| learner | updates/s |\n|---|---:|\n| ours ({label}) | {ours_rate:.1f} |\n"
          f"| reference (CleanRL-style, same math) | {ref_rate:.1f} |\n| ratio | {p['ratio']:.2f}x |\n"
          + (f"| ours, the default with value gating ({p['backup_candidates']} backup candidates scored per "
             f"row) | {p['gated_updates_per_s']:.1f} |\n" if "gated_updates_per_s" in p else "") + "\n"
          f"Shapes: state {p['state_dim']}, action {p.get('action_dim', BenchLearnerConfig.action_dim)}, "
          f"batch {p['batch_size']}, "
          f"{p['critic_heads']} critic heads x {p['critic_hidden']} hidden, actor "
          f"{p['actor_hidden']} hidden, actor step every {p.get('policy_delay', LearnerConfig.policy_delay)} "
          "updates.\n\n")
    if on_cpu:
        md += f"Target >= 150 updates/s: **{'met' if ours_rate >= 150 else 'NOT met'}** ({ours_rate:.0f}).\n\n"
    if p.get("sweep"):
        md += ("## Bigger critics and batches\n\nThe learner of the first row (TD3 backup, acting with pi: no "
               "candidates scored) with other sizes (one measurement each; the actor stays 128 wide):\n\n"
               "| batch | critic heads x hidden | updates/s | ms/update | GFLOP/update | GFLOP/s |\n"
               "|---:|---|---:|---:|---:|---:|\n")
        md += "".join(f"| {r['batch_size']} | {r['critic_heads']} x {r['critic_hidden']} | "
                      f"{r['updates_per_s']:.1f} | {r['update_ms']:.2f} | {r['gflop_per_update']:.3f} | "
                      f"{r['achieved_gflop_s']:.0f} |\n" for r in p["sweep"]) + "\n"
    md += ("## What bounds it\n\n"
           f"* One update takes {update_ms:.2f} ms.\n"
           f"* Matmul work: {flops / 1e9:.3f} GFLOP per update; at this device's dense float32 matmul peak "
           f"({peak:.0f} GFLOP/s, {'1024x1024' if on_cpu else '8192x8192'}) that is "
           f"{1000 * flops / 1e9 / peak:.3f} ms.\n"
           f"* Dispatch floor: the same update with 4-unit networks and batch 8 takes {floor_ms:.2f} ms: "
           "the cost of issuing its ~300 small PyTorch operations (forward, backward, two Adam steps, "
           "Polyak) from Python, whatever the sizes" + ("" if on_cpu else
           ", with the batch's sampling on the CPU, its copy to the GPU and the losses read back each update "
           "(one measurement, against the headline's best of 2)") + ".\n"
           f"* So about {floor_ms:.1f} ms is overhead and {max(update_ms - floor_ms, 0):.1f} ms compute at "
           f"{compute:.0f} GFLOP/s" +
           (", well below peak: 128-wide layers on a 256-row batch are too small for the 2-core BLAS to reach "
            "full speed.\n" if on_cpu else
            ": at the default sizes a GPU update is bound by per-update host work" + (
                ", so the sweep's bigger ensembles and batches cost little more per update until the matmuls "
                "themselves grow (the sweep's GFLOP are the model's count of matmul work, not a measurement)"
                if p.get("sweep") else "") + ".\n"))
    if on_cpu:
        md += ("* What was done: one batched ensemble (first layer of all heads as one matmul, second "
               "as one batched matmul), contiguous activations, target "
               "evaluated on the 2 heads its min uses, the last layer as one batched matmul, one gather per "
               "batch (transition rows stored contiguously), and every network's parameters, gradients and "
               "Adam moments in one flat buffer (`arli/rl/flat_adam.py`): an Adam step, a gradient reset and a "
               "Polyak average are a few whole-buffer operations instead of a C++ loop over tensors with a "
               "`.item()` per step counter (the same arithmetic as `torch.optim.Adam`, tested bit for bit). "
               "In interleaved pairs against the previous learner (foreach `torch.optim.Adam`): 1.2-1.3x. "
               "Tried and not kept: `torch.compile` of the networks (slower here: 84 vs 99 updates/s, "
               "45 s compile), fused CPU Adam (slower), evaluating all target heads instead of indexing the "
               "pair (slower). This VM's speed drifts (steal time up to a third of the machine's CPU time): the "
               "same learner moves between about 113 and 171 updates/s from one minute to the next.\n")
    return md


def main(cfg: BenchLearnerConfig) -> int:
    if cfg.report_only:  # rewrite the Markdown only: the JSON stays byte for byte as measured
        path = os.path.join(cfg.report_dir, f"{report_name(cfg.device)}.json")
        if not os.path.exists(path):
            raise ConfigError(f"report_only: no report at {path} to rewrite; run `arli bench learner"
                              f"{'' if cfg.device == 'cpu' else ' device=' + cfg.device}` to measure one")
        with open(path, encoding="utf-8") as fh:
            payload = json.load(fh)
        payload.setdefault("device", cfg.device)  # reports written before the key: the file says which
        md = report_md(payload)
        with open(path[: -len(".json")] + ".md", "w", encoding="utf-8") as fh:
            fh.write(md)
    else:
        payload = measure(cfg)
        md = report_md(payload)
        if cfg.report_dir:
            write_report(cfg.report_dir, report_name(payload["device"]), payload, md)
    if cfg.json:
        print_last_line_json({k: payload[k] for k in ("device", "updates_per_s", "reference_updates_per_s", "ratio")})
    else:
        print(md)
    return 0
