"""``arli record``: intervention episodes into a crash-safe LeRobotDataset v3.

The base policy runs asynchronously under the configured latency, the residual (a finetune
checkpoint, or none) corrects it, and the intervener — the scripted operator in sim, or a
person's SpaceMouse / gamepad / keyboard — takes over when needed. Every step is written
with the base, residual and executed actions, the intervention flag and the scheduler's
timing (``arli.runtime.recording``). On a real Franka the same recording runs inside the
robot runtime: ``arli actor robot=franka device=spacemouse record_root=...``.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from arli.config import ConfigError, RecordConfig


def _intervention(cfg: RecordConfig, expert):
    from arli.runtime.intervention import Intervention  # noqa: PLC0415
    from robot_drivers.teleop import open_device  # noqa: PLC0415

    if cfg.device == "none":
        return None
    if cfg.device == "scripted":
        if expert is None:
            raise ConfigError(f"device: no scripted operator for {cfg.env.name}; use a person's device "
                              "(spacemouse, gamepad, keyboard) or device=none")
        return Intervention(expert, cfg.run.intervention)
    device = open_device(cfg.device)
    if not device.connected:
        print(f"arli record: {device.status}; recording without interventions", flush=True)
    spec = type(cfg.run.intervention)(**{**vars(cfg.run.intervention), "prob": 1.0, "mode": "corrective"})
    return Intervention(None, spec, device)


def main(cfg: RecordConfig) -> int:
    from arli.commands.eval import deployed_actor  # noqa: PLC0415
    from arli.runs import load_run_config, make_finetuner  # noqa: PLC0415
    from arli.record import EpisodeRecorder  # noqa: PLC0415
    from arli.runtime.acting import ResidualController  # noqa: PLC0415
    from arli.rl.config import TRAIN_SEED_BASE  # noqa: PLC0415
    from arli.rollout import run_episode  # noqa: PLC0415
    from arli.runtime.recording import RecordingController, intervention_features  # noqa: PLC0415
    from sim_envs.base import ACTION_NAMES, PROPRIO_DIM, PROPRIO_NAMES  # noqa: PLC0415

    if os.path.exists(cfg.root) and os.listdir(cfg.root) and not cfg.append:
        raise ConfigError(f"root: {cfg.root} already holds a dataset; pass append=true to append "
                          "episodes to it, or choose another root")
    run_dir = os.path.dirname(os.path.normpath(cfg.residual)) if cfg.residual else ""
    if run_dir and os.path.exists(os.path.join(run_dir, "config.yaml")):
        # the residual acts as its run trained it (its learner: gated or not, its variant), not as
        # this command's defaults would
        saved = load_run_config(run_dir).run
        cfg = replace(cfg, run=replace(cfg.run, learner=saved.learner, variant=saved.variant))
        print(f"arli record: the residual's variant and learner from {run_dir}/config.yaml")
    ft, name, delay = make_finetuner(cfg, render=True)  # every camera of env.cameras, if env.image_size > 0
    if cfg.residual:
        try:
            ft.load(cfg.residual)
        except (FileNotFoundError, ValueError, RuntimeError, KeyError) as exc:
            raise ConfigError(f"residual: cannot load {cfg.residual}: {exc} (pass the same run.variant / run.learner "
                              "overrides as the finetune run that wrote it)") from None
        if run_dir and deployed_actor(run_dir) == "actor_start":  # its end guard deployed the start
            ft.learner.revert_to_start()
            print("arli record: the run's end guard deployed its start: recording that residual")
    env = ft.env.unwrapped
    size = cfg.env.image_size
    cameras = {name: (size, size) for name in cfg.env.cameras} if size else {}
    features = intervention_features(PROPRIO_NAMES, env.state_names[PROPRIO_DIM:], ACTION_NAMES,
                                     ft.builder.dim, cameras)
    intervention = _intervention(cfg, ft.expert)
    actor = ResidualController(ft.learner, ft.builder, train=False, intervention=intervention,
                               rng=np.random.default_rng(cfg.seed))
    # A person's SIGTERM (or the launcher's) ends the run like Ctrl-C: the episode in
    # progress is dropped, every saved one stays.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with EpisodeRecorder(cfg.root, int(round(1 / cfg.env.dt)), features, resume=cfg.append,
                         use_videos=bool(cameras)) as recorder:
        rec = RecordingController(actor, recorder, env.instruction, PROPRIO_DIM, save_failed=cfg.save_failed)
        first = recorder.total_episodes
        bar = tqdm(range(cfg.episodes), desc=f"record {name} d={delay}", unit="ep")
        for i in bar:
            # inside the training episodes' block (never a tune or test seed); a recording of
            # record seed k shares seeds with training seed 50 + k's episodes only
            seed = TRAIN_SEED_BASE + 50_000 + 1000 * cfg.seed + first + i
            run_episode(ft.env, ft.base, ft.scheduler, ft.latency, ft.rng, seed, rec)
            s = rec.summaries[-1]
            bar.set_postfix(saved=recorder.episodes, success=s.success, intervened=s.intervened_steps)
    summ = rec.summaries
    frames = sum(s.frames for s in summ if s.saved)
    out = {"root": cfg.root, "episodes_saved": recorder.episodes, "total_episodes": recorder.total_episodes,
           "frames": frames, "success": float(np.mean([s.success for s in summ])),
           "intervention_share": (sum(s.intervened_steps for s in summ if s.saved) / frames) if frames else 0.0,
           "delay_steps": delay, "device": cfg.device}
    print(json.dumps(out, indent=1))
    return 0
