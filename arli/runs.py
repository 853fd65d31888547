"""A finetuning run from its config: the ``Finetuner`` a config describes (base policy trained
first if missing), and the config a run saved. Used by ``arli finetune``, ``eval``, ``record``,
``learner`` and the benchmarks that judge a run."""

from __future__ import annotations

import os
from dataclasses import replace

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from arli.config import ConfigError, FinetuneConfig, validate
from arli.latency import FixedLatency, latency_from_config, to_delay_steps
from arli.rl.config import LearnerConfig
from sim_envs import make_env, task_name
from sim_envs.experts import EXPERTS


def make_finetuner(cfg: FinetuneConfig, render: bool = False):
    """The run's Finetuner (base policy trained first if missing) -> (ft, task name, delay).
    ``render``: every observation carries ``cfg.env.cameras`` at ``cfg.env.image_size``
    (training itself runs on state only)."""
    from arli.compute import resolve_device  # noqa: PLC0415
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.policies.load import load_base_policy  # noqa: PLC0415
    from arli.pretrain import ensure_base_policy  # noqa: PLC0415 - torch

    # first: a device that is not there fails before minutes of base pretraining
    device = resolve_device(cfg.run.device, "run.device")
    name = task_name(cfg.env.name)
    if getattr(cfg, "robot", "sim") == "franka":  # only the learner service's config drives a robot
        return _real_robot_finetuner(cfg, name)
    if name not in EXPERTS and (cfg.run.anchor_episodes or cfg.run.regime == "hil"):
        raise ConfigError(f"env.name: {name} has no scripted expert for demonstrations or interventions; "
                          "set run.anchor_episodes=0 run.regime=rl")
    # cameras rendered for a recording do not make a missing base an image policy
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, replace(cfg.env, image_size=0) if render else cfg.env)
    env = make_env(name, dt=cfg.env.dt, max_episode_steps=cfg.env.max_episode_steps,
                   **(cfg.env.render_kwargs() if render else {}))
    # the base runs where the learner does (a VLA base's rollouts on the GPU with it)
    base = load_base_policy(cfg.checkpoint, env.unwrapped.instruction, name,
                            cfg.pretrain.policy.chunk_size, state_dim=env.observation_space["state"].shape[0],
                            device=device)
    latency = (FixedLatency(cfg.delay_steps * cfg.env.dt) if cfg.delay_steps is not None
               else latency_from_config(cfg.latency))
    delay = to_delay_steps(latency.max_latency(), cfg.env.dt)
    model = getattr(base, "model", None)  # built-in policy: reuse its state normalisation
    mean = model.state_mean.cpu().numpy() if model is not None else None
    std = model.state_std.cpu().numpy() if model is not None else None
    return Finetuner(cfg.run, env, base, EXPERTS.get(name), latency, mean, std, cfg.chunking), name, delay


# settings whose default changed when they were introduced: a run saved before then has no
# such key and ran with this value, not today's default
BEFORE_THEY_EXISTED = {"run.learner.awr_advantage": "td", "run.learner.anchor_decay_updates": 0,
                       "run.start_guard": False, "run.demonstrations": "expert", "run.end_guard": False,
                       "run.guard_episodes": 0, "run.learner.backup_candidates": 0}


def load_run_config(run_dir: str) -> FinetuneConfig:
    """The finetune config a run saved (``<run>/config.yaml``), validated as at its start."""
    path = os.path.join(run_dir, "config.yaml")
    if not run_dir or not os.path.exists(path):
        raise ConfigError(f"run: no finetune run at {run_dir} (missing config.yaml); pass an `arli finetune` "
                          "output directory")
    try:
        saved = OmegaConf.load(path)
        for key, value in BEFORE_THEY_EXISTED.items():  # what a run saved before a key existed ran with
            if OmegaConf.select(saved, key, default=None) is None:
                OmegaConf.update(saved, key, value, force_add=True)
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(FinetuneConfig), saved))
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"run: {path} does not fit this ARLI's finetune config ({first}); evaluate it with "
                          "the version that wrote it, or rerun it") from None
    learner = cfg.run.learner
    if learner.actor_update != "awr":
        # awr-only settings do nothing under dpg / select; a run saved before their defaults
        # changed carries the old ones, which start-up validation (for what a user types) refuses
        cfg.run.learner = replace(learner, awr_advantage=LearnerConfig.awr_advantage,
                                  awr_weights=LearnerConfig.awr_weights)
    validate(cfg)
    return cfg


def _real_robot_finetuner(cfg, name: str):
    """The learner of a real arm: the residual state from proprioception (``ProprioOnly``),
    the chunk size of the served policy, no base policy, demos or sim evaluation here."""
    from arli.finetune import Finetuner  # noqa: PLC0415
    from arli.policies.base import BasePolicy  # noqa: PLC0415
    from sim_envs.base import ProprioOnly  # noqa: PLC0415

    class ServedElsewhere(BasePolicy):
        def __init__(self, chunk_size: int, action_dim: int):
            self.chunk_size, self.action_dim = chunk_size, action_dim

        def infer(self, request):
            raise RuntimeError("the learner of a real robot has no base policy: chunks come from `arli serve` "
                               "to the robot; there is no evaluation in sim")

    env = ProprioOnly(make_env(name, dt=cfg.env.dt, max_episode_steps=cfg.env.max_episode_steps))
    base = ServedElsewhere(cfg.chunk_size, env.action_space.shape[0])
    # the scheduler's planned delay, from the same latency settings as a sim run
    latency = (FixedLatency(cfg.delay_steps * cfg.env.dt) if cfg.delay_steps is not None
               else latency_from_config(cfg.latency))
    delay = to_delay_steps(latency.max_latency(), cfg.env.dt)
    # no sim evaluation of a real arm's start: the start guard cannot run here
    return Finetuner(replace(cfg.run, start_guard=False), env, base, None, latency, chunking=cfg.chunking), name, delay


def split_of(spec, seed_base: int, episodes: int, train: list[range]) -> str:
    """Which seeds these are to the run: 'test' (within its test seeds), 'test+other' (some of
    its test seeds and others), 'tune' (any of its curve's, where its choices were made),
    'train' (any of its demonstration and training episodes), else 'other' (seeds the run
    never saw)."""
    asked = range(seed_base, seed_base + episodes)

    def meets(r: range) -> bool:
        return asked.start < r.stop and r.start < asked.stop

    test = spec.test_range()
    if test.start <= asked.start and asked.stop <= test.stop:
        return "test"
    if meets(test):  # some test seeds among others: never a range to choose a setting on
        return "test+other"
    if meets(spec.tune_range()):
        return "tune"
    return "train" if any(meets(r) for r in train) else "other"
