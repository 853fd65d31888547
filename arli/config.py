"""Config schemas (declared once, registered with Hydra) and their start-up validation.

Each command composes ``configs/<command>.yaml`` (defaults from the groups ``env``,
``latency``, ``chunking``) over the dataclass schema below, applies ``key=value``
overrides, and validates: a wrong key or value fails with the field and what is allowed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from arli.errors import InputError
from arli.policies.flow_config import FlowHyperparams
from arli.rl.config import RunSpec
from robot_drivers.franka.config import FrankaConfig

LATENCY_KINDS = ("fixed", "uniform", "lognormal", "trace")


class ConfigError(InputError):
    """A config field has a value that is not allowed; the message names both."""


def _require(ok: bool, field_name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{field_name}: expected {allowed}, got {value!r}")


@dataclass
class EnvConfig:
    name: str = "peg_insert"  # pick_cube | peg_insert | robosuite_lift (or a gym id)
    dt: float = 0.05  # control period (s)
    image_size: int = 0  # 0 = state only; >0 renders (S, S, 3) images (MUJOCO_GL=egl)
    max_episode_steps: int | None = None  # None = the task's default


@dataclass
class LatencyConfig:
    kind: str = "fixed"  # fixed | uniform | lognormal | trace
    seconds: float = 0.2  # fixed
    low: float = 0.1  # uniform
    high: float = 0.3
    median: float = 0.2  # lognormal
    sigma: float = 0.3
    jitter: float = 0.0
    max: float | None = None  # lognormal truncation; None = 4 * median + jitter
    trace_path: str = ""  # trace: one latency (s) per line, or a JSON list


@dataclass
class ChunkingConfig:
    chunk_size: int = 16
    execute_horizon: int = 8
    mode: str = "async"  # async | sync
    strategy: str = "naive"  # naive | blend | rtc
    blend_steps: int = 4


@dataclass
class RolloutConfig:
    """``arli rollout``: a chunk policy under simulated latency, success per delay."""

    env: EnvConfig = field(default_factory=EnvConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    policy: str = "expert"  # expert (open-loop chunks of the scripted expert)
    episodes: int = 30
    seed: int = 0
    # a sweep over fixed delays in steps; empty = use ``latency`` as configured
    delay_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 8])
    strategies: list[str] = field(default_factory=lambda: ["sync", "naive", "blend", "rtc"])
    output_dir: str = "outputs/rollout"


@dataclass
class BenchSimConfig:
    """``arli bench sim``: control steps/s of our default task vs robosuite Lift."""

    env: EnvConfig = field(default_factory=EnvConfig)
    steps: int = 4000
    robosuite_steps: int = 400
    seed: int = 0
    json: bool = False
    report_dir: str = "reports"


def validate_env(cfg: EnvConfig) -> None:
    from sim_envs.registry import TASKS, task_name  # noqa: PLC0415 - avoid import cycle

    try:
        task_name(cfg.name)
    except ValueError:
        _require(False, "env.name", f"one of {sorted(TASKS)}", cfg.name)
    _require(cfg.dt > 0 and abs(cfg.dt / 0.005 - round(cfg.dt / 0.005)) < 1e-6,
             "env.dt", "a positive multiple of 0.005 s", cfg.dt)
    _require(cfg.image_size >= 0, "env.image_size", "an integer >= 0", cfg.image_size)
    _require(cfg.max_episode_steps is None or cfg.max_episode_steps > 0,
             "env.max_episode_steps", "null or > 0", cfg.max_episode_steps)


def validate_latency(cfg: LatencyConfig) -> None:
    _require(cfg.kind in LATENCY_KINDS, "latency.kind", f"one of {LATENCY_KINDS}", cfg.kind)
    for name in ("seconds", "low", "high", "median", "sigma", "jitter"):
        value = getattr(cfg, name)
        _require(math.isfinite(value) and value >= 0, f"latency.{name}", "a finite number >= 0", value)
    if cfg.kind == "uniform":
        _require(cfg.low <= cfg.high, "latency.low", f"<= latency.high ({cfg.high})", cfg.low)
    if cfg.kind == "lognormal":
        _require(cfg.median > 0, "latency.median", "> 0", cfg.median)
    if cfg.kind == "trace":
        _require(bool(cfg.trace_path), "latency.trace_path", "a file path for kind=trace", cfg.trace_path)


def validate_chunking(cfg: ChunkingConfig) -> None:
    from arli.chunking import MODES, STRATEGIES  # noqa: PLC0415

    _require(cfg.mode in MODES, "chunking.mode", f"one of {MODES}", cfg.mode)
    _require(cfg.strategy in STRATEGIES, "chunking.strategy", f"one of {STRATEGIES}", cfg.strategy)
    _require(cfg.chunk_size >= 1, "chunking.chunk_size", ">= 1", cfg.chunk_size)
    _require(1 <= cfg.execute_horizon <= cfg.chunk_size, "chunking.execute_horizon",
             f"in [1, chunk_size={cfg.chunk_size}]", cfg.execute_horizon)
    _require(cfg.blend_steps >= 1, "chunking.blend_steps", ">= 1", cfg.blend_steps)


def validate_rollout(cfg: RolloutConfig) -> None:
    validate_env(cfg.env)
    validate_latency(cfg.latency)
    validate_chunking(cfg.chunking)
    _require(cfg.policy in ("expert",), "policy", "one of ('expert',)", cfg.policy)
    _require(cfg.episodes >= 1, "episodes", ">= 1", cfg.episodes)
    _require(all(d >= 0 for d in cfg.delay_steps), "delay_steps", "a list of integers >= 0", cfg.delay_steps)
    allowed = ("sync", "naive", "blend", "rtc")
    _require(all(s in allowed for s in cfg.strategies), "strategies", f"a list from {allowed}", cfg.strategies)


def validate_bench_sim(cfg: BenchSimConfig) -> None:
    validate_env(cfg.env)
    _require(cfg.steps >= 100, "steps", ">= 100", cfg.steps)
    _require(cfg.robosuite_steps >= 10, "robosuite_steps", ">= 10", cfg.robosuite_steps)


# command name -> (schema, validator, YAML config name)
SCHEMAS: dict[str, tuple[type, Any]] = {
    "rollout": (RolloutConfig, validate_rollout),
    "bench_sim": (BenchSimConfig, validate_bench_sim),
}


def register_configs() -> None:
    cs = ConfigStore.instance()
    for name, (schema, _) in SCHEMAS.items():
        cs.store(name=f"{name}_schema", node=schema)
    cs.store(group="env", name="env_schema", node=EnvConfig)
    cs.store(group="latency", name="latency_schema", node=LatencyConfig)
    cs.store(group="chunking", name="chunking_schema", node=ChunkingConfig)


@dataclass
class CollectDemosConfig:
    """``arli collect-demos``: scripted-expert episodes into a LeRobotDataset v3."""

    env: EnvConfig = field(default_factory=EnvConfig)
    episodes: int = 200
    root: str = "data/demos/${env.name}"
    seed: int = 0


@dataclass
class PretrainConfig:
    """``arli pretrain``: behaviour cloning of the flow policy from the demo dataset."""

    env: EnvConfig = field(default_factory=EnvConfig)
    policy: FlowHyperparams = field(default_factory=FlowHyperparams)
    dataset_root: str = "data/demos/${env.name}"
    demos: int = 200  # collected first if the dataset is missing
    output_dir: str = "checkpoints/base_${env.name}"
    steps: int = 3000
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 1e-4
    eval_every: int = 1000
    eval_episodes: int = 20
    seed: int = 0


@dataclass
class BenchBaseConfig:
    """``arli bench base``: the pretrained policy, sync vs async naive/blend/rtc per delay."""

    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = "checkpoints/base_${env.name}"
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    episodes: int = 100
    delay_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 8])
    strategies: list[str] = field(default_factory=lambda: ["sync", "naive", "blend", "rtc"])
    execute_horizon: int = 8
    blend_steps: int = 4
    seed: int = 10_000  # evaluation seeds are disjoint from the demo seeds
    trace_episodes: int = 20  # traced async-naive episodes per delay (why it fails); 0 = none
    report_dir: str = "reports"


def validate_flow(cfg: FlowHyperparams) -> None:
    try:
        cfg.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def validate_collect(cfg: CollectDemosConfig) -> None:
    validate_env(cfg.env)
    _require(cfg.episodes >= 1, "episodes", ">= 1", cfg.episodes)


def validate_pretrain(cfg: PretrainConfig) -> None:
    validate_env(cfg.env)
    validate_flow(cfg.policy)
    for name in ("steps", "batch_size", "eval_every", "demos"):
        _require(getattr(cfg, name) >= 1, name, ">= 1", getattr(cfg, name))
    _require(cfg.lr > 0, "lr", "> 0", cfg.lr)


def validate_bench_base(cfg: BenchBaseConfig) -> None:
    validate_env(cfg.env)
    validate_pretrain(cfg.pretrain)
    _require(cfg.episodes >= 1, "episodes", ">= 1", cfg.episodes)
    allowed = ("sync", "naive", "blend", "rtc")
    _require(all(s in allowed for s in cfg.strategies), "strategies", f"a list from {allowed}", cfg.strategies)


SCHEMAS.update({
    "collect_demos": (CollectDemosConfig, validate_collect),
    "pretrain": (PretrainConfig, validate_pretrain),
    "bench_base": (BenchBaseConfig, validate_bench_base),
})


@dataclass
class FinetuneConfig(RunSpec):
    """``arli finetune``: ARLI residual RL on top of the base policy under simulated latency."""

    env: EnvConfig = field(default_factory=EnvConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    # the main job (`make demo`): d = 8 and 50k online steps, where learning from reward shows
    # on this budget (at d = 4 the anchor-pretrained start is already 0.88-0.94 and the online
    # phase holds it, reports/learner_tuning.md). The sweep sets both per cell.
    delay_steps: int | None = 8  # fixed delay in control steps; null = use ``latency``
    env_steps: int = 50_000
    checkpoint: str = "checkpoints/base_${env.name}"  # base policy (trained if missing)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    final_eval_episodes: int = 100
    output_dir: str = ""  # "" = outputs/finetune_<env>_<variant>_d<delay>_<time>
    resume: str = ""  # an output_dir/checkpoint to continue from


def validate_run(cfg: RunSpec) -> None:
    from arli.augment import VARIANTS  # noqa: PLC0415

    from arli.rl.config import REGIMES  # noqa: PLC0415

    _require(cfg.variant in VARIANTS, "variant", f"one of {VARIANTS}", cfg.variant)
    _require(cfg.regime in REGIMES, "regime", f"one of {REGIMES}", cfg.regime)
    allowed = ("naive", "blend", "rtc")
    _require(cfg.strategy in allowed, "strategy", f"one of {allowed}", cfg.strategy)
    for name in ("env_steps", "eval_every", "eval_episodes", "execute_horizon"):
        _require(getattr(cfg, name) >= 1, name, ">= 1", getattr(cfg, name))
    _require(cfg.anchor_episodes >= 0, "anchor_episodes", ">= 0", cfg.anchor_episodes)
    for root in cfg.datasets:
        _require(os.path.isdir(root), "datasets", "paths of recorded LeRobotDatasets", root)
    try:
        cfg.intervention.validate()
        cfg.learner.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def validate_finetune(cfg: FinetuneConfig) -> None:
    validate_env(cfg.env)
    validate_latency(cfg.latency)
    validate_pretrain(cfg.pretrain)
    validate_run(cfg)
    _require(cfg.delay_steps is None or cfg.delay_steps >= 0, "delay_steps", "null or >= 0", cfg.delay_steps)
    _require(cfg.final_eval_episodes >= 1, "final_eval_episodes", ">= 1", cfg.final_eval_episodes)


SCHEMAS["finetune"] = (FinetuneConfig, validate_finetune)


@dataclass
class RecordConfig(FinetuneConfig):
    """``arli record``: episodes of base + residual with an intervener, into a crash-safe
    LeRobotDataset. In sim (``device=scripted``) the scripted operator intervenes; with a
    person's device they do. The residual is a finetune run's checkpoint (or zero)."""

    episodes: int = 10
    root: str = "data/interventions/${env.name}"
    resume: bool = False  # append to an existing dataset at root
    residual: str = ""  # a finetune checkpoint dir (outputs/<run>/checkpoint); "" = base only
    device: str = "scripted"  # scripted (sim) | none | spacemouse | gamepad | keyboard
    image_size: int = 0  # > 0: record the sim camera as video at this size
    save_failed: bool = True  # keep episodes that failed (interventions in them still teach)
    seed: int = 0


def validate_record(cfg: RecordConfig) -> None:
    from robot_drivers.teleop import DEVICES  # noqa: PLC0415

    validate_finetune(cfg)
    _require(cfg.episodes >= 1, "episodes", ">= 1", cfg.episodes)
    _require(cfg.device in ("scripted", *DEVICES), "device", f"one of {('scripted', *DEVICES)}", cfg.device)
    _require(cfg.image_size >= 0, "image_size", ">= 0 (0 = no camera)", cfg.image_size)


SCHEMAS["record"] = (RecordConfig, validate_record)


SWEEP_VARIANTS = ("base_sync", "base_naive", "base_rtc", "arli", "arli_no_committed", "arli_no_midobs",
                  "standard", "standard_d0", "stepwise_d0", "bc_control", "anchor_only")


@dataclass
class LatencySweepConfig:
    """``arli bench latency-sweep``: every variant x delay x seed, one budget."""

    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = "checkpoints/base_${env.name}"
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    run: RunSpec = field(default_factory=RunSpec)  # residual RL settings (env_steps <- budget)
    budget: int = 10_000  # environment steps per RL run (the issue allows up to 50k)
    delay_steps: list[int] = field(default_factory=lambda: [0, 4, 8])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    eval_episodes: int = 100  # per seed and cell
    variants: list[str] = field(default_factory=lambda: list(SWEEP_VARIANTS))
    workers: int = 2  # cell worker processes
    report_only: bool = False  # rebuild the report from the cache, run nothing
    cache: str = "outputs/latency_sweep/cells_${env.name}.jsonl"
    report_dir: str = "reports"


def validate_sweep(cfg: LatencySweepConfig) -> None:
    validate_env(cfg.env)
    validate_pretrain(cfg.pretrain)
    validate_run(cfg.run)
    _require(cfg.budget >= 100, "budget", ">= 100 env steps", cfg.budget)
    _require(len(cfg.seeds) >= 1, "seeds", "a non-empty list", cfg.seeds)
    _require(all(d >= 0 for d in cfg.delay_steps), "delay_steps", "integers >= 0", cfg.delay_steps)
    _require(all(v in SWEEP_VARIANTS for v in cfg.variants), "variants", f"a list from {SWEEP_VARIANTS}",
             cfg.variants)
    _require(cfg.eval_episodes >= 1, "eval_episodes", ">= 1", cfg.eval_episodes)
    _require(cfg.workers >= 1, "workers", ">= 1", cfg.workers)


SCHEMAS["bench_latency_sweep"] = (LatencySweepConfig, validate_sweep)


@dataclass
class BenchLearnerConfig:
    """``arli bench learner``: updates/s of the default learner vs a plain reference."""

    obs_dim: int = 20  # peg_insert's state
    action_dim: int = 5
    chunk_size: int = 16
    seconds: float = 5.0  # per measurement
    threads: int = 2
    seed: int = 0
    json: bool = False
    report_dir: str = "reports"


def validate_bench_learner(cfg: BenchLearnerConfig) -> None:
    for name in ("obs_dim", "action_dim", "chunk_size", "threads"):
        _require(getattr(cfg, name) >= 1, name, ">= 1", getattr(cfg, name))
    _require(cfg.seconds > 0, "seconds", "> 0", cfg.seconds)


SCHEMAS["bench_learner"] = (BenchLearnerConfig, validate_bench_learner)


# -- pipeline: server, learner, actors as processes (arli serve / learner / actor / launch) --
@dataclass
class CurveSettings:
    enabled: bool = False  # CurveZMQ encryption + client authentication
    keys_dir: str = "keys"  # written by `arli keys`


@dataclass
class TransportConfig:
    """Where each service listens (bind side uses the port with ``tcp://*``)."""

    server: str = "tcp://127.0.0.1:5555"  # inference server (robot -> GPU machine)
    learner: str = "tcp://127.0.0.1:5556"  # transitions (robot -> workstation)
    weights: str = "tcp://127.0.0.1:5557"  # weights (workstation -> robots)
    curve: CurveSettings = field(default_factory=CurveSettings)


def bind_address(address: str) -> str:
    """tcp://host:port -> tcp://*:port (what a service binds)."""
    if address.startswith("tcp://"):
        return "tcp://*:" + address.rsplit(":", 1)[1]
    return address


@dataclass
class ServeConfig:
    """``arli serve``: a base policy behind ZeroMQ for any number of robots."""

    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = "checkpoints/base_${env.name}"  # built-in flow, LeRobot dir, or "expert"
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    min_latency_s: float = 0.0  # pad replies (emulate a slower VLA); 0 = as fast as it runs
    max_seconds: float = 0.0  # 0 = serve until interrupted
    max_message_mb: float = 64.0  # larger requests are refused with a too_large error


ROBOTS = ("sim", "franka")


@dataclass
class RobotSideConfig:
    """What runs at the robot: which robot, cameras, the operator's device, recording."""

    robot: str = "sim"  # sim: the env.name task on a real clock | franka: franky at franka.hostname
    franka: FrankaConfig = field(default_factory=FrankaConfig)
    cameras: dict[str, str] = field(default_factory=dict)  # name -> OpenCV source (index, URL or file)
    camera_size: int = 96  # frames resized to camera_size x camera_size
    device: str = "none"  # none | spacemouse | gamepad | keyboard: a person takes over with it
    record_root: str = ""  # record every episode into this LeRobotDataset (appends if it exists)
    task: str = ""  # task text stored with recorded frames ("" = the env's instruction)


def validate_robot_side(cfg: RobotSideConfig) -> None:
    from robot_drivers.teleop import DEVICES  # noqa: PLC0415

    _require(cfg.robot in ROBOTS, "robot", f"one of {ROBOTS}", cfg.robot)
    _require(cfg.device in DEVICES, "device", f"one of {DEVICES}", cfg.device)
    _require(cfg.camera_size >= 8, "camera_size", ">= 8", cfg.camera_size)
    try:
        cfg.franka.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@dataclass
class ActorConfig(RobotSideConfig):
    """``arli actor``: the robot runtime against a server and a learner."""

    env: EnvConfig = field(default_factory=EnvConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    actor_id: str = "actor0"
    execute_horizon: int = 8
    strategy: str = "naive"
    planned_delay_steps: int = 4  # the scheduler's bound on d; longer replies are spikes
    min_delay_steps: int = 0  # a reply never lands earlier (server's min_latency_s / dt)
    max_episodes: int = 0  # 0 = until the learner is done
    seed: int = 0
    weights_timeout_s: float = 300.0
    spin_s: float = 0.002  # spin before each tick; = env.dt on a dedicated core keeps the residual hot
    output_dir: str = "outputs/actor_${actor_id}"  # latency trace + stats


@dataclass
class LearnerServiceConfig(FinetuneConfig):
    """``arli learner``: the finetuning learner as a service for a fleet of actors."""

    # the actors' default delay (ActorConfig.planned_delay_steps) and budget, not the main job's
    delay_steps: int | None = ActorConfig.planned_delay_steps
    env_steps: int = RunSpec.env_steps
    transport: TransportConfig = field(default_factory=TransportConfig)
    publish_every: int = 50  # updates between weight broadcasts
    checkpoint_every_s: float = 10.0
    # franka: the actors drive a real arm, whose state is proprioception only (the first 9
    # entries of env.name's state); no base policy here (the server's chunk size is
    # chunk_size), no scripted demos, no evaluation in sim
    robot: str = "sim"
    chunk_size: int = 16  # robot=franka: the served policy's chunk size H


@dataclass
class LaunchConfig:
    """``arli launch sim``: server + learner + N sim actors on this machine."""

    actors: int = 2
    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = "checkpoints/base_${env.name}"  # base policy served (trained first if missing)
    env_steps: int = 5000
    min_latency_s: float = 0.16  # server reply padding: d = 4 at dt = 0.05 (margin for compute)
    base_port: int = 5555
    output_dir: str = "outputs/launch"
    extra_learner: list[str] = field(default_factory=list)  # more overrides for the learner
    extra_actor: list[str] = field(default_factory=list)  # more overrides for every actor
    record_root: str = ""  # record each actor's episodes into <record_root>/<actor_id>


@dataclass
class KeysConfig:
    """``arli keys``: CurveZMQ key pairs for servers and clients."""

    dir: str = "keys"
    clients: int = 1


def validate_transport(cfg: TransportConfig) -> None:
    for name in ("server", "learner", "weights"):
        value = getattr(cfg, name)
        _require(value.startswith(("tcp://", "ipc://", "inproc://")), f"transport.{name}",
                 "a ZeroMQ address like tcp://host:port", value)


def validate_serve(cfg: ServeConfig) -> None:
    validate_env(cfg.env)
    validate_transport(cfg.transport)
    _require(cfg.min_latency_s >= 0, "min_latency_s", ">= 0", cfg.min_latency_s)


def validate_actor(cfg: ActorConfig) -> None:
    validate_env(cfg.env)
    validate_robot_side(cfg)
    validate_transport(cfg.transport)
    _require(cfg.strategy in ("naive", "blend", "rtc"), "strategy", "one of naive, blend, rtc", cfg.strategy)
    _require(cfg.planned_delay_steps >= 0, "planned_delay_steps", ">= 0", cfg.planned_delay_steps)
    _require(0 <= cfg.min_delay_steps <= cfg.planned_delay_steps, "min_delay_steps",
             f"in [0, planned_delay_steps={cfg.planned_delay_steps}]", cfg.min_delay_steps)
    _require(cfg.execute_horizon >= 1, "execute_horizon", ">= 1", cfg.execute_horizon)


def validate_learner_service(cfg: LearnerServiceConfig) -> None:
    validate_finetune(cfg)
    validate_transport(cfg.transport)
    _require(cfg.publish_every >= 1, "publish_every", ">= 1", cfg.publish_every)
    _require(cfg.robot in ROBOTS, "robot", f"one of {ROBOTS}", cfg.robot)
    if cfg.robot == "franka":
        _require(cfg.anchor_episodes == 0, "anchor_episodes",
                 "0 with robot=franka (no scripted expert on a real arm; pass recorded datasets=[...])",
                 cfg.anchor_episodes)
        _require(cfg.regime == "rl", "regime", "rl with robot=franka (the person intervenes at the actor: "
                 "device=...)", cfg.regime)
        _require(cfg.chunk_size >= 2, "chunk_size", ">= 2 (the served policy's H)", cfg.chunk_size)


def validate_launch(cfg: LaunchConfig) -> None:
    validate_env(cfg.env)
    _require(cfg.actors >= 1, "actors", ">= 1", cfg.actors)
    _require(cfg.env_steps >= 100, "env_steps", ">= 100", cfg.env_steps)


def validate_keys(cfg: KeysConfig) -> None:
    _require(cfg.clients >= 1, "clients", ">= 1", cfg.clients)


SCHEMAS.update({
    "serve": (ServeConfig, validate_serve),
    "actor": (ActorConfig, validate_actor),
    "learner": (LearnerServiceConfig, validate_learner_service),
    "launch": (LaunchConfig, validate_launch),
    "keys": (KeysConfig, validate_keys),
})


@dataclass
class BenchTransportConfig:
    """``arli bench transport``: our ZeroMQ path vs LeRobot's gRPC path, same stub."""

    requests: int = 500
    warmup: int = 50
    compute_ms: float = 5.0
    stub_compute: str = "wait"  # wait (a GPU-bound model's host thread) | spin (a busy CPU core)
    json: bool = False
    report_dir: str = "reports"


def validate_bench_transport(cfg: BenchTransportConfig) -> None:
    _require(cfg.requests >= 10, "requests", ">= 10", cfg.requests)
    _require(cfg.warmup >= 0, "warmup", ">= 0", cfg.warmup)
    _require(cfg.compute_ms >= 0, "compute_ms", ">= 0", cfg.compute_ms)
    _require(cfg.stub_compute in ("wait", "spin"), "stub_compute", "wait or spin", cfg.stub_compute)


SCHEMAS["bench_transport"] = (BenchTransportConfig, validate_bench_transport)


@dataclass
class BenchRuntimeConfig:
    """``arli bench runtime``: control-loop timing error and residual latency at 20 Hz."""

    env: EnvConfig = field(default_factory=EnvConfig)
    steps: int = 2000
    compute_ms: float = 20.0  # stub policy compute
    min_latency_s: float = 0.2  # replies padded: requests in flight half the time
    spin_s: float = 0.002  # the loop spins (instead of sleeping) this long before each tick
    json: bool = False
    report_dir: str = "reports"


def validate_bench_runtime(cfg: BenchRuntimeConfig) -> None:
    validate_env(cfg.env)
    _require(cfg.steps >= 100, "steps", ">= 100", cfg.steps)
    _require(cfg.min_latency_s >= 0 and cfg.compute_ms >= 0, "min_latency_s/compute_ms", ">= 0",
             (cfg.min_latency_s, cfg.compute_ms))


SCHEMAS["bench_runtime"] = (BenchRuntimeConfig, validate_bench_runtime)


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


def validate_bench_pipeline(cfg: BenchPipelineConfig) -> None:
    validate_env(cfg.env)
    _require(cfg.env_steps >= 100, "env_steps", ">= 100", cfg.env_steps)
    _require(cfg.actors >= 1, "actors", ">= 1", cfg.actors)


SCHEMAS["bench_pipeline"] = (BenchPipelineConfig, validate_bench_pipeline)


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


def validate_bench_interventions(cfg: BenchInterventionsConfig) -> None:
    validate_env(cfg.env)
    _require(cfg.env_steps >= 100, "env_steps", ">= 100", cfg.env_steps)
    _require(cfg.window >= 1, "window", ">= 1", cfg.window)


SCHEMAS["bench_interventions"] = (BenchInterventionsConfig, validate_bench_interventions)


@dataclass
class BenchAnchorStartConfig:
    """``arli bench anchor-start``: the anchor-pretrained start's success (no online step)
    against the pretraining's learning rate and number of updates."""

    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: str = "checkpoints/base_${env.name}"
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)  # the base, if it must be trained
    run: RunSpec = field(default_factory=RunSpec)  # anchor data and learner settings
    # the defaults are reports/anchor_start.md's settings (about 10 min on 2 cores)
    delay_steps: list[int] = field(default_factory=lambda: [4])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    pretrain_lrs: list[float] = field(default_factory=lambda: [1e-3, 1e-4])
    updates: list[int] = field(default_factory=lambda: [0, 1000, 2000])
    eval_episodes: int = 100  # per point, on the latency sweep's evaluation seeds
    workers: int = 2  # (delay, seed) pairs run in parallel processes
    json: bool = False
    report_dir: str = "reports"


def validate_bench_anchor_start(cfg: BenchAnchorStartConfig) -> None:
    validate_env(cfg.env)
    validate_pretrain(cfg.pretrain)
    validate_run(cfg.run)
    _require(len(cfg.seeds) >= 1, "seeds", "a non-empty list", cfg.seeds)
    _require(len(cfg.delay_steps) >= 1 and all(d >= 0 for d in cfg.delay_steps), "delay_steps",
             "a non-empty list of integers >= 0", cfg.delay_steps)
    _require(len(cfg.pretrain_lrs) >= 1 and all(lr > 0 for lr in cfg.pretrain_lrs), "pretrain_lrs",
             "a non-empty list of learning rates > 0", cfg.pretrain_lrs)
    _require(len(cfg.updates) >= 1 and all(u >= 0 for u in cfg.updates), "updates",
             "a non-empty list of update counts >= 0", cfg.updates)
    _require(cfg.eval_episodes >= 1, "eval_episodes", ">= 1", cfg.eval_episodes)
    _require(cfg.workers >= 1, "workers", ">= 1", cfg.workers)


SCHEMAS["bench_anchor_start"] = (BenchAnchorStartConfig, validate_bench_anchor_start)
