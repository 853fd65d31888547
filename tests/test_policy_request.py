"""The typed base-policy request end to end: every camera by name and the instruction reach
the policy from the runtime, over a real ZeroMQ socket; a bad camera is an error reply naming
it and the server keeps serving; the flow policy takes several cameras and the request's
instruction; its RTC mask spans the scheduler's execute horizon."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch

from arli.policies.flow import FlowChunkModel, FlowPolicy, FlowPolicyConfig
from arli.runtime.server import InferenceServer
from arli.transport.codec import ProtocolError
from arli.transport.inference_client import RemoteInference
from arli.types import ChunkRequest, Observation, PolicyRequest
from process_utils import serving_in_thread

pytestmark = pytest.mark.timeout(120)
H, M = 8, 5


class RecordingPolicy:
    """Keeps every request it is asked, answers a constant chunk."""

    chunk_size, action_dim, n_obs_steps = H, M, 2

    def __init__(self):
        self.requests: list[PolicyRequest] = []

    def reset(self, seed=None) -> None: ...

    def camera_shapes(self) -> dict[str, tuple[int, int, int]]:
        return {"front": (16, 16, 3), "wrist": (16, 16, 3)}

    def infer(self, request: PolicyRequest) -> np.ndarray:
        for name, image in request.images.items():
            if image.shape != (16, 16, 3):
                raise ValueError(f"camera {name!r} must be (16, 16, 3), got {image.shape}")
        self.requests.append(request)
        return np.full((H, M), 0.1, np.float32)


@pytest.fixture()
def server():
    policy = RecordingPolicy()
    with serving_in_thread(policy) as address:
        client = RemoteInference(address, 0.05, initial_delay_steps=2, instruction="default task")
        client.connect(timeout_s=60)  # generous: a loaded CI machine starts the server thread late
        yield policy, client
        client.close()


def _replies(client, n=1, timeout=60.0):
    out, deadline = [], time.perf_counter() + timeout
    while len(out) < n and time.perf_counter() < deadline:
        client.drain(0.05)
        out += client.poll(0)
    return out


def _obs(step, instruction="", seed=0, size=16):
    g = np.random.default_rng(seed)
    images = {"front": g.integers(0, 255, (size, size, 3), dtype=np.uint8),
              "wrist": g.integers(0, 255, (size, size, 3), dtype=np.uint8)}
    return Observation(g.normal(size=7).astype(np.float32), step, 0.0, images, instruction)


def test_every_camera_the_instruction_and_the_schedule_reach_the_policy(server):
    policy, client = server
    past, obs = _obs(3, seed=1), _obs(4, "put the peg in the hole", seed=2)
    prefix = np.full((2, M), 0.5, np.float32)
    assert client.submit(ChunkRequest(0, 4, obs, 2, prefix, prefix, execute_horizon=5), [past])
    (reply,) = _replies(client)
    assert reply.actions.shape == (H, M)
    (got,) = policy.requests
    assert sorted(got.images) == ["front", "wrist"]
    for name in ("front", "wrist"):
        np.testing.assert_array_equal(got.images[name], obs.images[name])
    np.testing.assert_array_equal(got.state, obs.state)
    assert got.instruction == "put the peg in the hole"
    assert (got.delay, got.execute_horizon) == (2, 5)
    np.testing.assert_array_equal(got.committed_prefix, prefix)
    assert len(got.history) == 1 and sorted(got.history[0].images) == ["front", "wrist"]
    np.testing.assert_array_equal(got.history[0].state, past.state)
    # an observation without its own instruction carries the robot's configured one
    assert client.submit(ChunkRequest(1, 5, _obs(5), 2, None), [])
    assert len(_replies(client)) == 1 and policy.requests[-1].instruction == "default task"


def test_a_bad_camera_is_an_error_naming_it_and_the_server_keeps_serving(server):
    policy, client = server
    bad = _obs(0)
    bad.images["wrist"] = bad.images["wrist"].astype(np.float32)  # not uint8
    assert client.submit(ChunkRequest(0, 0, bad, 2, None), [])
    (reply,) = _replies(client)
    # refused by the server's schema, naming the shape and dtype the policy reads that camera at
    assert reply.actions is None and reply.meta["error"].endswith(
        "camera 'wrist' must be a (16, 16, 3) uint8 image (as the policy reads it), got (16, 16, 3) float32")
    small = _obs(1)  # well-formed on the wire, but not what the policy takes: its own error comes back
    small.images["front"] = small.images["front"][:8]
    assert client.submit(ChunkRequest(1, 1, small, 2, None), [])
    (reply,) = _replies(client)
    assert reply.actions is None and "camera 'front' must be (16, 16, 3)" in reply.meta["error"]
    assert client.submit(ChunkRequest(2, 2, _obs(2), 2, None), [])
    (reply,) = _replies(client)
    assert reply.actions is not None and len(policy.requests) == 1


def test_a_camera_of_a_size_the_policy_does_not_fix_is_asked_for_as_any_image():
    """The schema error names the policy's shape only where it fixes one (0: any size)."""
    from arli.runtime.server import policy_request
    from arli.transport.codec import decode, encode

    msg = decode(encode("infer", request_id=1, t0=0, capture_ts=0.0, state=np.zeros(7, np.float32), delay_steps=0,
                        images={"front": np.zeros((8, 8, 3), np.float32)}))
    for cameras, want in (({"front": [0, 0, 3]}, "an (h, w, 3) uint8 image"),
                          ({"front": [16, 16, 3]}, "a (16, 16, 3) uint8 image (as the policy reads it)"),
                          (None, "an (h, w, 3) uint8 image")):
        with pytest.raises(ProtocolError, match=re.escape(f"camera 'front' must be {want}, got (8, 8, 3) float32")):
            policy_request(msg, cameras)


def _flow(cameras, rtc_mode="none", instruction="insert the peg"):
    torch.manual_seed(0)
    cfg = FlowPolicyConfig(state_dim=7, action_dim=M, chunk_size=H, d_model=32, n_layers=1, n_heads=2,
                           ff_dim=64, num_steps=4, image_size=24 if cameras else 0, cameras=list(cameras),
                           rtc_mode=rtc_mode, execute_horizon=4, instruction=instruction)
    model = FlowChunkModel(cfg)
    with torch.no_grad():  # a random network whose outputs depend visibly on every token
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return FlowPolicy(cfg, model)


def test_the_flow_policy_reads_every_camera_by_name():
    policy = _flow(["front", "wrist"])
    obs = _obs(0, size=24)

    def infer(images):
        policy.reset(0)
        return policy.infer(PolicyRequest(Observation(obs.state, 0, images=images)))

    a = infer(obs.images)
    assert a.shape == (H, M)
    assert not np.allclose(a, infer({**obs.images, "wrist": 255 - obs.images["wrist"]}))  # wrist is used
    assert not np.allclose(a, infer({**obs.images, "front": 255 - obs.images["front"]}))  # front is used
    # the cameras are told apart: swapping them changes the chunk
    assert not np.allclose(a, infer({"front": obs.images["wrist"], "wrist": obs.images["front"]}))
    with pytest.raises(ValueError, match=r"camera 'wrist' missing: this policy needs \{'front': \(24, 24, 3\), 'wrist': \(24, 24, 3\)\}"):
        infer({"front": obs.images["front"]})


def test_the_handshake_tells_the_robot_which_cameras_to_send():
    """hello_ok carries the policy's cameras and their (h, w, 3) shapes; a state-only policy
    names none."""
    from arli.transport.codec import decode, encode

    for policy, want in ((_flow(["front", "wrist"]), {"front": [24, 24, 3], "wrist": [24, 24, 3]}),
                         (_flow([]), {})):
        srv = InferenceServer(policy, "inproc://hello")
        try:
            reply = decode(srv.handle(encode("hello", role="robot")))
            assert reply.kind == "hello_ok" and reply["meta"]["cameras"] == want
        finally:
            srv.close()


def test_the_flow_policy_takes_the_request_instruction():
    policy = _flow([], instruction="insert the peg")
    state = np.linspace(-1, 1, 7).astype(np.float32)

    def infer(text):
        policy.reset(0)
        return policy.infer(PolicyRequest.of(state, instruction=text))

    trained_on = infer("")
    np.testing.assert_array_equal(trained_on, infer("insert the peg"))  # empty = the trained instruction
    assert not np.allclose(trained_on, infer("lift the cube"))


def test_the_rtc_mask_spans_the_request_execute_horizon():
    policy = _flow([], rtc_mode="guidance")
    state = np.zeros(7, np.float32)
    guidance = np.tile(np.linspace(-0.5, 0.5, 6, dtype=np.float32)[:, None], (1, M))

    def infer(s):
        policy.reset(0)
        return policy.infer(PolicyRequest.of(state, committed_prefix=guidance[:2], delay_steps=2,
                                             guidance=guidance, execute_horizon=s))

    np.testing.assert_array_equal(infer(None), infer(4))  # the saved horizon when none is sent
    assert not np.allclose(infer(2), infer(6))


def test_a_flood_of_bad_requests_is_answered_but_logs_a_bounded_number_of_lines(caplog):
    """Every bad request gets its error reply; the log takes at most its budget of lines per
    window and counts the rest (a misbehaving client cannot fill the disk)."""
    from arli.logs import LINES_PER_WINDOW
    from arli.transport.codec import decode, encode_frames

    srv = InferenceServer(RecordingPolicy(), "inproc://flood")
    try:
        bad = _obs(0)
        bad.images["front"] = bad.images["front"][:8]  # the policy refuses it
        frames = encode_frames("infer", request_id=1, t0=0, capture_ts=0.0, state=bad.state,
                               images=dict(bad.images), delay_steps=2)
        with caplog.at_level("WARNING", logger="arli.serve"):
            replies = [decode(srv.handle(frames)) for _ in range(200)]
        assert all(r.kind == "error" and r["code"] == "policy" for r in replies)
        logged = [r for r in caplog.records if "policy error" in r.getMessage()]
        assert len(logged) == LINES_PER_WINDOW
        assert srv.stats["errors"] == 200 and srv.stats["warnings_suppressed"] == 200 - len(logged)
    finally:
        srv.close()


def test_a_non_string_instruction_is_refused_by_the_schema_naming_the_request():
    """The schema refuses an instruction that is not a string; the error reply carries the
    request's id, so the robot gives that request up at once instead of at its timeout."""
    import msgpack

    from arli.transport import codec

    srv = InferenceServer(RecordingPolicy(), "inproc://schema")
    try:
        obs = _obs(0)
        fields = {"v": codec.PROTOCOL_VERSION, "kind": "infer", "request_id": 41, "t0": 0, "capture_ts": 0.0,
                  "state": obs.state, "instruction": 7, "delay_steps": 2}
        reply = codec.decode(srv.handle(msgpack.packb(fields, default=codec._default, use_bin_type=True)))
        assert reply.kind == "error" and reply["code"] == "schema" and reply["request_id"] == 41
        assert "'instruction' must be str, got int" in reply["message"]
        unparseable = codec.decode(srv.handle(b"\xc1 not msgpack"))
        assert unparseable["code"] == "malformed" and unparseable.get("request_id") is None
        good = codec.encode_frames("infer", request_id=43, t0=0, capture_ts=0.0, state=obs.state, delay_steps=2,
                                   images=dict(obs.images))
        assert codec.decode(srv.handle(good)).kind == "chunk"  # and it keeps serving
    finally:
        srv.close()
