"""The inference server as a real process: handshake, chunks, error replies for every kind
of bad message (it keeps serving), CURVE authentication, and the robot holding within one
control period when the server dies, resuming when it returns."""

from __future__ import annotations

import signal
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from arli.chunking import ChunkScheduler
from arli.chunking import gripper_hold
from arli.runtime.clock import MonotonicClock
from arli.runtime.loop import StepController, run_episode
from arli.transport.codec import PROTOCOL_VERSION, decode, encode
from arli.transport.inference_client import RemoteInference
from arli.transport.zmq_io import CurveConfig, generate_keys
from robot_drivers.sim import SimDriver
from sim_envs import make_env
from process_utils import free_ports, running, serving_in_thread, spawn, stop

pytestmark = pytest.mark.timeout(180)


def serve_args(port: int, *extra: str) -> list[str]:
    return ["serve", "env=pick_cube", "checkpoint=expert", f"transport.server=tcp://127.0.0.1:{port}", *extra]


def infer(**over) -> bytes:
    fields = dict(request_id=7, t0=0, capture_ts=0.0, state=np.zeros(17, np.float32), delay_steps=0)
    fields.update(over)
    return encode("infer", **fields)


def ask(sock: zmq.Socket, frame: bytes, timeout_ms: int = 20_000):
    sock.send(frame)
    assert sock.poll(timeout_ms), "no reply"
    return decode(sock.recv())


def test_bad_messages_get_error_replies_and_the_server_keeps_serving(tmp_path):
    (port,) = free_ports(1)
    with running(serve_args(port, "max_message_mb=1"), tmp_path / "serve.log"):
        client = RemoteInference(f"tcp://127.0.0.1:{port}", dt=0.05)
        meta = client.connect(timeout_s=60)
        assert (meta["chunk_size"], meta["action_dim"], meta["protocol"]) == (16, 5, PROTOCOL_VERSION)
        assert meta["policy"] == "ExpertChunkPolicy" and meta["dt"] == 0.05
        client.close()
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port}")
        bad = {
            "malformed": b"\xc1 definitely not msgpack",
            "truncated": infer()[:-5],
            "too_large": infer(state=np.zeros(2**19, np.float32)),  # 2 MB > 1 MB limit
            "version": msgpack.packb({"v": 99, "kind": "ping", "sent": 0.0}),
            "unknown_kind": msgpack.packb({"v": PROTOCOL_VERSION, "kind": "shutdown"}),
            "schema": msgpack.packb({"v": PROTOCOL_VERSION, "kind": "infer", "request_id": "x"}),
            "policy": infer(state=np.zeros(2, np.float32)),  # the expert cannot read a 2-d state
        }
        expected_code = {"truncated": "malformed"}
        for name, frame in bad.items():
            reply = ask(sock, frame)
            assert reply.kind == "error", name
            assert reply["code"] == expected_code.get(name, name), (name, reply["message"])
        # still serving, and a good request gets a (H, m) chunk with server timing
        state = make_env("pick_cube").reset(seed=0)[0]["state"]
        reply = ask(sock, infer(state=state))
        assert reply.kind == "chunk" and reply["request_id"] == 7
        assert reply["actions"].shape == (16, 5) and np.all(np.abs(reply["actions"]) <= 1)
        assert reply["timing"]["compute_s"] > 0
        sock.close()


@pytest.mark.slow
def test_curve_refuses_clients_without_the_key(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(str(keys))
    (port,) = free_ports(1)
    address = f"tcp://127.0.0.1:{port}"
    with running(serve_args(port, "transport.curve.enabled=true", f"transport.curve.keys_dir={keys}"),
                 tmp_path / "serve.log"):
        good = RemoteInference(address, 0.05, CurveConfig(True, str(keys)))
        assert good.connect(timeout_s=60)["chunk_size"] == 16
        good.close()
        plain = RemoteInference(address, 0.05)  # no encryption at all
        with pytest.raises(TimeoutError):
            plain.connect(timeout_s=2)
        plain.close()
        stranger_keys = tmp_path / "stranger"
        generate_keys(str(stranger_keys))  # a valid key pair the server never authorised
        (stranger_keys / "server.key").write_bytes((keys / "server.key").read_bytes())
        stranger = RemoteInference(address, 0.05, CurveConfig(True, str(stranger_keys)))
        with pytest.raises(TimeoutError):
            stranger.connect(timeout_s=2)
        stranger.close()


class Recorder(StepController):
    def __init__(self, inference):
        self.inference, self.steps = inference, []

    def act(self, t, obs, info):
        self.steps.append((time.perf_counter(), info.starved, info.index_in_chunk))
        return info.base_action


@pytest.mark.slow
def test_robot_holds_within_one_period_when_the_server_dies_and_resumes(tmp_path):
    (port,) = free_ports(1)
    address = f"tcp://127.0.0.1:{port}"
    server = spawn(serve_args(port, "min_latency_s=0.1"), tmp_path / "serve1.log")
    try:
        inference = RemoteInference(address, 0.05, initial_delay_steps=2)
        inference.connect(timeout_s=60)
        env = make_env("pick_cube", max_episode_steps=600)
        driver = SimDriver(env, now=time.perf_counter)
        scheduler = ChunkScheduler(16, 8, 5, "async", "naive", 4, hold=gripper_hold(5))
        recorder = Recorder(inference)
        events: dict[str, float] = {}

        def chaos():
            time.sleep(0.6)  # mid-chunk
            server.send_signal(signal.SIGKILL)
            server.wait()  # reaped: its sockets are closed now (a big process takes a while to die)
            events["killed"] = time.perf_counter()
            time.sleep(0.5)
            events["restarted"] = time.perf_counter()
            events["proc"] = spawn(serve_args(port, "min_latency_s=0.1"), tmp_path / "serve2.log")

        thread = threading.Thread(target=chaos)
        thread.start()
        result = run_episode(driver, inference, scheduler, MonotonicClock(0.05), seed=0, controller=recorder)
        thread.join()
    finally:
        stop(server, signal.SIGKILL)
        if "proc" in events:
            stop(events["proc"])
    steps = recorder.steps
    before = [s for s in steps if s[0] < events["killed"]]
    assert any(not starved for _, starved, _ in before), "chunks were executing before the kill"
    # from one control period after the kill until the new server answers: hold, never a stale slot
    after = [s for s in steps if events["killed"] + 0.05 <= s[0] < events["restarted"]]
    assert after and all(starved for _, starved, _ in after)
    assert result.server_lost_steps >= len(after) - 1
    resumed = [s for s in steps if s[0] >= events["restarted"] and not s[1]]
    assert resumed, "execution resumed once the server was back"
    assert result.success


class FailingPolicy:
    """A base policy that cannot handle its input (a real server still serves it)."""

    chunk_size, action_dim, n_obs_steps = 16, 5, 1

    def infer(self, request):
        raise ValueError("this policy cannot read the state")


def test_a_policy_error_is_given_up_at_once_not_at_the_request_timeout():
    with serving_in_thread(FailingPolicy()) as address:
        inference = RemoteInference(address, 0.05, initial_delay_steps=2)
        inference.connect(timeout_s=10)
        env = make_env("pick_cube", max_episode_steps=60)
        sched = ChunkScheduler(16, 8, 5, "async", "naive", 4, hold=gripper_hold(5))
        recorder = Recorder(inference)
        result = run_episode(SimDriver(env, now=time.perf_counter), inference, sched, MonotonicClock(0.05), 0,
                             recorder)
        inference.close()
    assert all(starved for _, starved, _ in recorder.steps)  # never anything but the hold
    # re-requested at once: several failures inside 60 steps, where waiting for the request
    # timeout (10 chunks = 160 steps) would give none. Not a count per step: a loaded machine
    # slows the in-process server thread
    assert result.abandoned == 0 and result.failed >= 3
    assert "cannot read the state" in inference.errors[0]


def _flow_policy(rtc_mode: str = "prefix"):
    from arli.policies.flow import FlowPolicy
    from arli.policies.flow_config import FlowPolicyConfig

    import torch

    torch.manual_seed(0)
    return FlowPolicy(FlowPolicyConfig(state_dim=6, action_dim=3, chunk_size=8, d_model=32, n_layers=1, n_heads=2,
                                       ff_dim=32, num_steps=4, rtc_mode=rtc_mode, rtc_max_prefix=4,
                                       execute_horizon=4))


def test_robots_waiting_together_are_answered_by_one_forward_pass():
    """Three robots' requests queued before the server looks: one ``infer_batch`` answers all
    three, each reply carries its own request id and its own committed prefix, and a bad
    request among them gets its own error while the others get their chunks."""
    from arli.runtime.server import InferenceServer

    (port,) = free_ports(1)
    server = InferenceServer(_flow_policy(), f"tcp://127.0.0.1:{port}", max_batch=8)
    assert server.batching and server.meta["max_batch"] == 8
    ctx = zmq.Context.instance()
    robots = []
    for _ in range(4):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port}")
        robots.append(sock)
    g = np.random.default_rng(0)
    prefixes = [g.uniform(-1, 1, (k, 3)).astype(np.float32) for k in (1, 2, 3)]
    time.sleep(0.3)  # connections up
    for k, (sock, prefix) in enumerate(zip(robots, prefixes)):
        sock.send(infer(request_id=100 + k, state=g.standard_normal(6).astype(np.float32), delay_steps=len(prefix),
                        committed_prefix=prefix))
    robots[3].send(infer(request_id=103, state=np.zeros(9, np.float32)))  # wrong state size
    time.sleep(0.3)  # all four are waiting at the server's socket
    stop_event = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop_event,), daemon=True)
    thread.start()
    try:
        for k, (sock, prefix) in enumerate(zip(robots, prefixes)):
            assert sock.poll(20_000), f"robot {k} got no reply"
            msg = decode(sock.recv_multipart())
            assert msg.kind == "chunk" and msg["request_id"] == 100 + k
            assert msg["timing"]["batch"] == 3 and msg["actions"].shape == (8, 3)
            np.testing.assert_allclose(msg["actions"][:len(prefix)], prefix, atol=1e-6)
        assert robots[3].poll(20_000)
        bad = decode(robots[3].recv_multipart())
        assert bad.kind == "error" and bad["request_id"] == 103
        assert "observation.state must have shape (6,)" in bad["message"]
    finally:
        stop_event.set()
        thread.join()
        server.close()
        for sock in robots:
            sock.close()
    # the bad row was answered on its own, the other three by one forward pass
    assert server.stats["requests"] == 4 and server.stats["errors"] == 1 and server.stats["batches"] == 1


class SlowBatchPolicy:
    """30 ms per forward pass, one robot or several: what a GPU-bound model costs."""

    chunk_size, action_dim, n_obs_steps, batchable = 4, 2, 1, True

    def __init__(self):
        self.computing = threading.Event()  # set when a forward pass starts

    def infer(self, request) -> np.ndarray:
        return self.infer_batch([request])[0]

    def infer_batch(self, requests) -> list[np.ndarray]:
        self.computing.set()
        time.sleep(0.03)
        return [np.zeros((4, 2), np.float32) for _ in requests]


def test_two_robots_out_of_step_fall_into_one_batch():
    """Two robots whose requests are always due (each re-sends when its chunk arrives), the
    second starting while the first's forward pass runs: without waiting for the robot just
    answered, they take turns being answered alone for good (each request arrives while the
    other's is computed); the server waits a moment for it, and from then on one forward
    pass answers both."""
    ctx = zmq.Context.instance()
    state = np.zeros(6, np.float32)
    batches = {0: [], 1: []}
    policy = SlowBatchPolicy()
    with serving_in_thread(policy, max_batch=8, batch_wait_s=0.01) as address:
        robots = [ctx.socket(zmq.DEALER) for _ in range(2)]
        try:
            for sock in robots:
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(address)
            time.sleep(0.3)  # connections up
            robots[0].send(infer(request_id=0, state=state))
            # robot 1 asks once robot 0's forward pass has started (a fixed sleep, on a loaded
            # machine, can land before the server picks robot 0's request up: one batch at once)
            assert policy.computing.wait(10), "robot 0's request was never computed"
            robots[1].send(infer(request_id=0, state=state))
            poller = zmq.Poller()
            for sock in robots:
                poller.register(sock, zmq.POLLIN)
            while min(len(b) for b in batches.values()) < 12:
                ready = dict(poller.poll(20_000))
                assert ready, "no reply within 20 s"
                for k, sock in enumerate(robots):
                    if sock in ready:
                        msg = decode(sock.recv_multipart())
                        assert msg.kind == "chunk"
                        batches[k].append(int(msg["timing"]["batch"]))
                        sock.send(infer(request_id=len(batches[k]), state=state))
        finally:
            for sock in robots:
                sock.close()
    assert batches[0][0] == 1  # robot 1 asked during robot 0's forward pass: out of step at first
    assert batches[0][-6:] == batches[1][-6:] == [2] * 6, batches


def test_max_batch_1_answers_one_request_at_a_time():
    from arli.runtime.server import InferenceServer

    (port,) = free_ports(1)
    server = InferenceServer(_flow_policy(), f"tcp://127.0.0.1:{port}", max_batch=1)
    try:
        assert not server.batching and server.meta["max_batch"] == 1
        frames = [infer(request_id=k, state=np.full(6, k, np.float32)) for k in range(3)]
        replies = [decode(reply) for reply, is_infer in server.handle_many(frames)]
        assert [r["request_id"] for r in replies] == [0, 1, 2] and all(r["timing"]["batch"] == 1 for r in replies)
    finally:
        server.close()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])  # 1e39: finite in float64, inf as float32
def test_a_chunk_with_nan_or_inf_is_never_sent_and_finite_ones_arrive_exactly(bad):
    """The reply path's finiteness check (a sum over the chunk's float32 buffer): one bad value
    anywhere in the chunk turns the reply into a ``policy`` error naming the request; a finite
    chunk of any layout (float64, transposed, empty) arrives as the float32 values it holds."""
    from arli.runtime.server import InferenceServer

    class Fixed:
        chunk_size, action_dim, n_obs_steps = 4, 3, 1

        def __init__(self):
            self.chunk = np.zeros((4, 3))

        def reset(self, seed=None) -> None: ...

        def infer(self, request):
            return self.chunk

    policy = Fixed()
    server = InferenceServer(policy, f"tcp://127.0.0.1:{free_ports(1)[0]}")
    try:
        # small chunks are summed in Python, large ones (here 50 x 64) by numpy in float64
        for rid, (shape, where) in enumerate([((4, 3), (row, row % 3)) for row in range(4)]
                                             + [((50, 64), (0, 0)), ((50, 64), (49, 63))]):
            policy.chunk = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
            policy.chunk[where] = bad
            reply = decode(server.handle(infer(request_id=rid)))
            assert reply.kind == "error" and reply["code"] == "policy" and reply["request_id"] == rid
            assert "NaN/inf" in reply["message"]
        for chunk, shape in ((np.float32(1.0), "()"), (np.zeros(12, np.float32), "(12,)")):  # not (H, m): named
            policy.chunk = chunk
            reply = decode(server.handle(infer(request_id=9)))
            assert reply.kind == "error" and f"actions of shape {shape}, not (H, m)" in reply["message"]
        for chunk in (np.arange(12, dtype=np.float64).reshape(4, 3) * 3.4e38 / 12,  # large, finite as float32
                      np.full((50, 64), 3.4e38, np.float32),  # a float32 sum would overflow: finite all the same
                      np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
                      np.zeros((0, 3), np.float32)):
            policy.chunk = chunk
            reply = decode(server.handle(infer()))
            assert reply.kind == "chunk", reply.fields
            np.testing.assert_array_equal(reply["actions"], chunk.astype(np.float32))
    finally:
        server.close()


def test_a_connection_monitor_is_not_refused_by_an_endpoint_a_reaped_socket_left():
    """pyzmq names a monitor inproc://monitor.s-<fd>; while libzmq reaps a closed socket
    that endpoint stays bound, and a new socket reusing the fd number was refused
    (EADDRINUSE, seen once in CI). Each monitor gets its own name, and both still see
    their socket's handshake."""
    from arli.transport.zmq_io import ConnectionMonitor

    ctx = zmq.Context.instance()
    (port,) = free_ports(1)
    server = ctx.socket(zmq.ROUTER)
    server.bind(f"tcp://127.0.0.1:{port}")
    sock = ctx.socket(zmq.DEALER)
    stale = ctx.socket(zmq.PAIR)
    stale.bind(f"inproc://monitor.s-{sock.FD}")  # what the reaped socket's monitor left bound
    other = ctx.socket(zmq.DEALER)
    try:
        monitors = [ConnectionMonitor(sock), ConnectionMonitor(other)]
        for s in (sock, other):
            s.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while not all(m.update() for m in monitors) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(m.connected for m in monitors)
        for m in monitors:
            m.close()
        # closing a monitor frees its endpoint: the socket can be monitored again
        ConnectionMonitor(sock).close()
    finally:
        for s in (sock, other, stale, server):
            s.close(linger=0)


def test_the_client_sees_a_handshake_that_completes_before_its_monitor_would_have_started(monkeypatch):
    """The monitor is attached before the socket connects: a loopback handshake done in well
    under a millisecond was otherwise never reported, and the robot held for a whole episode
    with a server answering (seen in CI). A slow monitor start makes that race certain."""
    from arli.transport import inference_client, zmq_io

    class SlowToStart(zmq_io.ConnectionMonitor):
        def __init__(self, sock):
            time.sleep(0.3)
            super().__init__(sock)

    monkeypatch.setattr(inference_client, "ConnectionMonitor", SlowToStart)
    with serving_in_thread(FailingPolicy()) as address:
        inference = RemoteInference(address, 0.05)
        inference.connect(timeout_s=10)
        deadline = time.monotonic() + 5
        while not inference.healthy() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert inference.healthy()
        inference.close()
