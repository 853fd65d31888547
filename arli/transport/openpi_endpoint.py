"""``OpenPIInference``: the runtime's inference endpoint over an openpi policy server (pi0 /
pi0.5 served by openpi's ``scripts/serve_policy.py``), the base behind ``arli actor inference=openpi``.

openpi's protocol (as ``openpi_client.websocket_client_policy`` speaks it): a WebSocket; the
server first sends its metadata; then every request is one observation dict and every reply
one dict with the actions (H, M), ``server_timing`` ({"infer_ms", ...}) and maybe
``policy_timing``, all packed with openpi_client's msgpack-numpy codec (used here as is). A
text frame is an error (the server's traceback); openpi's server then closes the connection,
and this endpoint reconnects.

Never blocks the control loop: two background threads own the websocket. The sender maps,
resizes and packs what ``submit`` queued; the receiver waits in ``recv`` and stamps each reply
the moment it lands. ``poll`` takes the landed replies; latency (capture of o_t0 -> reply
received) is measured and planned from as ``RemoteInference`` does (``MeasuredLatency``).

What cannot cross: openpi's ``infer`` takes one observation, no committed prefix, delay or
guidance (its API has no RTC). The runtime's scheduler still handles the committed actions
locally: the d actions that run during inference are the previous chunk's, and the reply's
first d slots, planned for steps already past, are dropped (``naive``) or blended (``blend``)
as for any base; ``chunking.strategy=rtc`` runs, but the policy is not conditioned on the prefix.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import websockets
import websockets.sync.client
from openpi_client import msgpack_numpy

from arli.errors import InputError, require
from arli.latency import MeasuredLatency, PlansFromMeasured
from arli.logs import RateLimitedLog
from arli.transport.openpi_mapping import OpenPIConfig, OpenPIError, OpenPIMapping, last_line, timing
from arli.types import ChunkReply, ChunkRequest, Observation

__all__ = ["OpenPIConfig", "OpenPIError", "OpenPIInference"]

log = logging.getLogger("arli.openpi")

SERVER_HINT = "is openpi's policy server running there (`uv run scripts/serve_policy.py ...` in openpi, port 8000)?"


class _Connection:
    """One websocket and the ids of the requests sent on it, oldest first (openpi answers in order)."""

    def __init__(self, ws: websockets.sync.client.ClientConnection):
        self.ws = ws
        self.sent: deque[int] = deque()


class OpenPIInference(PlansFromMeasured):
    """Client of an openpi policy server for a robot of ``state_dim`` n and ``action_dim`` m.

    ``connect`` must run first: it reads the server's metadata (``meta``) and sends one
    warm-up request (a zero state and black images), whose reply gives ``chunk_size`` H and
    checks the mapping before any robot moves. ``errors``: the last 100 errors the server or
    a reply gave. ``n_obs_steps`` is 1: openpi's ``infer`` takes one observation.
    """

    n_obs_steps = 1

    def __init__(self, cfg: OpenPIConfig, dt: float, state_dim: int, action_dim: int, initial_delay_steps: int = 4,
                 quantile: float = 0.9, instruction: str = ""):
        self.mapping = OpenPIMapping(cfg, state_dim, action_dim, instruction)
        self.cfg, self.dt, self.action_dim = cfg, dt, action_dim
        self.measured = MeasuredLatency(dt, initial_delay_steps, quantile)
        self.chunk_size = 0
        self.meta: dict = {}
        self.errors: deque[str] = deque(maxlen=100)
        self._log = RateLimitedLog(log)  # a server failing every request cannot flood the robot's log
        self._packer = msgpack_numpy.Packer()
        self._conn: _Connection | None = None
        self._connected, self._stop, self._arrived = threading.Event(), threading.Event(), threading.Event()
        self._outbox: queue.Queue[tuple[int, Observation]] = queue.Queue()
        self._inbox: queue.Queue[tuple[float, int | None, object]] = queue.Queue()
        self._sent: dict[int, float] = {}  # request id -> capture timestamp of o_t0
        self._send_ts: dict[int, float] = {}
        self._threads: list[threading.Thread] = []

    # -- connection ----------------------------------------------------------------------
    def _open(self, timeout_s: float) -> _Connection:
        """Connect and read the metadata frame; an unreachable or silent server is an OpenPIError."""
        headers = {"Authorization": f"Api-Key {self.cfg.api_key}"} if self.cfg.api_key else None
        deadline = time.perf_counter() + timeout_s
        try:  # direct, as on a robot's LAN (a proxy set for the internet must not carry the control loop);
            # legacy=True: a plain long-lived connection, which the threads below own (websockets >= 17)
            ws = websockets.sync.client.connect(self.cfg.uri, compression=None, max_size=None,
                                                additional_headers=headers, open_timeout=timeout_s, proxy=None,
                                                legacy=True)
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
            raise OpenPIError(f"no openpi policy server at openpi.uri={self.cfg.uri} ({type(exc).__name__}: {exc}); "
                              f"{SERVER_HINT}") from None
        try:
            meta = msgpack_numpy.unpackb(ws.recv(timeout=max(deadline - time.perf_counter(), 0.1)))
        except (TimeoutError, websockets.exceptions.ConnectionClosed, ValueError, TypeError) as exc:
            ws.close()
            raise OpenPIError(f"{self.cfg.uri} sent no openpi metadata ({type(exc).__name__}: {exc}); "
                              f"{SERVER_HINT}") from None
        self.meta = meta if isinstance(meta, dict) else {"metadata": meta}
        return _Connection(ws)

    def connect(self, timeout_s: float | None = None) -> dict:
        """Metadata, warm-up request, then the background threads; returns the server's metadata."""
        timeout_s = self.cfg.connect_timeout_s if timeout_s is None else timeout_s
        deadline = time.perf_counter() + timeout_s
        conn = self._open(timeout_s)
        try:
            conn.ws.send(self._pack(self.mapping.probe()))
            reply = conn.ws.recv(timeout=max(deadline - time.perf_counter(), 0.1))
        except (TimeoutError, websockets.exceptions.ConnectionClosed) as exc:
            conn.ws.close()
            raise OpenPIError(f"openpi server at {self.cfg.uri} did not answer the warm-up request within "
                              f"{timeout_s:.0f} s ({type(exc).__name__}); raise openpi.connect_timeout_s if its "
                              "first call compiles for longer") from None
        if isinstance(reply, str):
            conn.ws.close()
            self.errors.append(reply)
            raise OpenPIError(f"openpi server at {self.cfg.uri} failed the warm-up request with keys "
                              f"{sorted(self.cfg.keys())}: {last_line(reply)}; map its policy's inputs with "
                              "openpi.state / openpi.images / openpi.prompt_key")
        try:
            self.chunk_size = self.mapping.actions(_unpack(reply)).shape[0]
            require(self.chunk_size >= 2, f"openpi reply {self.cfg.actions_key!r}", "a chunk of H >= 2 actions",
                    self.chunk_size)
        except InputError:
            conn.ws.close()
            raise
        self._conn = conn
        self._connected.set()
        self._threads = [threading.Thread(target=loop, name=f"openpi-{loop.__name__}", daemon=True)
                         for loop in (self._send_loop, self._receive_loop)]
        for thread in self._threads:
            thread.start()
        return self.meta

    def healthy(self) -> bool:
        return self._connected.is_set()

    def close(self) -> None:
        self._log.flush()
        self._stop.set()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.ws.close()
        for thread in self._threads:
            thread.join(timeout=2.0)

    # -- the endpoint interface ------------------------------------------------------------
    def begin_episode(self, seed: int) -> None:
        self._sent.clear()  # an answer to an earlier episode's request is not used
        self._send_ts.clear()

    def submit(self, request: ChunkRequest, history: list[Observation]) -> bool:
        """Queue the request for the sender (``history`` is not sent: openpi takes one observation)."""
        if not self._connected.is_set():
            return False
        obs = request.observation
        self.mapping.check_cameras(obs)  # here, so that a missing camera stops the loop with its name
        self._sent[request.request_id] = float(obs.timestamp)
        self._outbox.put((request.request_id, obs))
        return True

    def drain(self, timeout_s: float = 0.0) -> None:
        """Wait up to ``timeout_s`` for a reply to land (the receiver stamps it on arrival)."""
        if timeout_s > 0 and self._arrived.wait(timeout_s):
            self._arrived.clear()

    def poll(self, step: int) -> list[ChunkReply]:
        out = []
        while True:
            try:
                now, rid, payload = self._inbox.get_nowait()
            except queue.Empty:
                return out
            if isinstance(payload, str):  # the server's traceback, or why the request was not sent
                self.errors.append(payload)
                self._log.warn("openpi server %s: request %s failed: %s", self.cfg.uri, rid, last_line(payload))
                if rid in self._sent:  # given up now, re-requested by the runtime
                    self._sent.pop(rid)
                    out.append(ChunkReply(rid, None, {"error": last_line(payload)}))
                continue
            if rid not in self._sent:
                continue  # an answer to a request of an earlier episode (judged by nobody)
            try:
                actions = self.mapping.actions(payload, self.chunk_size)
            except OpenPIError as exc:
                self.errors.append(str(exc))
                raise
            capture = self._sent.pop(rid)
            record = {"latency_s": now - capture, "rtt_s": now - self._send_ts.pop(rid, now), **timing(payload)}
            self.measured.add(record["latency_s"], record)
            out.append(ChunkReply(rid, actions, record))

    # -- the background threads ------------------------------------------------------------
    def _send_loop(self) -> None:
        while not self._stop.is_set():
            try:
                rid, obs = self._outbox.get(timeout=0.2)
            except queue.Empty:
                continue
            conn = self._conn
            if conn is None or not self._connected.is_set():
                self._inbox.put((time.perf_counter(), rid, "not sent: the connection to the openpi server is down"))
                continue
            try:
                data = self._pack(obs)
            except Exception as exc:  # noqa: BLE001 - the thread must live on; poll raises it in the loop
                self._inbox.put((time.perf_counter(), rid, OpenPIError(
                    f"openpi: could not map the observation of request {rid} ({type(exc).__name__}: {exc}); "
                    "check openpi.state / openpi.images")))
                continue
            conn.sent.append(rid)
            self._send_ts[rid] = time.perf_counter()
            try:
                conn.ws.send(data)
            except websockets.exceptions.WebSocketException:
                pass  # the receiver sees the close and reconnects

    def _receive_loop(self) -> None:
        while not self._stop.is_set():
            conn = self._conn
            if conn is None or not self._connected.is_set():
                self._reconnect()
                continue
            try:
                message = conn.ws.recv(timeout=0.2)
            except TimeoutError:
                continue
            except websockets.exceptions.ConnectionClosed as exc:
                self._connected.clear()
                # the requests still in flight will never be answered: give them up now, so the
                # runtime re-requests at once instead of waiting out its request timeout
                now = time.perf_counter()
                while conn.sent:
                    self._inbox.put((now, conn.sent.popleft(), f"lost: the openpi server closed the connection ({exc})"))
                if not self._stop.is_set():
                    log.warning("openpi server %s closed the connection (%s); reconnecting", self.cfg.uri, exc)
                continue
            now = time.perf_counter()
            rid = conn.sent.popleft() if conn.sent else None
            self._inbox.put((now, rid, message if isinstance(message, str) else _unpack(message)))
            self._arrived.set()

    def _reconnect(self) -> None:
        try:
            conn = self._open(2.0)
        except OpenPIError:
            self._stop.wait(0.5)
            return
        if self._stop.is_set():
            conn.ws.close()
            return
        self._conn = conn
        self._connected.set()
        log.info("openpi server %s: reconnected", self.cfg.uri)

    def _pack(self, obs: Observation) -> bytes:
        return self._packer.pack(self.mapping.observation(obs))


def _unpack(frame: bytes) -> object:
    """A reply frame, or an OpenPIError saying it is not msgpack-numpy."""
    try:
        return msgpack_numpy.unpackb(frame)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types for bad bytes
        return OpenPIError(f"openpi reply: not a msgpack-numpy frame ({type(exc).__name__}: {exc})")
