"""Servers with the same stub policy for ``arli bench transport``: ours (ZeroMQ + msgpack)
and LeRobot 0.4.x's async-inference ``PolicyServer`` (gRPC + pickle), run as processes:
``python -m arli.bench.stub_servers {ours|lerobot} PORT COMPUTE_MS [wait|spin]``.

The stub does a fixed amount of busy computation (``COMPUTE_MS``) and returns a 50 x 7
chunk, so both sides measure transport + serialisation, not a model.
"""

from __future__ import annotations

import sys
import time

import numpy as np

STUB_CHUNK = (50, 7)


SPIN = False  # set from the command line: spin the CPU instead of waiting


SPIN_MARGIN_S = 0.0015  # wait mode spins the last 1.5 ms of the compute


def busy(ms: float, spin: bool | None = None) -> None:
    """``ms`` of fixed compute: waiting (a GPU-bound model's host thread) or spinning a core
    (``spin``; None: the server's mode, ``SPIN``).

    Waiting sleeps, then spins the last SPIN_MARGIN_S so that the compute really is ``ms``:
    on this VM ``time.sleep`` overshoots by 0.15 ms at p50 and 0.7-1.3 ms at p99, and the
    bench subtracts the nominal ``ms`` from every round trip, so an overshoot would be
    charged to the transport under test (with a 0.2 ms margin it was most of our p99)."""
    end = time.perf_counter() + ms / 1000
    if not (SPIN if spin is None else spin) and ms / 1000 > SPIN_MARGIN_S:
        time.sleep(ms / 1000 - SPIN_MARGIN_S)
    while time.perf_counter() < end:
        pass


class StubPolicy:
    """BasePolicy-shaped: fixed compute, zeros (50, 7)."""

    chunk_size, action_dim, n_obs_steps = STUB_CHUNK[0], STUB_CHUNK[1], 1

    def __init__(self, compute_ms: float):
        self.compute_ms = compute_ms

    def reset(self, seed=None) -> None: ...

    def infer(self, request) -> np.ndarray:
        busy(self.compute_ms)
        return np.zeros((self.chunk_size, self.action_dim), np.float32)


def serve_ours(port: int, compute_ms: float) -> None:
    from arli.runtime.server import InferenceServer  # noqa: PLC0415

    server = InferenceServer(StubPolicy(compute_ms), f"tcp://127.0.0.1:{port}")
    print("ready", flush=True)
    server.serve()


def serve_floor(port: int, compute_ms: float) -> None:
    """Echo server: receive the frames, wait the compute, reply a chunk-sized frame."""
    import zmq  # noqa: PLC0415

    from arli.transport.zmq_io import bind_socket  # noqa: PLC0415

    sock = bind_socket(zmq.Context(), zmq.ROUTER, f"tcp://127.0.0.1:{port}")  # as the inference server's
    reply = np.zeros(STUB_CHUNK, np.float32).tobytes()
    print("ready", flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        busy(compute_ms)
        sock.send_multipart([frames[0], reply])


def serve_lerobot(port: int, compute_ms: float) -> None:
    from concurrent import futures  # noqa: PLC0415

    # LeRobot's async-inference logger writes logs/<name>_<time>.log under the working
    # directory when its module is imported: the bench starts this server in a scratch
    # directory it removes afterwards (arli.bench.transport.main)
    import grpc  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from lerobot.async_inference.configs import PolicyServerConfig  # noqa: PLC0415
    from lerobot.async_inference.helpers import TimedAction  # noqa: PLC0415
    from lerobot.async_inference.policy_server import PolicyServer  # noqa: PLC0415
    from lerobot.transport import services_pb2_grpc  # noqa: PLC0415

    class StubPolicyServer(PolicyServer):
        """LeRobot's server, services and serialisation unchanged; only the model is the stub."""

        def _predict_action_chunk(self, observation_t):
            self.last_processed_obs = observation_t
            busy(compute_ms)
            chunk = torch.zeros(STUB_CHUNK)
            return self._time_action_chunk(observation_t.get_timestamp(), list(chunk), observation_t.get_timestep())

    cfg = PolicyServerConfig(host="127.0.0.1", port=port, inference_latency=0.0, obs_queue_timeout=2.0)
    policy_server = StubPolicyServer(cfg)
    policy_server.logger.setLevel("WARNING")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    services_pb2_grpc.add_AsyncInferenceServicer_to_server(policy_server, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    kind, port, compute_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    SPIN = len(sys.argv) > 4 and sys.argv[4] == "spin"
    {"ours": serve_ours, "lerobot": serve_lerobot, "floor": serve_floor}[kind](port, compute_ms)
