"""``RemoteInference``: the runtime's inference endpoint over ZeroMQ (client of ``arli serve``).

Never blocks the control loop: ``submit`` is a non-blocking send (refused while no server
is connected), ``poll`` drains whatever replies have arrived. Every reply's real latency
(capture of o_t0 -> reply received) is measured and kept (``latencies``; ``save_trace``
writes them in the format ``latency.kind=trace`` replays in sim).
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import zmq

from arli.latency import MeasuredLatency, PlansFromMeasured
from arli.logs import RateLimitedLog
from arli.transport.codec import MAX_MESSAGE_BYTES, ProtocolError, decode, encode, encode_frames
from arli.transport.zmq_io import ConnectionMonitor, CurveConfig, client_socket
from arli.types import ChunkReply, ChunkRequest, Observation

log = logging.getLogger("arli.inference")


class ServerError(RuntimeError):
    """The server answered with an error (``code``: see codec.ERROR_CODES)."""


class RemoteInference(PlansFromMeasured):
    """DEALER client. ``dt``: control period, to turn latencies into delay steps.

    ``initial_delay_steps``: the delay assumed before any reply has been measured; after
    that the assumed delay is the ``quantile`` of the last 50 measured latencies.
    """

    def __init__(self, address: str, dt: float, curve: CurveConfig | None = None,
                 initial_delay_steps: int = 4, quantile: float = 0.9, instruction: str = "",
                 max_bytes: int = MAX_MESSAGE_BYTES):
        self.address, self.dt, self.quantile, self.instruction = address, dt, quantile, instruction
        self.max_bytes = max_bytes
        self.ctx = zmq.Context.instance()
        self.sock = client_socket(self.ctx, zmq.DEALER, curve)
        self.monitor = ConnectionMonitor(self.sock)  # before connecting: it must see the handshake
        self.sock.connect(address)
        self.measured = MeasuredLatency(dt, initial_delay_steps, quantile)
        self.meta: dict = {}
        self.chunk_size = self.action_dim = 0
        self.n_obs_steps = 1
        # the last error replies, and a log a server answering every request with an error
        # (a missing camera at 20 Hz) cannot flood
        self.errors: deque[str] = deque(maxlen=100)
        self._log = RateLimitedLog(log)
        self._sent: dict[int, tuple[float, float]] = {}  # request id -> (capture ts, send ts)
        self._episode = 0
        self._inbox: list[tuple[float, bytes]] = []

    # -- connection ----------------------------------------------------------------------
    def _request(self, frame: bytes, expect: str, timeout_s: float) -> dict:
        """A blocking request/reply outside the control loop (handshake, ping)."""
        deadline = time.perf_counter() + timeout_s
        sent = False
        while time.perf_counter() < deadline:
            if not sent:
                try:
                    self.sock.send(frame, zmq.NOBLOCK)
                    sent = True
                except zmq.Again:
                    time.sleep(0.01)
                    continue
            if self.sock.poll(10):
                msg = decode(self.sock.recv_multipart(), self.max_bytes)
                if msg.kind == "error":
                    raise ServerError(f"server {self.address}: [{msg['code']}] {msg['message']}")
                if msg.kind == expect:
                    return msg.fields
        raise TimeoutError(f"no answer from the inference server at {self.address} within {timeout_s:.1f} s; "
                           "is `arli serve` running there (and are CURVE keys the same on both sides)?")

    def connect(self, timeout_s: float = 10.0) -> dict:
        """Handshake: the server's metadata (chunk size, action dim, policy, versions)."""
        self.meta = self._request(encode("hello", role="robot"), "hello_ok", timeout_s)["meta"]
        self.chunk_size, self.action_dim = int(self.meta["chunk_size"]), int(self.meta["action_dim"])
        self.n_obs_steps = int(self.meta.get("n_obs_steps", 1))
        self.monitor.update()
        return self.meta

    def ping(self, timeout_s: float = 2.0) -> float:
        """Round trip (s) of a ping."""
        sent = time.perf_counter()
        self._request(encode("ping", sent=sent), "pong", timeout_s)
        return time.perf_counter() - sent

    def healthy(self) -> bool:
        return self.monitor.update()

    # -- the endpoint interface ------------------------------------------------------------
    def begin_episode(self, seed: int) -> None:
        self._episode = seed
        self._sent.clear()

    def submit(self, request: ChunkRequest, history: list[Observation]) -> bool:
        obs = request.observation
        fields = {"request_id": request.request_id, "t0": request.t0, "capture_ts": float(obs.timestamp),
                  "state": np.asarray(obs.state, np.float32), "images": dict(obs.images),
                  "delay_steps": int(request.delay_steps), "instruction": obs.instruction or self.instruction,
                  "episode": self._episode,
                  "history": [{"state": np.asarray(h.state, np.float32), "images": dict(h.images)}
                              for h in history]}
        if request.committed_prefix is not None:
            fields["committed_prefix"] = np.asarray(request.committed_prefix, np.float32)
        if request.guidance is not None:
            fields["guidance"] = np.asarray(request.guidance, np.float32)
        if request.execute_horizon is not None:
            fields["execute_horizon"] = int(request.execute_horizon)
        try:
            self.sock.send_multipart(encode_frames("infer", **fields), zmq.NOBLOCK)
        except zmq.Again:  # no connected server (IMMEDIATE): the caller holds and retries
            return False
        self._sent[request.request_id] = (float(obs.timestamp), time.perf_counter())
        return True

    def drain(self, timeout_s: float = 0.0) -> None:
        """Receive what arrives within ``timeout_s``, stamped on arrival (the runtime's
        clock calls this while it waits for the next tick, so latencies are not rounded
        up to control periods)."""
        if self.sock.poll(max(0, int(timeout_s * 1000))):
            while self.sock.poll(0):
                self._inbox.append((time.perf_counter(), self.sock.recv_multipart(zmq.NOBLOCK)))

    def poll(self, step: int) -> list[ChunkReply]:
        self.drain(0.0)
        inbox, self._inbox = self._inbox, []
        out = []
        for now, frame in inbox:
            try:
                msg = decode(frame, self.max_bytes)
            except ProtocolError as exc:
                self.errors.append(str(exc))
                self._log.warn("bad reply from %s: %s", self.address, exc)
                continue
            if msg.kind == "error":
                self.errors.append(f"[{msg['code']}] {msg['message']}")
                self._log.warn("server error for request %s: [%s] %s", msg.get("request_id"), msg["code"],
                               msg["message"])
                rid = msg.get("request_id")
                if rid in self._sent:  # the runtime gives that request up now, not at its timeout
                    self._sent.pop(rid)
                    out.append(ChunkReply(rid, None, {"error": f"[{msg['code']}] {msg['message']}"}))
                continue
            if msg.kind != "chunk" or msg["request_id"] not in self._sent:
                continue  # a pong, or an answer to a request of an earlier episode
            capture, send = self._sent.pop(msg["request_id"])
            timing = {k: float(v) for k, v in msg["timing"].items() if isinstance(v, (int, float))}
            latency = now - capture
            record = {"latency_s": latency, "rtt_s": now - send, **timing}
            self.measured.add(latency, record)
            out.append(ChunkReply(msg["request_id"], np.array(msg["actions"], np.float32), record))
        return out

    def close(self) -> None:
        self._log.flush()
        self.monitor.close()
        self.sock.close(linger=0)
