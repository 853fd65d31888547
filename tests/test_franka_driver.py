"""The Franka driver against franky-sim: a MuJoCo Franka behind the real libfranka protocol
(TCP commands + 1 kHz UDP state), driven through franky exactly as a real arm would be."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from arli.runtime.clock import MonotonicClock
from robot_drivers.base import RobotFault
from robot_drivers.franka.config import FrankaConfig
from robot_drivers.franka.safety import TargetIntegrator
from process_utils import franky_sim_server, serving_in_thread

pytest.importorskip("franky")
pytest.importorskip("franky_sim")


def _host(n: int) -> str:
    return f"127.0.{os.getpid() % 250 + 1}.{n}"


def _cfg(host: str, **kw) -> FrankaConfig:
    base = dict(hostname=host, realtime=False, home_dynamics_factor=0.6,
                relative_dynamics_factor=0.3, retry_backoff_s=0.2, max_episode_steps=400)
    base.update(kw)
    return FrankaConfig(**base)


class RecordingFranky:
    """The real franky module, with every Cartesian target that reaches ``Robot.move`` kept."""

    def __init__(self):
        import franky  # noqa: PLC0415

        self._franky = franky
        self.sent: list[np.ndarray] = []
        outer = self

        class Robot(franky.Robot):
            def move(self, motion, asynchronous=False):
                if isinstance(motion, franky.CartesianMotion):
                    outer.sent.append(np.asarray(motion.target.pose.end_effector_pose.translation))
                return super().move(motion, asynchronous=asynchronous)

        self.Robot = Robot

    def __getattr__(self, name):
        return getattr(self._franky, name)


def _stream(driver, actions, clock=None):
    clock = clock or MonotonicClock(driver.dt)
    clock.start()
    out = []
    for t, a in enumerate(actions):
        clock.wait(t)
        out.append(driver.act(np.asarray(a, np.float32)))
    return out


def test_integrator_keeps_every_target_in_the_box_and_the_lead():
    cfg = FrankaConfig()
    integ = TargetIntegrator(cfg)
    rng = np.random.default_rng(0)
    integ.reset(np.array([0.5, 0.0, 0.3]))
    ee = np.array([0.5, 0.0, 0.3])
    for _ in range(500):
        target = integ.step(rng.uniform(-3, 3, 5), ee)  # out-of-range actions are clipped
        assert np.all(target.position >= np.array(cfg.workspace_low) - 1e-12)
        assert np.all(target.position <= np.array(cfg.workspace_high) + 1e-12)
        assert np.all(np.abs(target.position - ee) <= cfg.max_lead + 1e-12)
        ee = ee + 0.5 * (target.position - ee)  # a hand that lags
    with pytest.raises(ValueError, match="NaN"):
        integ.step(np.array([np.nan, 0, 0, 0, 0]), ee)
    with pytest.raises(ValueError, match="shape"):
        integ.step(np.zeros(4), ee)


@pytest.mark.slow
def test_connect_home_stream_20hz_and_reach_the_trajectory():
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    with franky_sim_server(_host(1)):
        driver = FrankaDriver(_cfg(_host(1)))
        try:
            obs = driver.reset()
            q = np.asarray(driver.robot.current_joint_state.position)
            assert np.allclose(q, driver.cfg.home_q, atol=0.02), q
            assert obs.state.shape == (9,) and abs(obs.state[4] - 1.0) < 1e-3  # yaw 0 at home
            start = obs.state[:3].copy()
            # A square in x/y while descending (grasping on the way), at 20 Hz, then hold.
            plan = [[0.5, 0, -0.2, 0, -1]] * 15 + [[0, 0.5, 0, 0.1, 1]] * 15 + [[0, 0, 0, 0, -1]] * 20
            results = _stream(driver, plan)
            expected = start + driver.cfg.max_step_pos * np.array([7.5, 7.5, -3.0])
            # The target follows the plan (the lead limit may trim a few mm while the arm
            # accelerates), and the arm reaches the target.
            assert np.allclose(driver.integrator.position, expected, atol=0.01)
            final = results[-1].observation
            assert np.linalg.norm(final.state[:3] - driver.integrator.position) < 0.005, final.state[:3]
            yaw = np.arctan2(final.state[3], final.state[4])
            assert abs(yaw - 15 * 0.1 * driver.cfg.max_step_yaw) < 0.02, yaw
            # Timestamps are capture times at the control ticks.
            stamps = np.array([r.observation.timestamp for r in results])
            assert np.all(np.diff(stamps) > 0) and abs(np.median(np.diff(stamps)) - 0.05) < 0.01
            # gripper commands (grasp at step 15, open at 30) never stall the 20 Hz stream
            assert np.diff(stamps).max() < 0.12, np.diff(stamps).max()
            assert driver.stats["faults"] == [] and driver.stats["sent"] == len(plan)
        finally:
            driver.close()


@pytest.mark.slow
def test_box_clipping_and_bad_actions_never_reach_franky():
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    fk = RecordingFranky()
    with franky_sim_server(_host(2)):
        driver = FrankaDriver(_cfg(_host(2), workspace_high=[0.70, 0.30, 0.55]), franky_module=fk)
        try:
            driver.reset()
            _stream(driver, [[0, 0, 1, 0, -1]] * 40 + [[0, 0, 0, 0, -1]] * 10)  # straight up, 0.8 m asked
            sent = np.array(fk.sent)
            assert sent[:, 2].max() <= 0.55 + 1e-9
            z = driver.observe().state[2]
            assert 0.54 < z < 0.555, z  # it went up to the lid and stopped there
            n = len(fk.sent)
            for bad in ([np.nan, 0, 0, 0, 0], [0, np.inf, 0, 0, 0], [0, 0, 0, 0]):
                with pytest.raises(ValueError):
                    driver.act(np.asarray(bad, np.float32))
            assert len(fk.sent) == n  # nothing was sent for them
        finally:
            driver.close()


@pytest.mark.slow
def test_watchdog_stops_the_arm_when_actions_stop():
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    with franky_sim_server(_host(3)):
        driver = FrankaDriver(_cfg(_host(3), relative_dynamics_factor=0.02, max_step_pos=0.04,
                                   max_lead=0.04, watchdog_s=0.1))
        try:
            start = driver.reset().state[:3]
            # a UDP timeout while homing is the simulator starved of CPU (the driver reconnects);
            # what this test pins is that the watchdog's stop is not a fault
            faults_at_reset = len(driver.stats["faults"])
            driver.act(np.array([1, 0, 0, 0, -1], np.float32))  # 4 cm, slowly, then silence
            time.sleep(1.5)
            moved = driver.observe().state[0] - start[0]
            assert driver.stats["watchdog_stops"] == 1
            assert moved < 0.03, moved  # stopped short of the 4 cm target
            driver.act(np.array([0, 0, 0, 0, -1], np.float32))  # and it takes commands again
            assert driver.stats["faults"][faults_at_reset:] == []
            assert all(f["network"] for f in driver.stats["faults"][:faults_at_reset])  # only a timeout while homing
        finally:
            driver.close()


@pytest.mark.slow
def test_recovers_after_an_induced_communication_fault():
    """The server stalls for 2.5 s mid-stream (SIGSTOP): libfranka times out; the driver
    reconnects and the stream carries on to the same trajectory."""
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    with franky_sim_server(_host(4)) as server:
        driver = FrankaDriver(_cfg(_host(4)))
        try:
            start = driver.reset().state[:3]
            _stream(driver, [[0.5, 0, 0, 0, -1]] * 10)
            os.kill(server.pid, signal.SIGSTOP)
            time.sleep(2.5)
            os.kill(server.pid, signal.SIGCONT)
            before = driver.integrator.position.copy()
            _stream(driver, [[0.5, 0, 0, 0, -1]] * 25 + [[0, 0, 0, 0, -1]] * 20)
            assert driver.stats["reconnects"] >= 1
            assert any(f["network"] for f in driver.stats["faults"])
            # Streaming resumed: the target moved on (the lead limit trims what the arm could
            # not follow while reconnecting) and the arm reached it.
            assert driver.integrator.position[0] - before[0] > 0.15
            assert np.linalg.norm(driver.observe().state[:3] - driver.integrator.position) < 0.005
            assert driver.observe().state[0] - start[0] > 0.2
        finally:
            driver.close()


@pytest.mark.slow
def test_server_gone_ends_in_a_clear_fault_within_bounded_time():
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    with franky_sim_server(_host(5)) as server:
        driver = FrankaDriver(_cfg(_host(5), max_recoveries=2))
        driver.reset()
        _stream(driver, [[0.3, 0, 0, 0, -1]] * 5)
        server.kill()
        server.wait()
        t0 = time.monotonic()
        with pytest.raises(RobotFault, match=_host(5).replace(".", r"\.")):
            _stream(driver, [[0.3, 0, 0, 0, -1]] * 200)
        assert time.monotonic() - t0 < 15
        driver.close()


def test_unreachable_robot_is_a_one_line_fault():
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415

    with pytest.raises(RobotFault, match="cannot connect to the Franka at 127.0.0.250"):
        FrankaDriver(_cfg("127.0.0.250"))


@pytest.mark.slow
def test_lost_robot_ends_the_episode_cleanly_and_the_recording_keeps_it(tmp_path):
    """The runtime loop on a real clock with the Franka driver and the recorder: the robot
    connection dies mid-episode; the episode ends (no exception), and the dataset holds the
    complete first episode plus the steps of the second one up to the loss."""
    from arli.chunking import ChunkScheduler  # noqa: PLC0415
    from arli.latency import FixedLatency  # noqa: PLC0415
    from arli.policies.base import BasePolicy  # noqa: PLC0415
    from arli.record import EpisodeRecorder  # noqa: PLC0415
    from arli.chunking import gripper_hold  # noqa: PLC0415
    from arli.runtime.inference import SimInference  # noqa: PLC0415
    from arli.runtime.loop import StepController, run_episode  # noqa: PLC0415
    from arli.runtime.recording import RecordingController, intervention_features  # noqa: PLC0415
    from robot_drivers.franka.driver import FrankaDriver  # noqa: PLC0415
    from sim_envs.base import ACTION_NAMES, PROPRIO_NAMES  # noqa: PLC0415

    class Drift(BasePolicy):  # chunks that move the hand slowly along -y
        chunk_size, action_dim = 8, 5

        def infer(self, request):
            return np.tile(np.array([0, -0.2, 0, 0, -1], np.float32), (8, 1))

    class PullThePlug(StepController):  # the robot's server dies at step 8 of the 2nd episode
        episodes = 0

        def begin_episode(self):
            self.episodes += 1

        def act(self, t, obs, info):
            if self.episodes == 2 and t == 8:
                server.kill()
            return info.base_action

    with franky_sim_server(_host(6)) as server:
        driver = FrankaDriver(_cfg(_host(6), max_episode_steps=20, max_recoveries=1))
        features = intervention_features(PROPRIO_NAMES, (), ACTION_NAMES, 4)
        with EpisodeRecorder(tmp_path / "ds", 20, features) as recorder:
            rec = RecordingController(PullThePlug(), recorder, "drift", len(PROPRIO_NAMES), driver=driver)
            inference = SimInference(Drift(), FixedLatency(0.1), np.random.default_rng(0), driver.dt)
            scheduler = ChunkScheduler(8, 4, 5, "async", "naive", 2, hold=gripper_hold(5))
            first = run_episode(driver, inference, scheduler, MonotonicClock(driver.dt), 0, rec)
            assert first.steps == 20 and first.robot_fault == ""
            second = run_episode(driver, inference, scheduler, MonotonicClock(driver.dt), 1, rec)
        assert "Franka at" in second.robot_fault and 0 < second.steps < 20
        assert [s.frames for s in rec.summaries] == [20, second.steps]
        assert rec.summaries[1].saved and rec.summaries[1].reason == "robot fault"
        driver.close()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    ds = LeRobotDataset("arli/local", root=tmp_path / "ds")
    assert [int(n) for n in np.bincount(np.asarray(ds.hf_dataset["episode_index"]))] == [20, second.steps]
    done = np.asarray(ds.hf_dataset.with_format("numpy")["next.done"]).reshape(-1)
    assert done[19] and done[-1] and done.sum() == 2


class SeeingPolicy:
    """A base policy that keeps every request's camera frames (a real server still serves it)."""

    chunk_size, action_dim, n_obs_steps = 4, 5, 1

    def __init__(self):
        self.seen: list[dict[str, np.ndarray]] = []

    def infer(self, request):
        self.seen.append({k: v.copy() for k, v in request.observation.images.items()})
        return np.zeros((self.chunk_size, self.action_dim), np.float32)


def _video(path, colour: tuple[int, int, int], frames: int = 150) -> str:
    """A (48, 64) video of one RGB colour at 30 fps (OpenCV writes BGR)."""
    import cv2  # noqa: PLC0415

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (64, 48))
    for _ in range(frames):
        writer.write(np.full((48, 64, 3), colour[::-1], np.uint8))
    writer.release()
    return str(path)


def test_cameras_given_to_the_actor_reach_the_server_from_a_franka(tmp_path):
    """`arli actor robot=franka +cameras.<name>=<source> camera_size=S`: ``make_driver`` opens
    each source as a named camera of the Franka driver, its observations carry every frame at
    S x S, and the robot's client sends them by name to a real inference server, whose policy
    gets each camera's own frames."""
    import dataclasses  # noqa: PLC0415

    from arli.cli import compose  # noqa: PLC0415
    from arli.commands.pipeline import make_driver  # noqa: PLC0415
    from arli.transport.inference_client import RemoteInference  # noqa: PLC0415
    from arli.types import ChunkRequest  # noqa: PLC0415

    sources = {"front": _video(tmp_path / "front.avi", (200, 30, 30)),
               "wrist": _video(tmp_path / "wrist.avi", (30, 30, 200))}
    # the command line's overrides, composed as `arli actor` composes them; the franky-sim
    # connection settings of this file's other tests
    cfg = compose("actor", ["robot=franka", *(f"+cameras.{name}={src}" for name, src in sources.items()),
                            "camera_size=32"])
    assert cfg.cameras == sources
    cfg = dataclasses.replace(cfg, franka=_cfg(_host(7)))
    policy = SeeingPolicy()
    with serving_in_thread(policy) as address, franky_sim_server(_host(7)):
        driver = make_driver(cfg, None)
        client = RemoteInference(address, dt=driver.dt)
        try:
            client.connect(timeout_s=10)
            driver.reset()
            deadline = time.monotonic() + 10
            obs = driver.observe()
            while sorted(obs.images) != ["front", "wrist"] and time.monotonic() < deadline:
                time.sleep(0.02)
                obs = driver.observe()
            assert client.submit(ChunkRequest(1, 0, obs, 0, None), [])
            replies = []
            while not replies and time.monotonic() < deadline:
                client.drain(0.1)
                replies = client.poll(0)
        finally:
            client.close()
            driver.close()
    assert replies and replies[0].actions.shape == (4, 5)
    (frames,) = policy.seen
    assert sorted(frames) == ["front", "wrist"]
    for name, (r, g, b) in {"front": (200, 30, 30), "wrist": (30, 30, 200)}.items():
        assert frames[name].shape == (32, 32, 3) and frames[name].dtype == np.uint8
        np.testing.assert_allclose(frames[name].reshape(-1, 3).mean(0), (r, g, b), atol=12)  # RGB, not BGR
