"""``arli bench sim``: control steps/s of our default task vs robosuite Lift, same run.

Both envs run at the same control rate, state observations, no rendering, one process,
uniform random actions (the same policy for both), resets included as they occur.
"""

from __future__ import annotations

import time

import numpy as np
from tqdm import tqdm

from arli.bench.common import machine_info, print_last_line_json, write_report
from arli.config import BenchSimConfig
from sim_envs import make_env


def measure(name: str, steps: int, dt: float, seed: int) -> float:
    """Control steps per second of ``name`` over ``steps`` random-action steps."""
    env = make_env(name, dt=dt)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    env.step(rng.uniform(-1, 1, 5))  # warm-up (lazy allocations)
    episode = 0
    start = time.perf_counter()
    for _ in tqdm(range(steps), desc=f"{name}", unit="step", leave=False, mininterval=0.5):
        _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, 5))
        if terminated or truncated:
            episode += 1
            env.reset(seed=seed + episode)
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def main(cfg: BenchSimConfig) -> int:
    ours = measure(cfg.env.name, cfg.steps, cfg.env.dt, cfg.seed)
    peer = measure("robosuite_lift", cfg.robosuite_steps, cfg.env.dt, cfg.seed)
    ratio = ours / peer
    payload = {"ours_steps_per_s": round(ours, 1), "robosuite_steps_per_s": round(peer, 1),
               "ratio": round(ratio, 2)}
    md = (
        "# Simulation speed\n\n"
        f"Command: `arli bench sim env={cfg.env.name} steps={cfg.steps} "
        f"robosuite_steps={cfg.robosuite_steps}`\n\n"
        f"Control steps per second at dt = {cfg.env.dt} s ({1 / cfg.env.dt:.0f} Hz), state "
        "observations, no rendering, one process, uniform random actions, resets included.\n\n"
        "| env | steps/s |\n|---|---:|\n"
        f"| ours: `{cfg.env.name}` (MuJoCo C loop, IK per control step) | {ours:.0f} |\n"
        f"| robosuite `Lift` (Panda, OSC_POSE) | {peer:.0f} |\n"
        f"| **ratio** | **{ratio:.1f}x** |\n\n"
        f"Machine: {machine_info()}\n"
    )
    write_report(cfg.report_dir, "sim", {**payload, "env": cfg.env.name, "dt": cfg.env.dt,
                                         "machine": machine_info()}, md)
    print(md)
    if cfg.json:
        print_last_line_json(payload)
    return 0
