"""The commands' configs: each one composes the groups its command uses, registered with Hydra.

The groups are declared next to the code they configure and validate themselves with the
one idiom of ``arli.errors.require`` (the field, what is allowed, what it got):

* ``env`` (``arli.envs.EnvConfig``), ``latency`` (``arli.latency.LatencyConfig``),
  ``chunking`` (``arli.chunking.ChunkingConfig``): every command that builds a scheduler;
* ``run`` (``arli.rl.config.RunSpec``, with ``run.learner`` and ``run.intervention``): what
  a finetuning run is, the same keys in ``finetune``, ``record``, ``learner`` and the sweeps;
* ``policy`` (``arli.policies.flow_config``), ``transport`` (``arli.transport.zmq_io``),
  ``openpi`` (``arli.transport.openpi_mapping``), ``franka`` (``robot_drivers.franka.config``).

Each command composes ``configs/<command>.yaml`` over its schema, applies ``key=value``
overrides and calls ``validate``: a wrong key or value fails at start-up naming the field.
Schemas share one field group by inheritance only: ``SimBase`` (task, chunking, base
checkpoint and its pretraining), for every command that runs the base on a sim task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from arli.chunking import EXECUTIONS, ChunkingConfig
from arli.compute import check_device
from arli.envs import EnvConfig
from arli.errors import ConfigError, require
from arli.latency import LatencyConfig
from arli.policies.flow_config import FlowHyperparams
from arli.rl.config import DEMONSTRATIONS, NOISE_PROCESSES, REPORTED_TEST_EPISODES, RunSpec
from arli.transport.openpi_mapping import OpenPIConfig
from arli.transport.zmq_io import TransportConfig
from robot_drivers.franka.config import FrankaConfig

__all__ = ["ConfigError", "SCHEMAS", "register_configs"]

BASE_CHECKPOINT = "checkpoints/base_${env.name}"  # the base policy; only this default is trained on demand
MAIN_JOB_DELAY_STEPS = 8  # `make demo`: where learning from reward shows on this budget
# the main job's online budget, and the headline sweep's per cell: the value-gated default's three
# d = 8 tune runs (training seeds 0-2, reports/tune_d8_50k_86ed35/expo_s*/) each end +0.17 to +0.25
# above their start on their end guard's 200 tune episodes at 50k (the former default needed 100k for its lowest
# seed: reports/confirm_d8_200k*/); 50k keeps `make demo` near half an hour on a 2-core machine
MAIN_JOB_ENV_STEPS = 50_000
ACTOR_PLANNED_DELAY_STEPS = 4  # a robot's first plan, before it has measured replies


def _positive(cfg, *names: str) -> None:
    for name in names:
        require(getattr(cfg, name) >= 1, name, ">= 1", getattr(cfg, name))


def _strategies(values: list[str]) -> None:
    require(all(s in EXECUTIONS for s in values), "strategies", f"a list from {EXECUTIONS}", values)


def _delays(values: list[int], name: str = "delay_steps") -> None:
    require(all(d >= 0 for d in values), name, "a list of integers >= 0", values)


# -- demonstrations and the base policy -----------------------------------------------------
@dataclass
class CollectDemosConfig:
    """``arli collect-demos``: scripted-expert episodes into a LeRobotDataset v3."""

    env: EnvConfig = field(default_factory=EnvConfig)
    episodes: int = 200
    root: str = "data/demos/${env.name}"
    seed: int = 0

    def validate(self) -> None:
        self.env.validate()
        _positive(self, "episodes")


@dataclass
class PretrainConfig:
    """``arli pretrain``: behaviour cloning of the flow policy from the demo dataset."""

    env: EnvConfig = field(default_factory=EnvConfig)
    policy: FlowHyperparams = field(default_factory=FlowHyperparams)
    dataset_root: str = "data/demos/${env.name}"
    demos: int = 200  # collected first if the dataset is missing
    output_dir: str = BASE_CHECKPOINT
    steps: int = 3000
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 1e-4
    eval_every: int = 1000
    eval_episodes: int = 20
    seed: int = 0
    # torch threads while training: the order of float sums, so the weights, depend on the
    # count; a fixed one makes the same seed and demos give the same base on one machine (another
    # machine of the same kind: not checked yet)
    threads: int = 2

    def validate(self) -> None:
        self.env.validate()
        self.policy.validate()
        _positive(self, "steps", "batch_size", "eval_every", "demos", "threads")
        require(self.lr > 0, "lr", "> 0", self.lr)


@dataclass
class RolloutConfig:
    """``arli rollout``: the scripted expert's open-loop chunks under simulated latency."""

    env: EnvConfig = field(default_factory=EnvConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    chunk_size: int = 16  # H of the expert's chunks
    episodes: int = 30
    seed: int = 0
    # a sweep over fixed delays in steps; empty = use ``latency`` as configured
    delay_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 8])
    strategies: list[str] = field(default_factory=lambda: list(EXECUTIONS))
    output_dir: str = "outputs/rollout"

    def validate(self) -> None:
        self.env.validate()
        self.latency.validate()
        self.chunking.validate()
        require(self.chunk_size >= 2, "chunk_size", ">= 2", self.chunk_size)
        require(self.chunking.execute_horizon <= self.chunk_size, "chunking.execute_horizon",
                f"<= chunk_size ({self.chunk_size})", self.chunking.execute_horizon)
        _positive(self, "episodes")
        _delays(self.delay_steps)
        _strategies(self.strategies)


@dataclass
class SimBase:
    """What every command that runs the base policy on a sim task composes: the task, how
    chunks execute, and the base (trained first when the default checkpoint is missing)."""

    env: EnvConfig = field(default_factory=EnvConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    checkpoint: str = BASE_CHECKPOINT  # built-in flow dir, LeRobot dir or "expert"; trained if missing
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)  # how the base is trained if missing

    def validate(self) -> None:
        self.env.validate()
        self.chunking.validate()
        self.pretrain.validate()


@dataclass
class BenchBaseConfig(SimBase):
    """``arli bench base``: the pretrained policy, sync vs async naive/blend/rtc per delay."""

    episodes: int = 100
    delay_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 8])
    strategies: list[str] = field(default_factory=lambda: list(EXECUTIONS))
    seed: int = 10_000  # evaluation seeds are disjoint from the demo seeds
    trace_episodes: int = 20  # traced async-naive episodes per delay (why it fails); 0 = none
    report_dir: str = "reports"

    def validate(self) -> None:
        super().validate()
        require(self.chunking.execute_horizon <= self.pretrain.policy.chunk_size, "chunking.execute_horizon",
                f"<= the policy's chunk size ({self.pretrain.policy.chunk_size})", self.chunking.execute_horizon)
        _positive(self, "episodes")
        _delays(self.delay_steps)
        _strategies(self.strategies)


# -- finetuning: one run, its recording, its learner service --------------------------------
@dataclass
class FinetuneConfig(SimBase):
    """``arli finetune``: ARLI residual RL on top of the base policy under simulated latency."""

    latency: LatencyConfig = field(default_factory=LatencyConfig)
    # the main job (`make demo`): d = 8 and 50k online steps, where learning from reward shows
    # on this budget (at d = 4 the anchor-pretrained start is already 0.88-0.94 and the online
    # phase holds it, reports/learner_tuning.md)
    run: RunSpec = field(default_factory=lambda: RunSpec(env_steps=MAIN_JOB_ENV_STEPS))
    delay_steps: int | None = MAIN_JOB_DELAY_STEPS  # fixed delay in control steps; null = use ``latency``
    output_dir: str = ""  # "" = outputs/finetune_<env>_<variant>_d<delay>_<time>
    resume: str = ""  # an output_dir/checkpoint to continue from
    videos: int = 2  # test seeds rendered at the end (base alone vs base + residual, every camera); 0 = none
    video_size: int = 64  # pixels per camera in those videos

    def validate(self) -> None:
        validate_sim_run(self)
        require(self.videos >= 0, "videos", ">= 0", self.videos)
        require(self.video_size >= 32, "video_size", ">= 32", self.video_size)


def validate_sim_run(cfg) -> None:
    """What every config that builds a ``Finetuner`` in sim shares."""
    SimBase.validate(cfg)
    cfg.latency.validate()
    require(cfg.chunking.strategy != "sync", "chunking.strategy",
            "naive, blend or rtc (the residual acts inside asynchronous execution)", cfg.chunking.strategy)
    cfg.run.validate()
    require(cfg.delay_steps is None or cfg.delay_steps >= 0, "delay_steps", "null or >= 0", cfg.delay_steps)


@dataclass
class RecordConfig(SimBase):
    """``arli record``: episodes of base + residual with an intervener, into a crash-safe
    LeRobotDataset. In sim (``device=scripted``) the scripted operator intervenes; with a
    person's device they do. The residual is a finetune run's checkpoint (or zero)."""

    latency: LatencyConfig = field(default_factory=LatencyConfig)
    run: RunSpec = field(default_factory=RunSpec)  # the residual's variant and learner (as its run had)
    delay_steps: int | None = MAIN_JOB_DELAY_STEPS
    episodes: int = 10
    root: str = "data/interventions/${env.name}"
    append: bool = False  # append to an existing dataset at root
    residual: str = ""  # a finetune checkpoint dir (outputs/<run>/checkpoint); "" = base only
    device: str = "scripted"  # scripted (sim) | none | spacemouse | gamepad | keyboard
    save_failed: bool = True  # keep episodes that failed (interventions in them still teach)
    seed: int = 0

    def validate(self) -> None:
        from robot_drivers.teleop import DEVICES  # noqa: PLC0415

        validate_sim_run(self)
        _positive(self, "episodes")
        require(self.device in ("scripted", *DEVICES), "device", f"one of {('scripted', *DEVICES)}", self.device)


@dataclass
class EvalConfig:
    """``arli eval``: a finetune run's residual and the base alone on any seed range."""

    run: str = ""  # the `arli finetune` output directory (config.yaml + checkpoint/)
    seed_base: int | None = None  # first episode seed; null = the run's test seeds
    episodes: int | None = None  # null = the run's test episodes
    output: str = ""  # "" = <run>/eval_<seed_base>_<episodes>.json (gating=false: ..._ungated.json)
    videos: int = 0  # also render this many of the run's test seeds -> <run>/videos/
    # false: the actor's own r(s) acts, without value gating (what the actor has learned apart
    # from the critic's per-step choice); the default evaluates the residual as it was deployed
    gating: bool = True

    def validate(self) -> None:
        require(self.seed_base is None or self.seed_base >= 0, "seed_base", "null or >= 0", self.seed_base)
        require(self.episodes is None or self.episodes >= 1, "episodes", "null or >= 1", self.episodes)
        require(self.videos >= 0, "videos", ">= 0", self.videos)


ROBOTS = ("sim", "franka")
INFERENCES = ("arli", "openpi")  # where an actor's base chunks come from


@dataclass
class LearnerServiceConfig(SimBase):
    """``arli learner``: the finetuning learner as a service for a fleet of actors."""

    latency: LatencyConfig = field(default_factory=LatencyConfig)
    # the start guard on the curve's 30 tune episodes (guard_episodes=0): the actors wait for the
    # first weights behind it (weights_timeout_s)
    run: RunSpec = field(default_factory=lambda: RunSpec(guard_episodes=0))
    # the delay the actors plan for (their chunking.planned_delay_steps), not the main job's
    delay_steps: int | None = ACTOR_PLANNED_DELAY_STEPS
    output_dir: str = ""  # "" = outputs/learner_<env>
    transport: TransportConfig = field(default_factory=TransportConfig)
    publish_every: int = 50  # updates between weight broadcasts
    checkpoint_every_s: float = 10.0
    # franka: the actors drive a real arm, whose state is proprioception only (the first 9
    # entries of env.name's state); no base policy here (the server's chunk size is
    # chunk_size), no scripted demos, no evaluation in sim
    robot: str = "sim"
    chunk_size: int = 16  # robot=franka: the served policy's chunk size H

    def validate(self) -> None:
        validate_sim_run(self)
        self.transport.validate()
        _positive(self, "publish_every")
        require(self.robot in ROBOTS, "robot", f"one of {ROBOTS}", self.robot)
        if self.robot == "franka":
            require(self.run.anchor_episodes == 0, "run.anchor_episodes",
                    "0 with robot=franka (no scripted expert on a real arm; pass recorded run.datasets=[...])",
                    self.run.anchor_episodes)
            require(self.run.regime == "rl", "run.regime",
                    "rl with robot=franka (the person intervenes at the actor: device=...)", self.run.regime)
            require(self.chunk_size >= 2, "chunk_size", ">= 2 (the served policy's H)", self.chunk_size)


# -- the pipeline as processes: serve / actor / launch / keys --------------------------------
@dataclass
class ServeConfig:
    """``arli serve``: a base policy behind ZeroMQ for any number of robots."""

    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = BASE_CHECKPOINT  # built-in flow, LeRobot dir, or "expert"
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    min_latency_s: float = 0.0  # pad replies (emulate a slower VLA); 0 = as fast as it runs
    max_seconds: float = 0.0  # 0 = serve until interrupted
    max_message_mb: float = 64.0  # larger requests are refused with a too_large error
    device: str = "auto"  # where the policy runs: auto (CUDA when torch sees one) | cpu | cuda | cuda:<i>
    max_batch: int = 8  # requests waiting together answered by one forward pass; 1 = one at a time
    batch_wait_ms: float = 2.0  # batching: how long to wait for the other active robots' requests

    def validate(self) -> None:
        self.env.validate()
        self.transport.validate()
        require(self.min_latency_s >= 0, "min_latency_s", ">= 0", self.min_latency_s)
        require(self.max_batch >= 1, "max_batch", ">= 1", self.max_batch)
        require(0 <= self.batch_wait_ms <= 100, "batch_wait_ms", "in [0, 100]", self.batch_wait_ms)
        check_device(self.device)


@dataclass
class ActorConfig:
    """``arli actor``: the robot runtime against a server and a learner, on the sim task
    (real clock) or a Franka, with a person's device and recording."""

    env: EnvConfig = field(default_factory=EnvConfig)
    # a robot cannot know its latency in advance: it plans for planned_delay_steps until it
    # has measured replies, then for their 0.9 quantile
    chunking: ChunkingConfig = field(default_factory=lambda: ChunkingConfig(
        planned_delay_steps=ACTOR_PLANNED_DELAY_STEPS, min_delay_steps=0))
    transport: TransportConfig = field(default_factory=TransportConfig)
    inference: str = "arli"  # arli: `arli serve` at transport.server | openpi: an openpi policy server at openpi.uri
    openpi: OpenPIConfig = field(default_factory=OpenPIConfig)  # inference=openpi: its address and key mapping
    robot: str = "sim"  # sim: the env.name task on a real clock | franka: franky at franka.hostname
    franka: FrankaConfig = field(default_factory=FrankaConfig)
    cameras: dict[str, str] = field(default_factory=dict)  # name -> OpenCV source (index, URL or file)
    camera_size: int = 96  # frames resized to camera_size x camera_size
    device: str = "none"  # none | spacemouse | gamepad | keyboard: a person takes over with it
    record_root: str = ""  # record every episode into this LeRobotDataset (appends if it exists)
    task: str = ""  # the instruction sent with every request and stored with frames ("" = the env's)
    actor_id: str = "actor0"
    max_episodes: int = 0  # 0 = until the learner is done
    seed: int = 0
    weights_timeout_s: float = 300.0
    spin_s: float = 0.002  # spin before each tick; = env.dt on a dedicated core keeps the residual hot
    output_dir: str = "outputs/actor_${actor_id}"  # latency trace + stats

    def validate(self) -> None:
        from robot_drivers.teleop import DEVICES  # noqa: PLC0415

        self.env.validate()
        self.chunking.validate()
        require(self.chunking.strategy != "sync", "chunking.strategy", "naive, blend or rtc on a robot",
                self.chunking.strategy)
        require(self.chunking.planned_delay_steps is not None, "chunking.planned_delay_steps",
                "the delay (steps) to plan for until replies are measured", None)
        self.transport.validate()
        require(self.inference in INFERENCES, "inference", f"one of {INFERENCES}", self.inference)
        if self.inference == "openpi":
            self.openpi.validate()
        require(self.robot in ROBOTS, "robot", f"one of {ROBOTS}", self.robot)
        require(self.device in DEVICES, "device", f"one of {DEVICES}", self.device)
        require(self.camera_size >= 8, "camera_size", ">= 8", self.camera_size)
        try:
            self.franka.validate()
        except ValueError as exc:  # robot_drivers raise plain ValueErrors (it imports no arli errors)
            raise ConfigError(str(exc)) from None


@dataclass
class LaunchConfig:
    """``arli launch sim``: server + learner + N sim actors on this machine."""

    actors: int = 2
    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = BASE_CHECKPOINT  # base policy served (trained first if missing)
    env_steps: int = 5000
    min_latency_s: float = 0.16  # server reply padding: d = 4 at dt = 0.05 (margin for compute)
    base_port: int = 5555
    output_dir: str = "outputs/launch"
    extra_server: list[str] = field(default_factory=list)  # more overrides for the server (device=, max_batch=)
    extra_learner: list[str] = field(default_factory=list)  # more overrides for the learner
    extra_actor: list[str] = field(default_factory=list)  # more overrides for every actor
    record_root: str = ""  # record each actor's episodes into <record_root>/<actor_id>
    restarts: int = 3  # times the server or the learner is restarted when it dies

    def validate(self) -> None:
        self.env.validate()
        _positive(self, "actors")
        require(self.restarts >= 0, "restarts", ">= 0", self.restarts)
        require(self.env_steps >= 100, "env_steps", ">= 100", self.env_steps)


@dataclass
class KeysConfig:
    """``arli keys``: CurveZMQ key pairs for servers and clients."""

    dir: str = "keys"
    clients: int = 1

    def validate(self) -> None:
        _positive(self, "clients")


# -- benchmarks ---------------------------------------------------------------------------
# every variant a sweep can run; DEFAULT_SWEEP_VARIANTS: the headline sweep's. Not in the
# default: ``standard_d0`` (the same runs as ``standard`` at d = 0, used only when the sweep
# has no d = 0), ``stepwise_d0`` (no verdict needs it) and ``anchor_only`` (every RL cell now
# carries its anchored start)
SWEEP_VARIANTS = ("base_sync", "base_naive", "base_rtc", "arli", "arli_no_committed", "arli_no_midobs",
                  "standard", "standard_d0", "stepwise_d0", "bc_control", "uniform_control", "anchor_only",
                  "ceiling")
DEFAULT_SWEEP_VARIANTS = ("base_sync", "base_naive", "base_rtc", "arli", "arli_no_committed", "arli_no_midobs",
                          "standard", "bc_control", "uniform_control", "ceiling")


@dataclass
class LatencySweepConfig(SimBase):
    """``arli bench latency-sweep``: every variant x delay x seed, one budget, on the test
    episodes ``run.test_seed ..`` -> ``<report_dir>/<name>.{json,md,png}``."""

    run: RunSpec = field(default_factory=RunSpec)  # residual RL settings (env_steps <- budget)
    budget: int = MAIN_JOB_ENV_STEPS  # environment steps per RL run
    delay_steps: list[int] = field(default_factory=lambda: [0, 4, 8])
    # training seeds no tuning run used (every setting was chosen on seeds 0-2): the sweep's
    # cells confirm the defaults instead of re-measuring the runs they were chosen on
    seeds: list[int] = field(default_factory=lambda: [10, 11, 12])
    eval_episodes: int = REPORTED_TEST_EPISODES  # test episodes per seed and cell (seeds run.test_seed ..), the same for every cell
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_SWEEP_VARIANTS))
    workers: int = 2  # cell worker processes
    # torch threads per cell: a run's float sums, so its result, follow the count, so it is part
    # of each cell's fingerprint (not derived from the machine's cores: cells stay reusable)
    threads: int = 1
    report_only: bool = False  # rebuild the report from the cache and the committed cells, run nothing
    # finished `arli finetune` run directories (config.yaml, summary.json, eval_test.json) taken as
    # residual-RL cells in place of cached rows, so a sweep too long for one sitting grows from runs
    # made a batch at a time: each must be one of the sweep's cells, with its settings and base
    # (arli/bench/sweep_runs.py); only the cells they and the cache lack run
    runs: list[str] = field(default_factory=list)
    # with report_only: the digest of the base the cells ran on, where this machine's `arli pretrain`
    # trains another one (CPU kernels sum floats in another order), so a committed report can be
    # rebuilt here; "" = this machine's base
    base_digest: str = ""
    # how many times these claims have been judged on growing sets of training seeds, this one
    # included (adding seeds to a reported sweep makes look 2): the level this look is judged at
    # and the bound over all looks are arli.bench.claims.verdict_level / looks_error
    looks: int = 1
    cache: str = "outputs/latency_sweep/cells_${env.name}.jsonl"
    report_dir: str = "reports"
    name: str = "latency_sweep"  # the report: <report_dir>/<name>.{json,md,png}, its rows in <name>/cells.jsonl

    def validate(self) -> None:
        super().validate()
        self.run.validate()
        self.run.check_seeds(self.run.tune_range(), range(self.run.test_seed, self.run.test_seed + self.eval_episodes))
        require(self.budget >= 100, "budget", ">= 100 env steps", self.budget)
        require(len(self.seeds) >= 1, "seeds", "a non-empty list", self.seeds)
        require(len(set(self.seeds)) == len(self.seeds), "seeds", "distinct training seeds", self.seeds)
        require(len(self.delay_steps) >= 1, "delay_steps", "a non-empty list of integers >= 0", self.delay_steps)
        _delays(self.delay_steps)
        require(all(v in SWEEP_VARIANTS for v in self.variants), "variants", f"a list from {SWEEP_VARIANTS}",
                self.variants)
        require(self.chunking.strategy != "sync", "chunking.strategy",
                "naive, blend or rtc (the residual acts inside asynchronous execution)", self.chunking.strategy)
        require(bool(self.name) and not set(self.name) & set("/\\"), "name",
                "a file name without directories (the report is <report_dir>/<name>.*)", self.name)
        _positive(self, "eval_episodes", "workers", "threads", "looks")
        require(all(isinstance(r, str) and r for r in self.runs), "runs", "a list of `arli finetune` run directories",
                self.runs)
        require(not self.base_digest or self.report_only, "base_digest",
                "empty unless report_only=true (cells run on this machine's base only)", self.base_digest)


@dataclass
class BenchAnchorStartConfig(SimBase):
    """``arli bench anchor-start``: the anchor-pretrained start's success (no online step)
    against the pretraining's learning rate and number of updates."""

    run: RunSpec = field(default_factory=RunSpec)  # anchor data and learner settings
    # the defaults are reports/anchor_start.md's settings (about 10 min on 2 cores), which ran
    # before run.demonstrations existed: add run.demonstrations=expert to reproduce it
    delay_steps: list[int] = field(default_factory=lambda: [4])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    pretrain_lrs: list[float] = field(default_factory=lambda: [1e-3, 1e-4])
    updates: list[int] = field(default_factory=lambda: [0, 1000, 2000])
    # how the demonstrator acts, one point set per entry (empty: run.demonstrations alone)
    demonstrations: list[str] = field(default_factory=list)
    eval_episodes: int = 100  # per point, on the latency sweep's evaluation seeds
    workers: int = 2  # (delay, seed, demonstrations) triples run in parallel processes
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        super().validate()
        self.run.validate()
        self.run.check_seeds(range(self.run.tune_seed, self.run.tune_seed + self.eval_episodes), self.run.test_range())
        require(len(self.seeds) >= 1, "seeds", "a non-empty list", self.seeds)
        require(len(self.delay_steps) >= 1, "delay_steps", "a non-empty list of integers >= 0", self.delay_steps)
        _delays(self.delay_steps)
        require(len(self.pretrain_lrs) >= 1 and all(lr > 0 for lr in self.pretrain_lrs), "pretrain_lrs",
                "a non-empty list of learning rates > 0", self.pretrain_lrs)
        require(len(self.updates) >= 1 and all(u >= 0 for u in self.updates), "updates",
                "a non-empty list of update counts >= 0", self.updates)
        require(set(self.demonstrations) <= set(DEMONSTRATIONS)
                and len(set(self.demonstrations)) == len(self.demonstrations), "demonstrations",
                f"a list of distinct entries of {DEMONSTRATIONS} (empty: run.demonstrations)", self.demonstrations)
        _positive(self, "eval_episodes", "workers")

    def demonstration_modes(self) -> list[str]:
        """The demonstrators compared: ``demonstrations``, or ``run.demonstrations`` alone."""
        return list(self.demonstrations) or [self.run.demonstrations]


@dataclass
class BenchCeilingConfig(SimBase):
    """``arli bench ceiling``: the projected-expert residual through the learner's scheduler,
    delays and bound, on the test episodes; the share of anchor rows the bound clips."""

    run: RunSpec = field(default_factory=RunSpec)  # the test seeds and the default bound (run.learner)
    delay_steps: list[int] = field(default_factory=lambda: [0, 4, 8])
    scales: list[float] = field(default_factory=lambda: [0.3, 0.6, 1.0])  # the bound; 0.3 = the default
    grip_authority: list[bool] = field(default_factory=lambda: [False, True])
    # exploration the task tolerates: the projected expert at the default bound with noise of
    # these stds on r (residual units), drawn by each process of ``noise`` ([] = no such cells)
    noise_std: list[float] = field(default_factory=list)
    noise: list[str] = field(default_factory=lambda: list(NOISE_PROCESSES))
    anchor_episodes: int = 20  # demonstrations per delay for the clipped-target share
    workers: int = 2
    report_dir: str = "reports"

    def validate(self) -> None:
        super().validate()
        self.run.validate()
        require(len(self.delay_steps) >= 1, "delay_steps", "a non-empty list of integers >= 0", self.delay_steps)
        _delays(self.delay_steps)
        require(len(self.scales) >= 1 and all(0 < s <= 2 for s in self.scales), "scales",
                "a non-empty list of bounds in (0, 2]", self.scales)
        require(len(self.grip_authority) >= 1, "grip_authority", "a non-empty list of booleans", self.grip_authority)
        require(all(s > 0 for s in self.noise_std), "noise_std", "a list of stds > 0 (residual units)", self.noise_std)
        require(len(self.noise) >= 1 and set(self.noise) <= set(NOISE_PROCESSES), "noise",
                f"a non-empty list of {NOISE_PROCESSES}", self.noise)
        _positive(self, "anchor_episodes", "workers")


@dataclass
class BenchRunsConfig:
    """``arli bench runs``: finetune runs of one setting on several training seeds, pooled."""

    runs: list[str] = field(default_factory=list)  # `arli finetune` output directories
    # runs of the control setting, one per run (same training seeds, in order): paired differences
    reference: list[str] = field(default_factory=list)
    name: str = "runs"  # the report: reports/<name>.{json,md}
    report_dir: str = "reports"
    # a success the deployed residual must reach (the arli@d target, or the ceiling - 0.03
    # where that is lower): met when its 95% interval's lower end is above it
    target: float | None = None
    # the lead the runs' final must hold over the reference's (the issue's +0.05 over a control):
    # met when the paired difference's 95% interval's lower end is above it
    margin: float | None = None

    def validate(self) -> None:
        require(all(isinstance(r, str) and r for r in self.runs), "runs", "a list of run directories", self.runs)
        require(len({os.path.normpath(r) for r in self.runs}) == len(self.runs), "runs",
                "each run directory once", self.runs)
        require(self.target is None or 0 < self.target < 1, "target", "a success rate in (0, 1), or null",
                self.target)
        require(self.margin is None or -1 < self.margin < 1, "margin", "a success difference in (-1, 1), or null",
                self.margin)
        require(self.margin is None or bool(self.reference), "margin",
                "reference=[...] runs to lead (a margin is over the reference's final)", self.margin)
        require(all(isinstance(r, str) and r for r in self.reference), "reference",
                "a list of run directories (one per run, same training seeds)", self.reference)


# what can make finished runs one group in ``arli bench diagnostics``
DIAGNOSTICS_GROUP_FIELDS = ("env", "variant", "learner", "delay_steps", "budget", "base")


@dataclass
class BenchDiagnosticsConfig:
    """``arli bench diagnostics``: finished finetune runs' learner statistics and speed, grouped."""

    runs: list[str] = field(default_factory=list)  # run directories, or glob patterns ('reports/**/summary.json')
    # learner statistics from each summary's learner_diagnostics, the first one plotted
    # (the defaults: recorded by every learner; AWR's weight ESS and advantage SNR only by awr runs)
    keys: list[str] = field(default_factory=lambda: ["critic_loss", "q_mean"])
    # fields of DIAGNOSTICS_GROUP_FIELDS; learner is `default`, a named control, or the learner
    # settings that differ from today's default; budget is run.env_steps; base the base_digest
    group_by: list[str] = field(default_factory=lambda: ["variant", "learner", "budget"])
    # also each run's tune curve with the critic's mean Q on the evaluated steps against their
    # discounted return (its bias along training) and the gate's choices: <name>_curves.png
    curves: bool = False
    name: str = "diagnostics"  # the report: reports/<name>.{json,md,png}
    report_dir: str = "reports"

    def validate(self) -> None:
        require(all(isinstance(r, str) and r for r in self.runs), "runs",
                "a list of run directories or glob patterns", self.runs)
        require(bool(self.keys) and all(isinstance(k, str) and k for k in self.keys), "keys",
                "a non-empty list of learner_diagnostics names (e.g. awr_weight_ess)", self.keys)
        require(all(g in DIAGNOSTICS_GROUP_FIELDS for g in self.group_by), "group_by",
                f"a list drawn from {list(DIAGNOSTICS_GROUP_FIELDS)}", self.group_by)
        require(bool(self.name) and not set(self.name) & set("/\\"), "name",
                "a file name without directories (the report is <report_dir>/<name>.*)", self.name)


@dataclass
class BenchTuneConfig:
    """``arli bench tune``: finetune runs of different settings on their shared tune episodes;
    the setting is chosen by code (paired gain over the reference resolved above 0)."""

    runs: list[str] = field(default_factory=list)  # `arli finetune` output directories; the FIRST is the reference
    name: str = "tune"  # the report: <report_dir>/<name>.{json,md,png}
    episodes: int = 100  # tune episodes per run: seeds run.tune_seed .. (never the test seeds)
    # committed `arli bench tune` JSONs whose rows hold the runs' outcomes on these episodes: pooled from
    # them, nothing evaluated (the run directories then need only config.yaml and summary.json)
    outcomes_from: list[str] = field(default_factory=list)
    # a setting qualifies when its paired gain over the reference has a 95% CI lower end above margin
    # (< 0: no more than -margin worse, a non-inferiority choice)
    margin: float = 0.0
    # among those qualifying: "success" (the highest), "cost" (least learner time, reference included) or
    # "dip" (the tune curve's shallowest worst dip below its start while learning, reference included)
    prefer: str = "success"
    # runs evaluated in parallel processes, one torch thread each (1: in this process, torch's default threads)
    workers: int = 1
    report_dir: str = "reports"

    def validate(self) -> None:
        require(all(isinstance(r, str) and r for r in self.runs), "runs",
                "a list of run directories, the reference first", self.runs)
        _positive(self, "episodes")
        require(-1 < self.margin < 1, "margin", "a success difference in (-1, 1)", self.margin)
        require(self.prefer in ("success", "cost", "dip"), "prefer", "success, cost or dip", self.prefer)
        _positive(self, "workers")
        require(all(isinstance(r, str) and r.endswith(".json") for r in self.outcomes_from), "outcomes_from",
                "a list of `arli bench tune` report JSONs (reports/<name>.json)", self.outcomes_from)
        require(bool(self.name) and not set(self.name) & set("/\\"), "name",
                "a file name without directories (the report is <report_dir>/<name>.*)", self.name)


# the action inputs `arli bench critic refit=[...]` trains fresh critics with (arli/bench/critic_refit.py):
# the executed action (the learner's own), the residual (a - b) / scale, the residual over exploration_std
REFIT_TREATMENTS = ("executed", "residual", "residual_std")
# critic settings a refit may change (`<input>:<field>=<value>,...`); gamma and n_step are not among
# them: the replay's n-step returns and discounts were computed with the run's own
REFIT_SETTINGS = ("critic_heads", "critic_hidden", "critic_subset", "critic_lr", "tau", "anchor_ratio", "batch_size",
                  "target_noise", "target_noise_clip", "grad_clip")


def parse_refit(entry: str) -> tuple[str, dict[str, int | float]]:
    """``"<input>"`` or ``"<input>:<field>=<value>,..."`` (REFIT_TREATMENTS, REFIT_SETTINGS) ->
    (input, {field: value typed as the learner's field}); a ConfigError names what is wrong."""
    from arli.rl.config import LearnerConfig  # noqa: PLC0415

    treatment, _, rest = str(entry).partition(":")
    require(treatment in REFIT_TREATMENTS, "refit", f"entries '<input>' or '<input>:<field>=<value>,...' with "
            f"<input> one of {list(REFIT_TREATMENTS)}", entry)
    overrides: dict[str, int | float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        require(key not in overrides, "refit", f"each setting once per entry ({key} twice)", entry)
        require(bool(eq) and key in REFIT_SETTINGS, "refit", f"settings '<field>=<value>' with <field> one of "
                f"{list(REFIT_SETTINGS)} (gamma and n_step are fixed by the replay's n-step rows)", entry)
        kind = type(getattr(LearnerConfig, key))
        try:
            overrides[key] = kind(value)
        except ValueError:
            require(False, "refit", f"{key} as {kind.__name__}", entry)
    return treatment, overrides


@dataclass
class BenchCriticConfig:
    """``arli bench critic``: a run's critic against Monte-Carlo returns of candidate actions."""

    runs: list[str] = field(default_factory=list)  # `arli finetune` output directories (with checkpoint/)
    episodes: int = 10  # roll-in episodes per state source (the residual's, the expert's)
    every: int = 10  # control steps between sampled states
    states: int = 30  # sampled states per source and run
    perturbations: int = 4  # random moves of r(s) per state
    perturb_scale: float = 0.5  # their size per action entry, in residual units
    # rollouts per candidate, each under its own draw of the base's sampling noise; their mean is
    # the Monte-Carlo Q, and with >= 2 the report adds the labels' split-half reliability
    repeats: int = 1
    seed_base: int | None = None  # roll-in episode seeds; null = the run's tune seeds (its test seeds: refused)
    seed: int = 0  # the perturbations' draws
    # fresh critics with another action input (REFIT_TREATMENTS) and optionally other critic settings
    # (double-quoted in the list: 'refit=[executed, "executed:critic_heads=10,anchor_ratio=0"]'), each
    # trained refit_updates critic steps on the run's replay with its residual fixed, scoring the same candidates
    refit: list[str] = field(default_factory=list)
    refit_updates: int = 30000
    workers: int = 1  # runs judged in parallel processes (one torch thread each)
    name: str = ""  # the report: reports/<name>.*; "" = critic_<task>
    # rewrite reports/<name>.* from the judged states its JSON holds (no rollouts): the same
    # command as wrote it, plus report_only=true
    report_only: bool = False
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        require(all(isinstance(r, str) and r for r in self.runs), "runs",
                "a list of `arli finetune` run directories", self.runs)
        require(not self.report_only or bool(self.name), "name",
                "the report to rebuild with report_only=true (reports/<name>.json)", self.name)
        for name in ("episodes", "every", "states", "workers", "repeats"):
            require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        require(self.perturbations >= 0, "perturbations", ">= 0", self.perturbations)
        require(self.perturb_scale > 0, "perturb_scale", "> 0", self.perturb_scale)
        require(isinstance(self.refit, list), "refit", "a list of entries '<input>' or '<input>:<field>=<value>,...'",
                self.refit)
        # distinct as critics, not as strings: "executed" and "executed:" train the same one
        parsed = [(t, tuple(sorted(o.items()))) for t, o in map(parse_refit, self.refit)]
        require(len(set(parsed)) == len(parsed), "refit", "distinct critics (two entries here train the same one)",
                self.refit)
        require(self.refit_updates >= 1, "refit_updates", ">= 1", self.refit_updates)
        # refits are compared on the split halves' pairs, which need two rollouts per candidate
        require(not self.refit or self.repeats >= 2, "repeats", ">= 2 with refit (the refits are compared on "
                "split halves of the repeats)", self.repeats)


@dataclass
class BenchServeConfig:
    """``arli bench serve``: the inference server under several robots, batched vs sequential."""

    robots: list[int] = field(default_factory=lambda: [1, 2, 4])  # concurrent closed-loop clients
    policies: list[str] = field(default_factory=lambda: ["flow", "act"])  # built-in flow | LeRobot ACT
    requests: int = 40  # per robot and row, after warm-up
    warmup: int = 5
    max_batch: int = 8  # of the batched rows (the sequential rows use 1)
    device: str = "auto"  # the servers' device (every row says where it ran)
    threads: int = 1  # torch threads of the server process (this machine has 2 cores)
    image_size: int = 96  # two cameras of this size in every request
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        require(bool(self.robots) and all(isinstance(r, int) and r >= 1 for r in self.robots), "robots",
                "a list of robot counts >= 1", self.robots)
        require(bool(self.policies) and set(self.policies) <= {"flow", "act"}, "policies",
                "a list from flow, act", self.policies)
        require(self.requests >= 5, "requests", ">= 5", self.requests)
        require(self.max_batch >= 2, "max_batch", ">= 2 (the batched rows)", self.max_batch)
        require(self.threads >= 1, "threads", ">= 1", self.threads)
        require(self.image_size >= 16, "image_size", ">= 16", self.image_size)
        check_device(self.device)


@dataclass
class BenchLearnerConfig:
    """``arli bench learner``: updates/s of the default learner vs a plain reference."""

    obs_dim: int = 20  # peg_insert's state
    action_dim: int = 5
    chunk_size: int = 16
    seconds: float = 5.0  # per measurement
    threads: int = 2
    seed: int = 0
    # where the updates run (auto|cpu|cuda[:i]); off the CPU the report is <report_dir>/learner_cuda.*
    device: str = "cpu"
    # [batch, critic heads, critic hidden] of each row of the size sweep (the default learner otherwise)
    shapes: list[list[int]] = field(default_factory=lambda: [[256, 4, 128], [1024, 4, 128], [256, 10, 256],
                                                             [1024, 10, 256], [4096, 10, 512]])
    # rewrite <report_dir>/learner[_cuda].md from its committed JSON, measure nothing
    report_only: bool = False
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        _positive(self, "obs_dim", "action_dim", "chunk_size", "threads")
        require(self.seconds > 0, "seconds", "> 0", self.seconds)
        check_device(self.device)
        require(not self.report_only or self.device != "auto", "device",
                "cpu or cuda[:i] with report_only=true (which report to rewrite: learner or learner_cuda)",
                self.device)
        require(not self.report_only or bool(self.report_dir), "report_dir",
                "the folder holding the report to rewrite with report_only=true", self.report_dir)
        require(all(len(s) == 3 and all(isinstance(v, int) and v >= 1 for v in s) for s in self.shapes), "shapes",
                "a list of [batch, critic heads, critic hidden], each an integer >= 1", self.shapes)
        require(all(s[1] >= 2 for s in self.shapes), "shapes", "critic heads >= 2 (the target's min is over 2)",
                self.shapes)


@dataclass
class BenchSimConfig:
    """``arli bench sim``: control steps/s of our default task vs robosuite Lift."""

    env: EnvConfig = field(default_factory=EnvConfig)
    steps: int = 4000
    robosuite_steps: int = 400
    seed: int = 0
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        self.env.validate()
        require(self.steps >= 100, "steps", ">= 100", self.steps)
        require(self.robosuite_steps >= 10, "robosuite_steps", ">= 10", self.robosuite_steps)


@dataclass
class BenchRecordConfig:
    """``arli bench record``: save time per episode vs dataset size, open vs reopened dataset."""

    episodes: int = 500  # synthetic episodes recorded with the recorder as it is (the report reads 10, 100, 500)
    # the same through a reopen after each episode (the former path; its saves grow ~14 ms per
    # episode, so 500 would take half an hour); 0 = skip
    reopen_episodes: int = 100
    frames: int = 50  # control steps per episode
    cameras: list[str] = field(default_factory=lambda: ["front", "wrist"])
    image_size: int = 64
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        _positive(self, "episodes", "frames")
        require(self.reopen_episodes >= 0, "reopen_episodes", ">= 0 (0 = skip the former path)", self.reopen_episodes)
        require(len(self.cameras) >= 1 and len(set(self.cameras)) == len(self.cameras), "cameras",
                "a list of distinct camera names", list(self.cameras))
        require(self.image_size >= 32 and self.image_size % 2 == 0, "image_size",
                "an even size >= 32 (LeRobot's AV1 encoder)", self.image_size)


@dataclass
class BenchTransportConfig:
    """``arli bench transport``: our ZeroMQ path vs LeRobot's gRPC path, same stub."""

    # per row: a p99 is the slowest 1%, so 3000 requests put 30 of them behind it (1000 put 10,
    # and one slow spell moved the ratio 2x)
    requests: int = 3000
    rounds: int = 20  # the rows take turns in this many blocks (the ratios' bootstrap resamples them)
    warmup: int = 50
    compute_ms: float = 5.0
    stub_compute: str = "wait"  # wait (a GPU-bound model's host thread) | spin (a busy CPU core)
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        require(self.requests >= 10, "requests", ">= 10", self.requests)
        require(1 <= self.rounds <= self.requests and self.requests % self.rounds == 0, "rounds",
                "between 1 and requests, dividing requests (equal blocks)", self.rounds)
        require(self.warmup >= 0, "warmup", ">= 0", self.warmup)
        require(self.compute_ms >= 0, "compute_ms", ">= 0", self.compute_ms)
        require(self.stub_compute in ("wait", "spin"), "stub_compute", "wait or spin", self.stub_compute)


@dataclass
class BenchRuntimeConfig:
    """``arli bench runtime``: control-loop timing error and residual latency at 20 Hz."""

    env: EnvConfig = field(default_factory=EnvConfig)
    chunking: ChunkingConfig = field(default_factory=lambda: ChunkingConfig(planned_delay_steps=4))
    steps: int = 2000
    compute_ms: float = 20.0  # stub policy compute
    min_latency_s: float = 0.2  # replies padded: requests in flight half the time
    spin_s: float = 0.002  # the loop spins (instead of sleeping) this long before each tick
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        self.env.validate()
        self.chunking.validate()
        require(self.chunking.planned_delay_steps is not None, "chunking.planned_delay_steps",
                "the delay (steps) the robot plans for", None)
        require(self.steps >= 100, "steps", ">= 100", self.steps)
        require(self.min_latency_s >= 0, "min_latency_s", ">= 0", self.min_latency_s)
        require(self.compute_ms >= 0, "compute_ms", ">= 0", self.compute_ms)


@dataclass
class BenchPipelineConfig:
    """``arli bench pipeline``: multi-process sim run vs in-process run, same config."""

    env: EnvConfig = field(default_factory=EnvConfig)
    env_steps: int = 5000
    actors: int = 2
    output_dir: str = "outputs/pipeline"
    report_only: bool = False
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        self.env.validate()
        require(self.env_steps >= 100, "env_steps", ">= 100", self.env_steps)
        _positive(self, "actors")


@dataclass
class BenchInterventionsConfig:
    """``arli bench interventions``: intervention rate over a hil finetuning run."""

    env: EnvConfig = field(default_factory=EnvConfig)
    env_steps: int = 10_000
    window: int = 10  # training episodes per point
    run_dir: str = "outputs/interventions"
    overrides: list[str] = field(default_factory=list)  # extra `arli finetune` overrides
    report_only: bool = False
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        self.env.validate()
        require(self.env_steps >= 100, "env_steps", ">= 100", self.env_steps)
        _positive(self, "window")


@dataclass
class BenchDriftConfig:
    """``arli bench drift``: where the select update takes the actor with the run's critic frozen."""

    run: str = ""  # an `arli finetune` output directory (with checkpoint/): e.g. one saved at the critic's warm-up
    updates: int = 150  # actor steps per setting
    episodes: int = 30  # the actor alone, before and after: seeds seed_base ..
    seed_base: int | None = None  # null = the run's tune seeds (its test seeds: refused)
    # learner settings to compare, each "key=value[,key=value]" over the run's own ("" = the run's)
    settings: list[str] = field(default_factory=lambda: [""])
    seed: int = 0  # the replay batches' and candidates' draws
    name: str = ""  # the report: <report_dir>/<name>.*; "" = drift
    json: bool = False
    report_dir: str = "reports"

    def validate(self) -> None:
        require(len(self.settings) >= 1, "settings", "a non-empty list (\"\" = the run's own)", self.settings)
        require(self.seed_base is None or self.seed_base >= 0, "seed_base", "null or >= 0", self.seed_base)
        _positive(self, "updates", "episodes")


# command config name (configs/<name>.yaml) -> schema
SCHEMAS: dict[str, type] = {
    "rollout": RolloutConfig, "collect_demos": CollectDemosConfig, "pretrain": PretrainConfig,
    "finetune": FinetuneConfig, "eval": EvalConfig, "record": RecordConfig, "learner": LearnerServiceConfig,
    "serve": ServeConfig, "actor": ActorConfig, "launch": LaunchConfig, "keys": KeysConfig,
    "bench_base": BenchBaseConfig, "bench_latency_sweep": LatencySweepConfig,
    "bench_anchor_start": BenchAnchorStartConfig, "bench_ceiling": BenchCeilingConfig,
    "bench_runs": BenchRunsConfig, "bench_diagnostics": BenchDiagnosticsConfig, "bench_tune": BenchTuneConfig, "bench_learner": BenchLearnerConfig,
    "bench_serve": BenchServeConfig,
    "bench_critic": BenchCriticConfig, "bench_drift": BenchDriftConfig,
    "bench_sim": BenchSimConfig, "bench_record": BenchRecordConfig, "bench_transport": BenchTransportConfig, "bench_runtime": BenchRuntimeConfig,
    "bench_pipeline": BenchPipelineConfig, "bench_interventions": BenchInterventionsConfig,
}


def register_configs() -> None:
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        cs.store(name=f"{name}_schema", node=schema)
    cs.store(group="env", name="env_schema", node=EnvConfig)
    cs.store(group="latency", name="latency_schema", node=LatencyConfig)


def validate(cfg: Any) -> None:
    """The command config's own checks; plain ValueErrors from below become ConfigErrors."""
    try:
        cfg.validate()
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
