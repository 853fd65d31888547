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
import math
import logging
import threading
import time
from typing import Any

import numpy as np
import zmq

import arli
from arli.policies.base import BasePolicy, BatchRequestError
from arli.logs import RateLimitedLog
from arli.transport.codec import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, ProtocolError, decode, encode, error_frame
from arli.transport.zmq_io import CurveConfig, bind_socket, stop_auth
from arli.types import Observation, PolicyRequest

log = logging.getLogger("arli.serve")


_UINT8, _F32 = np.dtype(np.uint8), np.dtype(np.float32)


def _as_actions(chunk) -> np.ndarray:
    """A policy's chunk as a C-contiguous float32 array (itself when it is one already)."""
    if type(chunk) is np.ndarray and chunk.dtype == _F32 and chunk.flags.c_contiguous:
        return chunk
    return np.asarray(chunk, np.float32, order="C")  # not ascontiguousarray: it makes a 0-d chunk 1-d


_PYTHON_SUM_MAX = 2048  # chunks up to this many values are checked by a Python sum (50 x 32 is 1600)


def _finite(actions: np.ndarray) -> bool:
    """Whether a C-contiguous float32 array holds no NaN/inf: both propagate through a sum done
    in double precision (float32 values cannot overflow it). Up to ``_PYTHON_SUM_MAX`` values, a
    Python sum over the buffer rather than numpy: this runs right after the policy call, where
    numpy's reduction machinery ran several times slower than back to back and was the reply
    path's largest cost; above that the Python loop's own time (~7 ns a value) would be."""
    if actions.size == 0:
        return True
    if actions.size > _PYTHON_SUM_MAX:
        return math.isfinite(float(actions.sum(dtype=np.float64)))
    return math.isfinite(sum(memoryview(actions).cast("B").cast("f")))


def _images(value, where: str, expected: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """An ``images`` map off the wire: camera name -> (h, w, 3) uint8, or a schema error
    naming the camera and, when the policy reads that camera at a fixed size (``expected``:
    name -> [h, w, 3], 0 for a size it does not fix), the shape it takes."""
    if not isinstance(value, dict):
        raise ProtocolError("schema", f"{where}: images must be a map of camera name -> image")
    out = {}
    for name, image in value.items():
        if not isinstance(name, str) or not isinstance(image, np.ndarray) or image.ndim != 3 \
                or image.shape[2] != 3 or image.dtype != _UINT8:
            got = f"{image.shape} {image.dtype}" if isinstance(image, np.ndarray) else type(image).__name__
            shape = (expected or {}).get(name) if isinstance(name, str) else None
            fixed = shape is not None and all(shape)  # 0: a size the policy does not fix
            want = f"a {tuple(shape)} uint8 image (as the policy reads it)" if fixed else "an (h, w, 3) uint8 image"
            raise ProtocolError("schema", f"{where}: camera {name!r} must be {want}, got {got}")
        out[name] = image
    return out


def policy_request(msg, cameras: dict[str, list[int]] | None = None) -> PolicyRequest:
    """An ``infer`` message -> the typed request every policy takes: every camera by name,
    the instruction, the committed prefix, delay, guidance, execute horizon and history.
    ``cameras`` (name -> [h, w, 3], the policy's) only makes a bad image's error name the
    shape that camera needs."""
    history = []
    for i, h in enumerate(msg.get("history") or []):
        if not isinstance(h, dict) or not isinstance(h.get("state"), np.ndarray) or h["state"].ndim != 1:
            raise ProtocolError("schema", f"infer: history[{i}] must be a map with a 1-d state array")
        history.append(Observation(np.array(h["state"], np.float32), -1,
                                   images=_images(h.get("images") or {}, f"infer: history[{i}]", cameras)))
    obs = Observation(np.array(msg["state"], _F32), int(msg["t0"]), float(msg["capture_ts"]),
                      _images(msg.get("images") or {}, "infer", cameras), msg.get("instruction") or "")
    return PolicyRequest(obs, msg.get("committed_prefix"), int(msg["delay_steps"]), msg.get("guidance"),
                         msg.get("execute_horizon"), tuple(history) if "history" in msg.fields else None)


class InferenceServer:
    def __init__(self, policy: BasePolicy, address: str, meta: dict[str, Any] | None = None,
                 min_latency_s: float = 0.0, curve: CurveConfig | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES, max_batch: int = 8, batch_wait_s: float = 0.002):
        self.policy, self.address, self.min_latency_s, self.max_bytes = policy, address, min_latency_s, max_bytes
        # requests waiting together are answered by one forward pass when the policy batches
        self.max_batch = max(1, int(max_batch))
        self.batching = self.max_batch > 1 and bool(getattr(policy, "batchable", False))
        self.batch_wait_s = batch_wait_s
        self._seen: dict[bytes, float] = {}  # robot identity -> when its last request arrived
        self._last_batch: set[bytes] = set()  # the robots answered together last time
        self._answered: dict[bytes, float] = {}  # robot identity -> when its last chunk left (batching)
        self.meta = {"chunk_size": int(policy.chunk_size), "action_dim": int(policy.action_dim),
                     "n_obs_steps": int(policy.n_obs_steps), "max_batch": self.max_batch if self.batching else 1,
                     # what each request must carry: camera name -> [h, w, 3] (uint8)
                     "cameras": {k: list(v) for k, v in (getattr(policy, "camera_shapes", dict)() or {}).items()},
                     "policy": type(policy).__name__, "protocol": PROTOCOL_VERSION,
                     "arli": arli.__version__, **(meta or {})}
        self.ctx = zmq.Context()
        self.sock = bind_socket(self.ctx, zmq.ROUTER, address, curve)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._poller = zmq.Poller()  # only to wait for a batch's other robots
        self._poller.register(self.sock, zmq.POLLIN)
        self._timeout_ms = -1  # the socket's receive timeout (RCVTIMEO) now
        self._due: list[tuple[float, int, bytes, bytes]] = []  # (send at, seq, identity, frame)
        self._seq = 0
        self.stats = {"requests": 0, "errors": 0, "warnings_suppressed": 0, "batches": 0, "batched_requests": 0,
                      "clients": set()}
        # a client that floods bad requests gets every error reply, but cannot fill the log
        self._log = RateLimitedLog(log)

    # -- messages ----------------------------------------------------------------------
    def handle(self, frame) -> bytes:
        """Reply frame for one request (a frame, or [body, data frames...]); never raises."""
        return self.handle_many([frame])[0][0]

    def handle_many(self, frames: list) -> list[tuple[bytes, bool]]:
        """(reply, answers an infer) for each of several requests received together; never
        raises. Their ``infer`` requests go through one ``infer_batch`` call when the policy
        batches (several robots, one forward pass); a bad message gets its own error reply
        and does not hold up the others."""
        recv = time.perf_counter()
        replies: list[tuple[bytes, bool] | None] = [None] * len(frames)
        pending: list[tuple[int, int, PolicyRequest]] = []  # (index, request id, request)
        for i, frame in enumerate(frames):
            request_id = None
            try:
                msg = decode(frame, self.max_bytes)
                if msg.kind == "hello":
                    replies[i] = (encode("hello_ok", meta=self.meta), False)
                elif msg.kind == "ping":
                    replies[i] = (encode("pong", sent=msg["sent"], server_time=time.time()), False)
                elif msg.kind != "infer":
                    raise ProtocolError("unknown_kind", f"the inference server answers hello, ping and infer, "
                                        f"not {msg.kind!r}")
                else:
                    request_id = msg["request_id"]
                    self.stats["requests"] += 1
                    pending.append((i, request_id, policy_request(msg, self.meta["cameras"])))
            except ProtocolError as exc:
                self.stats["errors"] += 1
                replies[i] = (error_frame(exc, request_id=request_id), request_id is not None)
            except Exception as exc:  # a request the policy's types cannot take: say so, keep serving
                self.stats["errors"] += 1
                self._warn(f"bad request {request_id}: {exc}")
                replies[i] = (error_frame("policy", f"{type(exc).__name__}: {exc}", request_id), request_id is not None)
        batches = [pending] if self.batching and len(pending) > 1 else [[p] for p in pending]
        for batch in batches:
            for i, reply in self._infer(batch, recv):
                replies[i] = (reply, True)
        return replies

    def _infer(self, batch: list[tuple[int, int, PolicyRequest]], recv: float) -> list[tuple[int, bytes]]:
        """Replies for a batch of requests: one policy call for all of them; if that call fails,
        each is answered alone so that the bad one gets the error and the others their chunk."""
        start = time.perf_counter()
        try:
            if len(batch) > 1:
                chunks = self.policy.infer_batch([r for _, _, r in batch])
            else:
                chunks = [self.policy.infer(batch[0][2])]
        except BatchRequestError as exc:  # one robot's request does not fit: it alone gets the error
            if len(batch) > 1 and 0 <= exc.index < len(batch):
                rest = batch[:exc.index] + batch[exc.index + 1:]
                return self._infer([batch[exc.index]], recv) + self._infer(rest, recv)
            if len(batch) > 1:
                return [reply for one in batch for reply in self._infer([one], recv)]
            return self._policy_error(batch, exc)
        except Exception as exc:  # the policy failed on this input: say so, keep serving
            if len(batch) > 1:  # which request it was is unknown: each is answered alone
                self._warn(f"a batch of {len(batch)} failed ({type(exc).__name__}: {exc}); answering each alone")
                return [reply for one in batch for reply in self._infer([one], recv)]
            return self._policy_error(batch, exc)
        end = time.perf_counter()
        out = []
        timing = {"queue_s": start - recv, "compute_s": end - start, "server_s": end - recv, "batch": len(batch)}
        for (i, request_id, _), chunk in zip(batch, chunks):
            actions = _as_actions(chunk)
            if actions.ndim != 2 or not _finite(actions):
                self.stats["errors"] += 1
                why = "NaN/inf actions" if actions.ndim == 2 else f"actions of shape {actions.shape}, not (H, m)"
                out.append((i, error_frame("policy", f"the policy produced {why}; not sent", request_id)))
                continue
            # checked above field by field: the schema check would only repeat it
            out.append((i, encode("chunk", check=False, request_id=request_id, actions=actions, timing=timing)))
        self.stats["batches"] += 1
        self.stats["batched_requests"] += len(batch)
        return out

    def _policy_error(self, batch: list[tuple[int, int, PolicyRequest]], exc: Exception) -> list[tuple[int, bytes]]:
        (i, request_id, _), = batch
        self.stats["errors"] += 1
        self._warn(f"policy error on request {request_id}: {exc}")
        message = exc.detail if isinstance(exc, BatchRequestError) else str(exc)
        return [(i, error_frame("policy", f"{type(exc).__name__}: {message}", request_id))]

    def _warn(self, line: str) -> None:
        """A warning line within the log's budget; those held back are counted in
        ``stats['warnings_suppressed']``."""
        if not self._log.warn("%s", line):
            self.stats["warnings_suppressed"] += 1

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
            if wait_ms != self._timeout_ms:  # a blocking receive with a timeout: no poll per request
                self.sock.setsockopt(zmq.RCVTIMEO, wait_ms)
                self._timeout_ms = wait_ms
            try:
                first = self.sock.recv_multipart(copy=False)
            except zmq.Again:
                continue
            identities, payloads = self._receive_batch(first)
            if not payloads:
                continue
            self.stats["clients"].update(identities)
            recv = time.perf_counter()
            due = recv + self.min_latency_s
            for identity, (reply, is_infer) in zip(identities, self.handle_many(payloads)):
                sent = time.perf_counter()
                if not is_infer or due <= sent:
                    self.sock.send_multipart([identity, reply])
                else:
                    heapq.heappush(self._due, (due, self._seq, identity, reply))
                    self._seq += 1
                if is_infer and self.batching:
                    self._answered[identity] = max(sent, due)  # when its chunk reaches it

    def _receive_batch(self, frames: list) -> tuple[list[bytes], list]:
        """When batching: every request already waiting (up to ``max_batch``), and for up to
        ``batch_wait_s`` more those of the robots answered with the last batch and of the
        robots whose chunk left less than ``batch_wait_s`` ago: a robot whose requests are
        always due re-sends a moment after its chunk arrives, and without the wait two such
        robots take turns being answered alone for good (each request arriving while the
        other's is computed), as a fleet splits into half-size batches. Otherwise the one
        request received."""
        if not self.batching:  # one at a time: each reply leaves as soon as its own chunk is ready
            return ([frames[0].bytes], [[f.buffer for f in frames[1:]]]) if len(frames) >= 2 else ([], [])
        identities, payloads = [], []
        deadline = None
        while True:
            now = time.perf_counter()
            if len(frames) >= 2:
                identities.append(frames[0].bytes)
                payloads.append([f.buffer for f in frames[1:]])
                self._seen[identities[-1]] = now
            if len(payloads) >= self.max_batch:
                break
            if not self.sock.get(zmq.EVENTS) & zmq.POLLIN:
                # wait only for robots about to re-send: those answered together last time, and
                # those whose chunk has just reached them
                waiting_for = [i for i in self._last_batch if i not in identities and now - self._seen[i] < 1.0] \
                    + [i for i, t in self._answered.items() if i not in identities and 0 <= now - t < self.batch_wait_s]
                deadline = deadline or now + self.batch_wait_s
                if not waiting_for or now >= deadline or not self._poller.poll(max(0.0, deadline - now) * 1000):
                    break
            frames = self.sock.recv_multipart(copy=False)
        if len(self._seen) > 4 * self.max_batch + 64:  # forget robots gone for good
            self._seen = {i: t for i, t in self._seen.items() if now - t < 1.0}
            self._answered = {i: t for i, t in self._answered.items() if now - t < 1.0}
        self._last_batch = set(identities) if len(identities) > 1 else set()
        return identities, payloads

    def _flush(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, _, identity, reply = heapq.heappop(self._due)
            self.sock.send_multipart([identity, reply])

    def close(self) -> None:
        if self.stats["warnings_suppressed"]:  # the total is said, not lost
            log.warning("%d policy-error warnings were not logged (%d errors answered in all)",
                        self.stats["warnings_suppressed"], self.stats["errors"])
        self.sock.close(linger=0)
        stop_auth(self.ctx)
        self.ctx.term()
