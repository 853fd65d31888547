"""``OpenPIInference``: the runtime against a base served with openpi's protocol.

openpi's own server (``openpi.serving.websocket_policy_server``) needs JAX and openpi's model
code, which cannot be installed here. ``OpenPIProtocolServer`` below speaks its protocol with
the pieces it is built from, ``websockets`` and openpi_client's ``msgpack_numpy``, and its
message layout: the metadata first, then one observation dict in and one
``{"actions", "server_timing"}`` dict out per request; a policy exception becomes a text frame
with the traceback, after which the connection is closed. Behind it runs a real policy: the
scripted expert's chunk policy on the MuJoCo ``pick_cube`` task. The tests stop at that
boundary (openpi's model code); everything on ARLI's side is the real runtime on a real clock.
"""

from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import pytest
from openpi_client import image_tools, msgpack_numpy
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import serve

from arli.chunking import ChunkingConfig, make_scheduler
from arli.cli import compose
from arli.commands.pipeline import make_inference
from arli.errors import ConfigError
from arli.interfaces import StepController
from arli.policies.expert import ExpertChunkPolicy
from arli.runtime.clock import MonotonicClock
from arli.runtime.loop import run_episode
from arli.transport.openpi_endpoint import OpenPIConfig, OpenPIError, OpenPIInference
from arli.types import ChunkRequest, Observation, PolicyRequest
from process_utils import free_ports
from robot_drivers.sim import SimDriver
from sim_envs import make_env

H, DT = 10, 0.05
META = {"policy": "expert behind openpi", "action_horizon": H, "reset_pose": np.arange(3.0)}
SPLIT = {"observation/state": [0, 9], "observation/object_state": [9, 17]}  # pick_cube: 9 proprio + 8 object


class OpenPIProtocolServer:
    """openpi's server loop over ``infer(obs dict) -> reply dict``; ``received``: every observation."""

    def __init__(self, infer, metadata: dict = META):
        self.infer, self.metadata = infer, metadata
        self.received: list[dict] = []
        self.connections = 0
        self._server = serve(self._handler, "127.0.0.1", 0, compression=None, max_size=None)
        self.uri = f"ws://127.0.0.1:{self._server.socket.getsockname()[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _handler(self, ws) -> None:
        self.connections += 1
        packer = msgpack_numpy.Packer()
        ws.send(packer.pack(self.metadata))
        while True:
            try:
                obs = msgpack_numpy.unpackb(ws.recv())
            except ConnectionClosed:
                return
            self.received.append(obs)
            try:
                start = time.monotonic()
                reply = self.infer(obs)
                reply["server_timing"] = {"infer_ms": (time.monotonic() - start) * 1000}
            except Exception:  # noqa: BLE001 - what openpi's server does with a policy error
                ws.send(traceback.format_exc())
                ws.close(code=1011, reason="Internal server error. Traceback included in previous frame.")
                return
            try:
                ws.send(packer.pack(reply))
            except ConnectionClosed:  # the episode ended with this request in flight
                return

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


class ExpertBehindOpenPI:
    """The scripted expert's chunks from openpi keys: the state is put back together from the
    two slices; three columns of junk ride along (``action_slice`` must cut them); ``sent``
    keeps every chunk (H, 5) it answered with."""

    def __init__(self, task: str = "pick_cube", compute_s: float = 0.1):
        self.policy, self.compute_s = ExpertChunkPolicy(task, H), compute_s
        self.sent: list[np.ndarray] = []

    def __call__(self, obs: dict) -> dict:
        state = np.concatenate([obs["observation/state"], obs["observation/object_state"]])
        chunk = self.policy.infer(PolicyRequest.of(state))
        time.sleep(self.compute_s)  # a model's forward pass: the reply lands a few control steps later
        self.sent.append(chunk)
        return {"actions": np.concatenate([chunk, np.full((H, 3), 7.0, np.float32)], axis=1)}


class Recorder(StepController):
    def __init__(self):
        self.steps: list[tuple[int, np.ndarray, object]] = []

    def act(self, t, obs, info):
        self.steps.append((t, obs.state.copy(), info))
        return info.base_action


def endpoint(uri: str, **fields) -> OpenPIInference:
    cfg = OpenPIConfig(**{"uri": uri, "state": dict(SPLIT), "action_slice": [0, 5], "connect_timeout_s": 10, **fields})
    return OpenPIInference(cfg, DT, 17, 5, initial_delay_steps=4, instruction="pick up the cube")


def request(rid: int, obs: Observation) -> ChunkRequest:
    return ChunkRequest(rid, 0, obs, 4, None)


def replies(inference: OpenPIInference, n: int = 1, timeout_s: float = 5.0) -> list:
    out, deadline = [], time.perf_counter() + timeout_s
    while len(out) < n and time.perf_counter() < deadline:
        inference.drain(0.01)
        out += inference.poll(0)
    return out


@pytest.fixture
def expert_server():
    expert = ExpertBehindOpenPI()
    server = OpenPIProtocolServer(expert)
    yield server, expert
    server.close()


def test_an_episode_runs_on_the_openpi_servers_chunks(expert_server):
    server, expert = expert_server
    env = make_env("pick_cube", max_episode_steps=200)
    driver = SimDriver(env, now=time.perf_counter)
    inference = endpoint(server.uri)
    try:
        assert inference.connect()["policy"] == "expert behind openpi"
        np.testing.assert_array_equal(inference.meta["reset_pose"], META["reset_pose"])  # numpy survives the codec
        assert inference.chunk_size == H
        chunking = ChunkingConfig(planned_delay_steps=4, min_delay_steps=0)  # the actor's defaults
        scheduler = make_scheduler(chunking, inference.chunk_size, 5, 4)
        recorder = Recorder()
        result = run_episode(driver, inference, scheduler, MonotonicClock(DT), 3, recorder)
    finally:
        inference.close()
        env.close()
    assert result.success and result.requests >= 3 and result.failed == 0

    # the executed base actions are slots of chunks the server sent, junk columns cut
    executed = [info for _, _, info in recorder.steps if not info.starved]
    assert len(executed) > 0.7 * len(recorder.steps)
    for info in executed:
        assert any(np.array_equal(info.chunk_actions, chunk) for chunk in expert.sent[1:])
        np.testing.assert_array_equal(info.base_action, info.chunk_actions[info.index_in_chunk])

    # the mapping: both slices of one captured state under their keys, float32, the prompt
    warmup, *requests = server.received
    assert not warmup["observation/state"].any() and warmup["prompt"] == "pick up the cube"
    states = [state for _, state, _ in recorder.steps]
    for obs in requests:
        assert set(obs) == {"observation/state", "observation/object_state", "prompt"}
        assert obs["observation/state"].dtype == np.float32 and obs["observation/object_state"].shape == (8,)
        assert any(np.array_equal(obs["observation/state"], s[:9]) and np.array_equal(obs["observation/object_state"],
                                                                                      s[9:]) for s in states)

    # latency measured from capture to arrival, planned from like RemoteInference does
    assert len(inference.latencies) == len(result.delays) >= 3
    assert min(inference.latencies) >= expert.compute_s and np.median(result.delays) >= 2
    assert all(r["server_infer_ms"] >= 100 and r["rtt_s"] <= r["latency_s"] for r in inference.records)
    q = float(np.quantile(inference.latencies[-50:], 0.9))
    assert inference.next_delay() == int(np.ceil(q / DT - 1e-9))


def test_cameras_and_prompt_go_under_their_openpi_keys(expert_server):
    server, _ = expert_server
    inference = endpoint(server.uri, images={"wrist": "observation/wrist_image"}, prompt_key="task")
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    try:
        inference.connect()
        state = np.arange(17, dtype=np.float32)
        obs = Observation(state, 0, time.perf_counter(), {"wrist": image}, "open the drawer")
        inference.submit(request(1, obs), [])
        (reply,) = replies(inference)
        with pytest.raises(OpenPIError, match=r"openpi.images: camera\(s\) \['wrist'\].*it has \['front'\]"):
            inference.submit(request(2, Observation(state, 0, images={"front": image})), [])
    finally:
        inference.close()
    warmup, sent = server.received
    assert warmup["observation/wrist_image"].shape == (224, 224, 3) and not warmup["observation/wrist_image"].any()
    assert sent["task"] == "open the drawer" and "prompt" not in sent
    assert sent["observation/wrist_image"].dtype == np.uint8
    np.testing.assert_array_equal(sent["observation/wrist_image"], image_tools.resize_with_pad(image, 224, 224))
    np.testing.assert_array_equal(sent["observation/state"], state[:9])
    assert reply.request_id == 1 and reply.actions.shape == (H, 5)


def test_a_server_error_is_recorded_given_up_and_the_endpoint_reconnects():
    calls = []

    def infer(obs):
        calls.append(obs)
        if len(calls) == 2:
            raise KeyError("observation/exterior_image_1_left")
        return {"actions": np.zeros((H, 5))}

    server = OpenPIProtocolServer(infer)
    inference = endpoint(server.uri, action_slice=[])
    try:
        inference.connect()
        state = Observation(np.zeros(17, np.float32), 0, time.perf_counter())
        assert inference.submit(request(1, state), [])
        (failed,) = replies(inference)
        assert failed.request_id == 1 and failed.actions is None
        assert "KeyError: 'observation/exterior_image_1_left'" in failed.meta["error"]
        assert "Traceback" in inference.errors[0] and not inference.latencies
        deadline = time.perf_counter() + 5
        while server.connections < 2 and time.perf_counter() < deadline:  # openpi closed it; we come back
            time.sleep(0.02)
        while not inference.healthy() and time.perf_counter() < deadline:
            time.sleep(0.02)
        assert server.connections == 2 and inference.healthy()
        assert inference.meta["policy"] == META["policy"]
        assert inference.submit(request(2, state), [])
        (ok,) = replies(inference)
        assert ok.request_id == 2 and ok.actions.shape == (H, 5) and len(inference.latencies) == 1
    finally:
        inference.close()
        server.close()


def test_a_server_that_fails_the_warm_up_is_refused_at_connect():
    def infer(obs):
        return {"actions": obs["observation/image"]}  # what a policy reading another key does

    server = OpenPIProtocolServer(infer)
    try:
        with pytest.raises(OpenPIError, match=rf"{server.uri} failed the warm-up request with keys \['observation/"
                                              r"object_state', 'observation/state', 'prompt'\]: KeyError: "
                                              r"'observation/image'; map its policy's inputs with openpi.state"):
            endpoint(server.uri).connect()
    finally:
        server.close()


@pytest.mark.parametrize("bad, message", [
    ({"actions": np.zeros((H, 3))}, r"openpi.action_slice: expected columns within the reply's 'actions' of shape "
                                    r"\(10, 3\), got \[0, 5\]"),
    ({"action": np.zeros((H, 8))}, r"expected a dict with 'actions' \(H, M\) actions, got \['action', "
                                   r"'server_timing'\]; set openpi.actions_key"),
    ({"actions": np.zeros((H + 2, 8))}, r"expected \(10, 5\) as in the warm-up reply, got \(12, 5\)"),
    ({"actions": np.full((H, 8), np.nan)}, r"non-finite actions"),
])
def test_a_malformed_reply_stops_the_loop_with_the_key_and_shapes(bad, message):
    served = iter([{"actions": np.zeros((H, 8))}])

    def infer(obs):
        return next(served, bad)

    server = OpenPIProtocolServer(infer)
    inference = endpoint(server.uri)
    try:
        inference.connect()
        inference.submit(request(1, Observation(np.zeros(17, np.float32), 0, time.perf_counter())), [])
        with pytest.raises(OpenPIError, match=message):
            replies(inference)
        assert inference.errors
    finally:
        inference.close()
        server.close()


def test_a_wrong_action_width_is_refused_at_connect():
    server = OpenPIProtocolServer(lambda obs: {"actions": np.zeros((H, 7))})
    try:
        with pytest.raises(OpenPIError, match=r"'actions': expected \(H, 5\) actions for this robot, got \(10, 7\); "
                                              r"set openpi.action_slice"):
            endpoint(server.uri, action_slice=[]).connect()
    finally:
        server.close()


def test_an_unreachable_server_is_a_clear_error():
    (port,) = free_ports(1)
    uri = f"ws://127.0.0.1:{port}"
    with pytest.raises(OpenPIError, match=rf"no openpi policy server at openpi.uri={uri} \(.*\); is openpi's policy "
                                          r"server running there \(`uv run scripts/serve_policy.py"):
        endpoint(uri).connect(timeout_s=2)


def test_arli_actor_inference_openpi_builds_and_connects_this_endpoint(expert_server):
    server, _ = expert_server
    cfg = compose("actor", ["env=pick_cube", "inference=openpi", f"openpi.uri={server.uri}",
                            "+openpi.state={observation/state:[0,9],observation/object_state:[9,17]}",
                            "openpi.action_slice=[0,5]", "openpi.connect_timeout_s=10"])
    env = make_env("pick_cube")
    inference, served = make_inference(cfg, SimDriver(env), "the task")
    try:
        assert isinstance(inference, OpenPIInference) and inference.healthy()
        assert served == f"openpi at {server.uri}" and inference.chunk_size == H
        assert inference.next_delay() == cfg.chunking.planned_delay_steps  # nothing measured yet
        assert server.received[0]["prompt"] == "the task"
    finally:
        inference.close()
        env.close()


@pytest.mark.parametrize("overrides, field", [
    (["inference=openpi"], "openpi.state"),
    (["inference=openpi", "+openpi.state={observation/state:[0,9]}", "openpi.uri=tcp://gpu:8000"], "openpi.uri"),
    (["inference=openpi", "+openpi.state={observation/state:[4,2]}"], r"openpi.state\[observation/state\]"),
    (["inference=zmq"], "inference"),
])
def test_actor_openpi_settings_are_checked_at_start_up(overrides, field):
    with pytest.raises(ConfigError, match=rf"^{field}: expected"):
        compose("actor", overrides)


def test_a_state_slice_beyond_the_robot_is_refused():
    cfg = OpenPIConfig(state={"observation/state": [0, 20]})
    with pytest.raises(ConfigError, match=r"openpi.state\[observation/state\]: expected a slice within the robot's "
                                          r"state of 17 dims, got \[0, 20\]"):
        OpenPIInference(cfg, DT, 17, 5)
