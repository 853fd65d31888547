"""Inference server (``arli serve``): a base policy behind a ZeroMQ ROUTER socket.

Any number of robots (DEALER clients) connect. Messages: ``hello`` -> ``hello_ok`` (chunk
size, action dim, control period, policy name, versions), ``ping`` -> ``pong``, ``infer``
-> ``chunk`` (actions + server timing) or ``error``. A bad message or an exception in the
policy becomes an ``error`` reply naming the cause, and the server keeps serving.

``min_latency_s`` pads every reply to at least that long after receipt, without blocking
other clients: it emulates a slower model (a 3B VLA) with the small one trained here.
Robot drivers are never imported here (DESIGN.md §3).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from typing import Any

import numpy as np
import zmq

import arli
from arli.policies.base import BasePolicy
from arli.transport.codec import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, ProtocolError, decode, encode, error_frame
from arli.transport.zmq_io import CurveConfig, bind_socket, stop_auth
from arli.types import Observation, PolicyRequest

log = logging.getLogger("arli.serve")
WARNINGS_PER_WINDOW, WARNING_WINDOW_S = 20, 10.0  # the log's budget for policy-error lines


def _images(value, where: str) -> dict[str, np.ndarray]:
    """An ``images`` map off the wire: camera name -> (h, w, 3) uint8, or a schema error
    naming the camera."""
    if not isinstance(value, dict):
        raise ProtocolError("schema", f"{where}: images must be a map of camera name -> image")
    out = {}
    for name, image in value.items():
        if not isinstance(name, str) or not isinstance(image, np.ndarray) or image.ndim != 3 \
                or image.shape[2] != 3 or image.dtype != np.uint8:
            got = f"{image.shape} {image.dtype}" if isinstance(image, np.ndarray) else type(image).__name__
            raise ProtocolError("schema", f"{where}: camera {name!r} must be an (h, w, 3) uint8 image, got {got}")
        out[name] = image
    return out


def policy_request(msg) -> PolicyRequest:
    """An ``infer`` message -> the typed request every policy takes: every camera by name,
    the instruction, the committed prefix, delay, guidance, execute horizon and history."""
    history = []
    for i, h in enumerate(msg.get("history") or []):
        if not isinstance(h, dict) or not isinstance(h.get("state"), np.ndarray) or h["state"].ndim != 1:
            raise ProtocolError("schema", f"infer: history[{i}] must be a map with a 1-d state array")
        history.append(Observation(np.array(h["state"], np.float32), -1,
                                   images=_images(h.get("images") or {}, f"infer: history[{i}]")))
    obs = Observation(np.array(msg["state"], np.float32), int(msg["t0"]), float(msg["capture_ts"]),
                      _images(msg.get("images") or {}, "infer"), msg.get("instruction") or "")
    return PolicyRequest(obs, msg.get("committed_prefix"), int(msg["delay_steps"]), msg.get("guidance"),
                         msg.get("execute_horizon"), tuple(history) if "history" in msg.fields else None)


class InferenceServer:
    def __init__(self, policy: BasePolicy, address: str, meta: dict[str, Any] | None = None,
                 min_latency_s: float = 0.0, curve: CurveConfig | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES):
        self.policy, self.address, self.min_latency_s, self.max_bytes = policy, address, min_latency_s, max_bytes
        self.meta = {"chunk_size": int(policy.chunk_size), "action_dim": int(policy.action_dim),
                     "n_obs_steps": int(policy.n_obs_steps),
                     "policy": type(policy).__name__, "protocol": PROTOCOL_VERSION,
                     "arli": arli.__version__, **(meta or {})}
        self.ctx = zmq.Context()
        self.sock = bind_socket(self.ctx, zmq.ROUTER, address, curve)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._due: list[tuple[float, int, bytes, bytes]] = []  # (send at, seq, identity, frame)
        self._seq = 0
        self.stats = {"requests": 0, "errors": 0, "warnings_suppressed": 0, "clients": set()}
        self._window_start, self._logged, self._held = time.perf_counter(), 0, 0

    # -- one message -------------------------------------------------------------------
    def handle(self, frame) -> bytes:
        """Reply frame for one request (a frame, or [body, data frames...]); never raises."""
        recv = time.perf_counter()
        request_id = None
        self.last_was_infer = False
        try:
            msg = decode(frame, self.max_bytes)
            if msg.kind == "hello":
                return encode("hello_ok", meta=self.meta)
            if msg.kind == "ping":
                return encode("pong", sent=msg["sent"], server_time=time.time())
            if msg.kind != "infer":
                raise ProtocolError("unknown_kind", f"the inference server answers hello, ping and infer, "
                                    f"not {msg.kind!r}")
            request_id = msg["request_id"]
            self.last_was_infer = True
            self.stats["requests"] += 1
            return self._infer(msg, recv)
        except ProtocolError as exc:
            self.stats["errors"] += 1
            return error_frame(exc, request_id=request_id)
        except Exception as exc:  # the policy failed on this input: say so, keep serving
            self.stats["errors"] += 1
            self._warn(f"policy error on request {request_id}: {exc}")
            return error_frame("policy", f"{type(exc).__name__}: {exc}", request_id)

    def _warn(self, line: str) -> None:
        """A warning line, at most ``WARNINGS_PER_WINDOW`` per ``WARNING_WINDOW_S``: a client that
        floods bad requests gets every error reply, but cannot fill the server's log (the
        lines held back are counted in ``stats['warnings_suppressed']`` and reported)."""
        now = time.perf_counter()
        if now - self._window_start > WARNING_WINDOW_S:
            if self._held:
                log.warning("%d more policy-error warnings in the window before not logged", self._held)
            self._window_start, self._logged, self._held = now, 0, 0
        if self._logged < WARNINGS_PER_WINDOW:
            self._logged += 1
            log.warning("%s", line)
        else:
            self._held += 1
            self.stats["warnings_suppressed"] += 1

    def _infer(self, msg, recv: float) -> bytes:
        request = policy_request(msg)
        start = time.perf_counter()
        actions = np.asarray(self.policy.infer(request), np.float32)
        end = time.perf_counter()
        if not np.all(np.isfinite(actions)):
            raise ProtocolError("policy", "the policy produced NaN/inf actions; not sent")
        timing = {"queue_s": start - recv, "compute_s": end - start, "server_s": end - recv}
        return encode("chunk", request_id=msg["request_id"], actions=actions, timing=timing)

    # -- serving -----------------------------------------------------------------------
    def serve(self, stop: threading.Event | None = None, max_seconds: float | None = None) -> None:
        """Serve until ``stop`` is set (or ``max_seconds`` pass)."""
        deadline = None if max_seconds is None else time.perf_counter() + max_seconds
        log.info("serving %s on %s (chunk %d x %d)", self.meta["policy"], self.address,
                 self.meta["chunk_size"], self.meta["action_dim"])
        while not (stop is not None and stop.is_set()):
            wait_ms = 50
            if self._due or deadline is not None:
                now = time.perf_counter()
                if deadline is not None and now > deadline:
                    break
                self._flush(now)
                if self._due:
                    wait_ms = min(50, max(0, int((self._due[0][0] - now) * 1000)))
            if self.sock.poll(wait_ms):
                frames = self.sock.recv_multipart(copy=False)
                if len(frames) < 2:
                    continue
                identity, payload = frames[0].bytes, [f.buffer for f in frames[1:]]
                self.stats["clients"].add(identity)
                recv = time.perf_counter()
                reply = self.handle(payload)
                due = recv + self.min_latency_s
                if not self.last_was_infer or due <= time.perf_counter():
                    self.sock.send_multipart([identity, reply])
                else:
                    heapq.heappush(self._due, (due, self._seq, identity, reply))
                    self._seq += 1

    def _flush(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, _, identity, reply = heapq.heappop(self._due)
            self.sock.send_multipart([identity, reply])

    def close(self) -> None:
        if self.stats["warnings_suppressed"]:  # the last window's count is said, not lost
            log.warning("%d policy-error warnings were not logged (%d errors answered in all)",
                        self.stats["warnings_suppressed"], self.stats["errors"])
        self.sock.close(linger=0)
        stop_auth(self.ctx)
        self.ctx.term()
