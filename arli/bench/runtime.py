"""``arli bench runtime``: control-loop timing error and residual step latency of the robot
runtime at 20 Hz on a real clock, with chunk requests in flight to a real inference server
(a separate process: the stub policy padded to ``min_latency_s``) and the learner
unreachable (transitions spool, as on a robot whose workstation is away).

loop error = when a control step actually started - when it was scheduled (``MonotonicClock``);
residual step = ARLI state construction + residual forward + transition bookkeeping, per step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
from tqdm import tqdm

from arli.bench.common import figure, machine_info, publish
from arli.bench.transport import _free_port
from arli.config import BenchRuntimeConfig


def _server(port: int, cfg: BenchRuntimeConfig) -> subprocess.Popen:
    code = ("import sys; from arli.bench.stub_servers import StubPolicy; "
            "from arli.runtime.server import InferenceServer; "
            "p = StubPolicy(float(sys.argv[2])); p.chunk_size, p.action_dim = 16, 5; "
            "s = InferenceServer(p, f'tcp://127.0.0.1:{sys.argv[1]}', min_latency_s=float(sys.argv[3])); "
            "print('ready', flush=True); s.serve()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(port), str(cfg.compute_ms), str(cfg.min_latency_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    if "ready" not in proc.stdout.readline():
        proc.kill()
        raise RuntimeError("the stub inference server did not start")
    return proc


def histogram(errors_ms: np.ndarray, residual_ms: np.ndarray, path: str) -> None:
    with figure(path, (10, 3.5), ncols=2) as axes:
        axes[0].hist(errors_ms, bins=60, color="tab:blue")
        axes[0].set_xlabel("control-loop timing error (ms)")
        axes[1].hist(residual_ms, bins=60, color="tab:orange")
        axes[1].set_xlabel("residual step latency (ms)")
        for ax in axes:
            ax.set_ylabel("steps")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)


def main(cfg: BenchRuntimeConfig) -> int:
    from arli.augment import StateBuilder  # noqa: PLC0415
    from arli.policies.residual import EnsembleCritic, ResidualActor  # noqa: PLC0415
    from arli.policies.residual_np import ResidualActing  # noqa: PLC0415
    from arli.rl.config import LearnerConfig  # noqa: PLC0415
    from arli.chunking import make_scheduler  # noqa: PLC0415
    from arli.runtime.actor import RemoteResidualController  # noqa: PLC0415
    from arli.runtime.clock import MonotonicClock  # noqa: PLC0415
    from arli.runtime.link import LearnerLink  # noqa: PLC0415
    from arli.runtime.loop import run_episode  # noqa: PLC0415
    from arli.transport.inference_client import RemoteInference  # noqa: PLC0415
    from robot_drivers.sim import SimDriver  # noqa: PLC0415
    from sim_envs import make_env, task_name  # noqa: PLC0415

    import torch  # noqa: PLC0415

    port = _free_port()
    server = _server(port, cfg)
    link = LearnerLink("bench", f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}").start()
    try:
        env = make_env(task_name(cfg.env.name), dt=cfg.env.dt, max_episode_steps=cfg.steps)
        driver = SimDriver(env, now=time.perf_counter)
        inference = RemoteInference(f"tcp://127.0.0.1:{port}", driver.dt,
                                    initial_delay_steps=cfg.chunking.planned_delay_steps)
        inference.connect(timeout_s=30)
        lcfg = LearnerConfig()
        builder = StateBuilder("arli", driver.state_dim, driver.action_dim, inference.chunk_size, cfg.steps)
        torch.manual_seed(0)
        actor = ResidualActor(builder.dim, driver.action_dim, lcfg.hidden)
        torch.nn.init.normal_(actor.net[-1].weight, std=0.1)  # non-zero output: a trained residual's cost
        arrays = {k: v.detach().numpy() for k, v in actor.state_dict().items()}
        # the default learner gates by value: the robot scores its candidates with the critic every step
        critic = EnsembleCritic(builder.dim, driver.action_dim, lcfg.critic_heads, lcfg.critic_hidden)
        policy = ResidualActing(lcfg, arrays, driver.action_dim,
                                critic={k: v.detach().numpy() for k, v in critic.state_dict().items()})
        policy.updates = max(1, lcfg.critic_warmup_updates)  # past the warm-up: gating on, as in a trained run
        ctl = RemoteResidualController(policy, builder, link)
        scheduler = make_scheduler(cfg.chunking, inference.chunk_size, driver.action_dim,
                                   cfg.chunking.planned_delay_steps, cfg.chunking.min_delay_steps or 0)
        clock = MonotonicClock(driver.dt, spin_s=cfg.spin_s)
        requests, seed = 0, 0
        with tqdm(total=cfg.steps, desc=f"runtime @ {1 / driver.dt:.0f} Hz", unit="step", mininterval=1.0) as bar:
            while len(clock.errors) < cfg.steps:  # episodes until the step budget is spent
                result = run_episode(driver, inference, scheduler, clock, seed, ctl)
                requests, seed = requests + result.requests, seed + 1
                bar.update(result.steps)
    finally:
        link.close()
        server.kill()
        server.wait()
    errors = np.asarray(clock.errors) * 1000
    residual = np.asarray(ctl.residual_s) * 1000
    out = {"loop_error_p50_ms": float(np.percentile(errors, 50)),
           "loop_error_p99_ms": float(np.percentile(errors, 99)),
           "residual_p99_ms": float(np.percentile(residual, 99))}
    targets = {"loop_error_p99_ms <= 1": out["loop_error_p99_ms"] <= 1.0,
               "residual_p99_ms <= 0.3": out["residual_p99_ms"] <= 0.3}
    in_flight = float(np.mean([r["latency_s"] for r in inference.records])) if inference.records else 0.0
    payload = {**out, "targets_met": targets, "spin_s": cfg.spin_s, "steps": len(errors), "rate_hz": 1 / cfg.env.dt,
               "requests": requests, "mean_request_latency_s": in_flight,
               "residual_p50_ms": float(np.percentile(residual, 50)), "overruns": clock.overruns,
               "max_loop_error_ms": float(errors.max()), "machine": machine_info()}
    os.makedirs(cfg.report_dir, exist_ok=True)
    histogram(errors, residual, os.path.join(cfg.report_dir, "runtime.png"))
    md = ["# Robot runtime: control-loop timing and residual latency", "",
          f"`arli bench runtime` — {len(errors)} control steps at {1 / cfg.env.dt:.0f} Hz on a monotonic clock "
          f"(task {cfg.env.name}, sim driver), {requests} chunk requests to a real inference server process "
          f"(stub policy, {cfg.compute_ms} ms compute, replies padded to {cfg.min_latency_s * 1000:.0f} ms: a request "
          "is in flight during half of all steps), the ARLI residual (numpy forward, 128 hidden) every step, "
          f"transitions spooled for an unreachable learner; the loop sleeps until {cfg.spin_s * 1000:.0f} ms before "
          "each tick, then spins, repeating the residual's last state build and forward pass (`warm`) until "
          f"{clock.warm_margin_s * 1000:.2f} ms before the tick. The residual step is timed from the ARLI state "
          "to the executed action.", "",
          "| measure | p50 (ms) | p99 (ms) | target |", "|---|---:|---:|---|",
          f"| control-loop timing error | {out['loop_error_p50_ms']:.3f} | {out['loop_error_p99_ms']:.3f} | "
          f"p99 <= 1 ms: {'met' if targets['loop_error_p99_ms <= 1'] else 'NOT met'} |",
          f"| residual step (ARLI state + forward; bookkeeping runs after the action is sent) | {payload['residual_p50_ms']:.3f} | "
          f"{out['residual_p99_ms']:.3f} | p99 <= 0.3 ms: {'met' if targets['residual_p99_ms <= 0.3'] else 'NOT met'} |",
          "", f"Overruns (a step started more than one period late): {clock.overruns}; worst timing error "
          f"{payload['max_loop_error_ms']:.2f} ms.", "", "![histograms](runtime.png)", "",
          f"Machine: {machine_info()}", ""]
    return publish(cfg.report_dir, "runtime", payload, md, slice(4, 8), out if cfg.json else None)
