"""ZeroMQ sockets with optional CurveZMQ encryption + authentication, and a connection
monitor (so a robot knows within one control period that its server is gone).

Key files (``arli keys dir=...``, ``zmq.auth`` format): ``server.key`` / ``server.key_secret``
for servers, ``client.key`` / ``client.key_secret`` for clients, and ``authorized/`` holding
the public keys of the clients a server accepts.
"""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass, field

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from arli.errors import require


@dataclass
class CurveConfig:
    """``transport.curve``: CurveZMQ encryption and client authentication."""

    enabled: bool = False
    keys_dir: str = "keys"  # written by `arli keys`

    def path(self, name: str) -> str:
        path = os.path.join(self.keys_dir, name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"CURVE key file {path} not found; generate keys with "
                                    f"`arli keys dir={self.keys_dir}` or set curve.enabled=false")
        return path


@dataclass
class TransportConfig:
    """The ``transport`` group: where each service listens (the bind side uses the port with
    ``tcp://*``) and CurveZMQ."""

    server: str = "tcp://127.0.0.1:5555"  # inference server (robot -> GPU machine)
    learner: str = "tcp://127.0.0.1:5556"  # transitions (robot -> workstation)
    weights: str = "tcp://127.0.0.1:5557"  # weights (workstation -> robots)
    curve: CurveConfig = field(default_factory=CurveConfig)

    def validate(self) -> None:
        for name in ("server", "learner", "weights"):
            value = getattr(self, name)
            require(value.startswith(("tcp://", "ipc://", "inproc://")), f"transport.{name}",
                    "a ZeroMQ address like tcp://host:port", value)


def bind_address(address: str) -> str:
    """tcp://host:port -> tcp://*:port (what a service binds)."""
    if address.startswith("tcp://"):
        return "tcp://*:" + address.rsplit(":", 1)[1]
    return address


def generate_keys(keys_dir: str, clients: int = 1) -> list[str]:
    """Server + client key pairs into ``keys_dir``; client public keys are authorised."""
    os.makedirs(keys_dir, exist_ok=True)
    authorized = os.path.join(keys_dir, "authorized")
    os.makedirs(authorized, exist_ok=True)
    written = list(zmq.auth.create_certificates(keys_dir, "server"))
    for i in range(clients):
        name = "client" if i == 0 else f"client{i}"
        public, secret = zmq.auth.create_certificates(keys_dir, name)
        shutil.copy(public, os.path.join(authorized, os.path.basename(public)))
        written += [public, secret]
    return written


_AUTHENTICATORS: dict[int, ThreadAuthenticator] = {}

# Kernel socket buffers of a few messages: the default (~200 KB here) is smaller than one
# request with two 224 x 224 x 3 images (0.3 MB), so each send took several wake-ups of
# ZeroMQ's I/O thread. Measured with a raw echo of such a request on loopback (a throwaway
# script, not a committed bench): p50 0.54 -> 0.45 ms, p99 0.76 -> 0.64 ms
SOCKET_BUFFER_BYTES = 4 << 20


def _tune(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)


def bind_socket(ctx: zmq.Context, kind: int, address: str, curve: CurveConfig | None = None) -> zmq.Socket:
    """A server-side socket bound to ``address``; with CURVE only authorised clients connect."""
    sock = ctx.socket(kind)
    _tune(sock)
    if curve is not None and curve.enabled:
        if id(ctx) not in _AUTHENTICATORS:
            auth = ThreadAuthenticator(ctx)
            auth.start()
            auth.configure_curve(domain="*", location=curve.path("authorized"))
            _AUTHENTICATORS[id(ctx)] = auth
        public, secret = zmq.auth.load_certificate(curve.path("server.key_secret"))
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    sock.bind(address)
    return sock


def stop_auth(ctx: zmq.Context) -> None:
    auth = _AUTHENTICATORS.pop(id(ctx), None)
    if auth is not None:
        auth.stop()


def connect_socket(ctx: zmq.Context, kind: int, address: str, curve: CurveConfig | None = None) -> zmq.Socket:
    """A client-side socket (``client_socket``), connected to ``address``."""
    sock = client_socket(ctx, kind, curve)
    sock.connect(address)
    return sock


def client_socket(ctx: zmq.Context, kind: int, curve: CurveConfig | None = None) -> zmq.Socket:
    """A client-side socket, not yet connected (attach a ``ConnectionMonitor`` first: a
    handshake that completes before the monitor exists is never reported); IMMEDIATE so
    nothing queues for a peer that is not connected."""
    sock = ctx.socket(kind)
    _tune(sock)
    if kind in (zmq.DEALER, zmq.REQ, zmq.PUSH):
        sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    if curve is not None and curve.enabled:
        public, secret = zmq.auth.load_certificate(curve.path("client.key_secret"))
        server_public, _ = zmq.auth.load_certificate(curve.path("server.key"))
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server_public
    return sock


_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
         | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_CLOSED)


_MONITOR_IDS = itertools.count()


class ConnectionMonitor:
    """Tracks whether ``sock`` has a live, handshaken connection (ZMQ socket monitor events)."""

    def __init__(self, sock: zmq.Socket):
        # pyzmq's default endpoint, inproc://monitor.s-<fd>, is still bound while a closed
        # socket with the same fd number is reaped, so a new socket reusing the fd gets
        # EADDRINUSE: a per-process unique name cannot collide
        self._sock = sock
        name = f"inproc://arli-monitor-{os.getpid()}-{next(_MONITOR_IDS)}"
        self._mon = sock.get_monitor_socket(_UP | _DOWN, addr=name)
        self.connected = False
        self.disconnects = 0

    def update(self) -> bool:
        """Drain pending events; returns whether connected now."""
        while self._mon.poll(0):
            event = recv_monitor_message(self._mon)["event"]
            if event & _UP:
                self.connected = True
            elif event & _DOWN:
                self.disconnects += int(self.connected)
                self.connected = False
        return self.connected

    def close(self) -> None:
        if not self._sock.closed:
            self._sock.disable_monitor()
        self._mon.close(linger=0)
