"""``arli serve`` / ``arli learner`` / ``arli actor`` / ``arli launch sim`` / ``arli keys``."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import numpy as np

from arli.config import ActorConfig, KeysConfig, LaunchConfig, LearnerServiceConfig, ServeConfig
from arli.transport.zmq_io import bind_address, generate_keys


ACTOR_FLUSH_S = 15.0  # an actor's last wait for the learner's acknowledgements of what it sent


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve_main(cfg: ServeConfig) -> int:
    from arli.compute import resolve_device  # noqa: PLC0415
    from arli.pretrain import ensure_base_policy  # noqa: PLC0415
    from arli.policies.load import load_base_policy  # noqa: PLC0415
    from arli.runtime.server import InferenceServer  # noqa: PLC0415
    from sim_envs import make_env, task_name  # noqa: PLC0415

    _logging()
    device = resolve_device(cfg.device)  # first: a missing CUDA fails before any base is trained
    name = task_name(cfg.env.name)
    ensure_base_policy(cfg.checkpoint, cfg.pretrain, cfg.env)
    instruction = make_env(name).unwrapped.instruction
    policy = load_base_policy(cfg.checkpoint, instruction, name, cfg.pretrain.policy.chunk_size, device=device)
    server = InferenceServer(policy, bind_address(cfg.transport.server),
                             {"dt": cfg.env.dt, "task": name, "device": device}, cfg.min_latency_s,
                             cfg.transport.curve, int(cfg.max_message_mb * 2**20), cfg.max_batch,
                             cfg.batch_wait_ms / 1000)
    batching = f"batches up to {server.max_batch}" if server.batching else "one request at a time"
    print(f"arli serve: {type(policy).__name__} from {cfg.checkpoint} on {bind_address(cfg.transport.server)}"
          f" ({device}, {batching}, min latency {cfg.min_latency_s * 1000:.0f} ms)", flush=True)
    try:
        server.serve(_stop_on_signals(), cfg.max_seconds or None)
    finally:
        server.close()
    return 0


def learner_main(cfg: LearnerServiceConfig) -> int:
    from arli.runs import make_finetuner  # noqa: PLC0415
    from arli.runtime.learner_service import LearnerService  # noqa: PLC0415

    _logging()
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)  # share the machine with the actors and the server
    ft, name, delay = make_finetuner(cfg)
    print(f"arli learner: {name}, d={delay}, updates on {ft.learner.device}", flush=True)
    run_dir = cfg.output_dir or os.path.join("outputs", f"learner_{name}")
    os.makedirs(run_dir, exist_ok=True)
    meta, norm = ft.residual_definition()
    service = LearnerService(ft.trainer, meta, norm, ft.save, ft.load, bind_address(cfg.transport.learner),
                             bind_address(cfg.transport.weights), os.path.join(run_dir, "checkpoint"),
                             cfg.run.env_steps, cfg.transport.curve, cfg.publish_every, cfg.checkpoint_every_s)
    if service.load():
        print(f"arli learner: resumed {run_dir}/checkpoint at env step {service.env_steps}", flush=True)
    else:
        prep = ft.prepare()
        guard = prep.get("start_guard")
        print(f"arli learner: {prep['anchor_transitions']} anchor transitions, pretrain loss "
              f"{prep['pretrain_loss']:.4f}" + (f"; start guard: anchored start {guard['start']:.2f} vs base "
                                               f"{guard['base']:.2f} on tune episodes"
                                               + (" -> dropped, the base acts" if guard["reverted"] else "")
                                               if guard else ""), flush=True)
        service.save()
    service.publish()
    last = [time.perf_counter()]

    def progress(svc) -> None:
        if time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            recent = [e["success"] for e in svc.episodes[-20:]]
            print(f"env steps {svc.env_steps}/{cfg.run.env_steps} updates {ft.learner.updates} "
                  f"episodes {len(svc.episodes)} success(20) {np.mean(recent) if recent else 0:.2f} "
                  f"actors {sorted(svc.applied)}", flush=True)

    from arli.rl.learner import LearnerDiverged  # noqa: PLC0415

    stop = _stop_on_signals()
    try:
        service.run(progress=progress, stop=stop)
    except LearnerDiverged as exc:  # restarting from the same checkpoint would diverge again
        print(f"arli learner: stopped: {exc}", file=sys.stderr, flush=True)
        return LearnerDiverged.exit_code
    finally:
        service.close()
    record = {"env": name, "robot": cfg.robot, "variant": cfg.run.variant, "delay_steps": delay,
              "finished": not stop.is_set(), "env_steps": service.env_steps, "updates": ft.learner.updates,
              "start_guard": ft.start_record.get("start_guard"),  # checkpointed: a resumed learner's too
              "actors": sorted(service.applied), "received_rows": service.received_rows,
              "episodes": service.episodes, "duplicates_ignored": service.duplicates,
              "lost_rows": service.lost_rows, "rejected_rows": service.rejected_rows}
    if stop.is_set() or cfg.robot != "sim":  # a real arm's learner has nothing to evaluate in sim
        _write_summary(run_dir, record)
        state = "stopped" if stop.is_set() else "done"
        lost = sum(service.lost_rows.values())
        print(f"arli learner: {state} at env step {service.env_steps}, {len(service.episodes)} episodes from "
              f"{len(service.applied)} actors" + (f", {lost} rows lost to full actor spools" if lost else "")
              + f"; checkpoint in {run_dir}/checkpoint, summary in {run_dir}/summary.json"
              + (" (start the same command again to resume)" if stop.is_set() else ""), flush=True)
        return 0
    final = ft.evaluate_test()
    _write_summary(run_dir, {
        **record, "finetuned_success": final["success"],
        # the test evaluation's (the actors' episodes run in their own processes)
        "sim_unstable_episodes": {"test_final": final["sim_unstable_episodes"]},
        "eval": {"split": "test", "seed_base": cfg.run.test_seed, "episodes": cfg.run.test_episodes},
        "outcomes": final["outcomes"]})
    print(f"arli learner: done at env step {service.env_steps}; final eval (sim time, d={delay}) "
          f"success {final['success']:.2f} over {cfg.run.test_episodes} test episodes -> {run_dir}/summary.json")
    return 0


def _write_summary(run_dir: str, summary: dict) -> None:
    """The learner's ``summary.json``, written whole or not at all (a reader never sees half)."""
    path = os.path.join(run_dir, "summary.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(path + ".tmp", path)


def actor_main(cfg: ActorConfig) -> int:
    from arli.policies.residual_np import GATE_PICKS  # noqa: PLC0415
    from arli.runtime.actor import run_actor  # noqa: PLC0415
    from arli.runtime.link import LearnerLink  # noqa: PLC0415
    from sim_envs import make_env, task_name  # noqa: PLC0415

    _logging()
    # on the sim the task renders env.cameras (env.image_size > 0) as a robot's cameras would
    render = cfg.env.render_kwargs() if cfg.robot == "sim" else {}
    env = make_env(task_name(cfg.env.name), dt=cfg.env.dt, max_episode_steps=cfg.env.max_episode_steps, **render)
    driver = make_driver(cfg, env)
    instruction = cfg.task or env.unwrapped.instruction
    curve = cfg.transport.curve
    inference, served = make_inference(cfg, driver, instruction)
    link = LearnerLink(cfg.actor_id, cfg.transport.learner, cfg.transport.weights, curve).start()
    print(f"arli actor {cfg.actor_id}: server {served} (H={inference.chunk_size}), learner {cfg.transport.learner}",
          flush=True)
    os.makedirs(cfg.output_dir, exist_ok=True)
    # episode seeds outside the tune (10_000..) and test (5_000_000..) seeds, 10_000 apart per
    # actor (this run's training episodes); a stable hash of the actor id keeps them
    # reproducible across restarts
    base_seed = 200_000 + 10_000 * (zlib.crc32(cfg.actor_id.encode()) % 50) + 1000 * cfg.seed

    def on_episode(stats, result, ctl) -> None:
        print(f"{cfg.actor_id} episode {stats.episodes}: success {int(result.success)} steps {result.steps} "
              f"delays {sorted(set(result.delays))} spikes {result.spikes} weights v{ctl.version}", flush=True)

    stop = _stop_on_signals()
    seeds = (base_seed + i for i in range(10**6) if not stop.is_set())
    recording = Recording(cfg, env, driver, instruction)
    try:
        stats, ctl = run_actor(driver, inference, link, cfg.chunking, seeds, cfg.weights_timeout_s,
                               cfg.max_episodes or None, on_episode, cfg.seed, cfg.spin_s,
                               intervention=person_intervention(cfg.device), wrap=recording.wrap)
        flushed = link.finish(timeout_s=ACTOR_FLUSH_S)
    finally:
        recording.close()
        driver.close()
        link.close()
        inference.save_trace(os.path.join(cfg.output_dir, "latency_trace.json"))
        inference.close()
    residual = np.asarray(ctl.residual_s) * 1000
    out = {"actor_id": cfg.actor_id, **vars(stats), "flushed": flushed, "dropped_rows": link.dropped_rows,
           "dropped_episodes": link.dropped_episodes,
           "latency_ms": {q: float(np.percentile(np.asarray(inference.latencies) * 1000, p))
                          for q, p in (("p50", 50), ("p99", 99))} if inference.latencies else {},
           "residual_p99_ms": float(np.percentile(residual, 99)) if len(residual) else None,
           # value gating on the robot: steps the critic chose the action, those it overruled r on, and its picks
           "gated_steps": ctl.policy.gated_steps, "overruled_steps": ctl.policy.overruled_steps,
           "gate_picks": dict(zip(GATE_PICKS, ctl.policy.gate_picks.tolist()))}
    with open(os.path.join(cfg.output_dir, "stats.json"), "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
    print(f"arli actor {cfg.actor_id}: {stats.episodes} episodes, success {stats.successes}/{stats.episodes}; "
          f"latency trace in {cfg.output_dir}/latency_trace.json", flush=True)
    return 0


def make_inference(cfg: ActorConfig, driver, instruction: str):
    """The base's inference endpoint, connected: ``arli serve`` over ZeroMQ (``inference=arli``)
    or an openpi policy server over WebSocket (``inference=openpi``). Returns it and what serves."""
    if cfg.inference == "openpi":
        from arli.transport.openpi_endpoint import OpenPIInference  # noqa: PLC0415

        openpi = OpenPIInference(cfg.openpi, driver.dt, driver.state_dim, driver.action_dim,
                                 cfg.chunking.planned_delay_steps, instruction=instruction)
        openpi.connect()
        return openpi, f"openpi at {cfg.openpi.uri}"
    from arli.transport.inference_client import RemoteInference  # noqa: PLC0415

    inference = RemoteInference(cfg.transport.server, driver.dt, cfg.transport.curve, cfg.chunking.planned_delay_steps,
                                instruction=instruction)
    meta = inference.connect(timeout_s=120)
    return inference, str(meta["policy"])


def make_driver(cfg: ActorConfig, env):
    """The robot the actor drives: the sim task on a real clock, or a Franka through franky
    (with its cameras)."""
    if cfg.robot == "sim":
        from robot_drivers.sim import SimDriver  # noqa: PLC0415

        return SimDriver(env, now=time.perf_counter)
    from robot_drivers.camera import Camera  # noqa: PLC0415
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    size = (cfg.camera_size, cfg.camera_size)
    cameras = {name: Camera(int(src) if str(src).isdigit() else src, name, size).start()
               for name, src in cfg.cameras.items()}
    return FrankaDriver(cfg.franka, cameras=cameras, now=time.perf_counter, dt=cfg.env.dt)


def person_intervention(device_name: str):
    """A person's device as the intervener (None for ``device=none``): it watches every
    episode and takes over whenever the operator does."""
    from arli.rl.config import InterventionSpec  # noqa: PLC0415
    from arli.runtime.intervention import Intervention  # noqa: PLC0415
    from robot_drivers.teleop import open_device  # noqa: PLC0415

    device = open_device(device_name)
    if device is None:
        return None
    print(f"intervention device {device.name}: {device.status}", flush=True)
    return Intervention(None, InterventionSpec(prob=1.0, mode="corrective"), device)


class Recording:
    """``record_root`` set: every actor episode goes into a crash-safe LeRobotDataset
    (appending to it when it exists), built once the residual's state size is known."""

    def __init__(self, cfg: ActorConfig, env, driver, instruction: str):
        self.cfg, self.env, self.driver, self.instruction = cfg, env, driver, instruction
        self.recorder = None

    def wrap(self, ctl):
        if not self.cfg.record_root:
            return ctl
        from arli.record import EpisodeRecorder  # noqa: PLC0415
        from arli.runtime.recording import RecordingController, intervention_features  # noqa: PLC0415
        from sim_envs.base import ACTION_NAMES, PROPRIO_DIM, PROPRIO_NAMES  # noqa: PLC0415

        names = list(getattr(self.env.unwrapped, "state_names", PROPRIO_NAMES))[: self.driver.state_dim]
        size = self.cfg.camera_size if self.cfg.robot == "franka" else self.cfg.env.image_size
        camera_names = list(self.cfg.cameras) if self.cfg.robot == "franka" else list(self.cfg.env.cameras)
        cams = {name: (size, size) for name in camera_names} if size else {}
        features = intervention_features(PROPRIO_NAMES, names[PROPRIO_DIM:], ACTION_NAMES, ctl.builder.dim, cams)
        root = self.cfg.record_root
        self.recorder = EpisodeRecorder(root, int(round(1 / self.driver.dt)), features,
                                        resume=os.path.isdir(root) and bool(os.listdir(root)),
                                        use_videos=bool(cams))
        print(f"recording every episode into {root} ({self.recorder.total_episodes} there already)", flush=True)
        return RecordingController(ctl, self.recorder, self.instruction, PROPRIO_DIM, driver=self.driver)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


def launch_commands(cfg: LaunchConfig) -> dict[str, list[str]]:
    """The processes of ``arli launch sim``: name -> argv."""
    p = cfg.base_port
    transport = [f"transport.server=tcp://127.0.0.1:{p}", f"transport.learner=tcp://127.0.0.1:{p + 1}",
                 f"transport.weights=tcp://127.0.0.1:{p + 2}"]
    env = [f"env={cfg.env.name}"] if cfg.env.name else []
    arli = [sys.executable, "-m", "arli.cli"]
    d_min = int(np.ceil(cfg.min_latency_s / cfg.env.dt - 1e-9))
    cmds = {
        "serve": arli + ["serve", *env, f"checkpoint={cfg.checkpoint}", f"min_latency_s={cfg.min_latency_s}",
                         *transport, *cfg.extra_server],
        "learner": arli + ["learner", *env, f"checkpoint={cfg.checkpoint}", f"run.env_steps={cfg.env_steps}",
                           f"delay_steps={d_min}",
                           f"output_dir={cfg.output_dir}/learner", *transport, *cfg.extra_learner],
    }
    for i in range(cfg.actors):
        cmds[f"actor{i}"] = arli + ["actor", *env, f"actor_id=actor{i}", f"seed={i}",
                                    f"chunking.planned_delay_steps={d_min}", f"chunking.min_delay_steps={d_min}",
                                    f"output_dir={cfg.output_dir}/actor{i}", *transport, *cfg.extra_actor]
        if cfg.record_root:
            cmds[f"actor{i}"].append(f"record_root={cfg.record_root}/actor{i}")
    return cmds


ACTORLESS_GRACE_S = 900.0  # the learner's final evaluation may run this long after its actors stopped
ACTOR_WAIT_S = 60.0  # for the actors to stop on their own once the learner is done
# an actor asked to stop: its episode ends, then its flush and the recording close
ACTOR_STOP_GRACE_S = ACTOR_FLUSH_S + 45.0
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)  # wait before the n-th restart of a process (then the last)


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Until every process of ``procs`` has exited or ``timeout_s`` has passed (one deadline for all)."""
    deadline = time.perf_counter() + timeout_s
    while any(p.poll() is None for p in procs) and time.perf_counter() < deadline:
        time.sleep(0.2)


def launch_main(cfg: LaunchConfig) -> int:
    """Start server, learner and actors; supervise the server and the learner (a process that
    dies is restarted, at most ``cfg.restarts`` times each, and resumes from its checkpoint);
    wait for the learner to finish; stop the rest."""
    from arli.config import PretrainConfig  # noqa: PLC0415
    from arli.pretrain import ensure_base_policy  # noqa: PLC0415
    from arli.rl.learner import LearnerDiverged  # noqa: PLC0415

    diverged = LearnerDiverged.exit_code
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a script's background job ignores SIGINT, and an ignored signal stays ignored across
        # exec: the processes would not stop when asked to below. A handler does not carry over
        # (the children start with SIGINT at its default, as from a terminal)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.makedirs(cfg.output_dir, exist_ok=True)
    ensure_base_policy(cfg.checkpoint, PretrainConfig(env=cfg.env), cfg.env)  # once, not in two processes
    procs: dict[str, subprocess.Popen] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = launch_commands(cfg)

    def start(name: str, mode: str = "w") -> None:
        with open(os.path.join(cfg.output_dir, f"{name}.log"), mode, encoding="utf-8") as log:
            procs[name] = subprocess.Popen(commands[name], stdout=log, stderr=subprocess.STDOUT, env=env)
        print(f"started {name} (pid {procs[name].pid}): logs in {cfg.output_dir}/{name}.log", flush=True)

    try:
        for name in commands:
            start(name)
        restarts = {"serve": 0, "learner": 0}
        actors_gone = None  # when every actor had stopped (the learner may still be evaluating)
        while procs["learner"].poll() != 0:
            for name in restarts:
                code = procs[name].poll()
                if code is None:
                    continue
                if code == 2:  # a config or input error: the same command fails the same way again
                    print(f"arli launch: {name} refused its settings (see {cfg.output_dir}/{name}.log)", flush=True)
                    return 2
                if name == "learner" and code == diverged:  # its checkpoint would diverge the same way
                    print(f"arli launch: the learner's critic diverged; not restarted (see "
                          f"{cfg.output_dir}/learner.log; its last good checkpoint is kept)", flush=True)
                    return diverged
                if restarts[name] >= cfg.restarts:
                    print(f"arli launch: {name} exited with {code} after {restarts[name]} restarts; giving up",
                          flush=True)
                    return 1
                wait = RESTART_BACKOFF_S[min(restarts[name], len(RESTART_BACKOFF_S) - 1)]
                restarts[name] += 1
                print(f"arli launch: {name} exited with {code}; restarting it in {wait:.0f} s "
                      f"({restarts[name]}/{cfg.restarts})", flush=True)
                time.sleep(wait)  # a process that dies at once is not restarted in a tight loop
                start(name, "a")
            if all(p.poll() is not None for n, p in procs.items() if n.startswith("actor")):
                actors_gone = actors_gone or time.perf_counter()
                if time.perf_counter() - actors_gone > ACTORLESS_GRACE_S:
                    print(f"arli launch: every actor stopped {ACTORLESS_GRACE_S:.0f} s ago and the learner is not "
                          "done (see the actor logs)", flush=True)
                    return 1
            time.sleep(0.5)
        actors = [p for n, p in procs.items() if n.startswith("actor")]
        _wait_all(actors, ACTOR_WAIT_S)
        for proc in actors:  # never heard the learner is done (its link was away): asked to stop, each ends
            if proc.poll() is None:  # its episode, flushes, closes its recording and writes its stats
                proc.terminate()
        _wait_all(actors, ACTOR_STOP_GRACE_S)  # those still running are killed below
        return 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()  # reaped: no process of the run outlives launch, not even as a zombie


def keys_main(cfg: KeysConfig) -> int:
    written = generate_keys(cfg.dir, cfg.clients)
    print(f"wrote {len(written)} key files to {cfg.dir}/ (server.key*, client*.key*, authorized/); "
          "copy the public keys where they are needed and keep *.key_secret private")
    return 0
