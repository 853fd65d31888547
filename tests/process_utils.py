"""Spawning real ``arli`` processes on loopback for the pipeline tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    """``n`` ports free now, below the ephemeral range (``free_port_block``): a server a test
    binds late, or binds again after a restart, cannot find one taken by another worker's
    outgoing connection."""
    first = free_port_block(n)
    return list(range(first, first + n))


def free_port_block(n: int) -> int:
    """The first of ``n`` consecutive ports that are free now, below Linux's ephemeral range
    (32768-60999), so no connection of a test on another pytest worker is handed one of them
    (``arli launch`` binds base_port .. base_port + 2 itself)."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20_000, 32_768 - n)
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in 20000-32767")


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    fh = open(log, "w", encoding="utf-8")
    return subprocess.Popen([sys.executable, "-m", "arli.cli", *args], cwd=ROOT, stdout=fh,
                            stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 20) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextmanager
def running(args: list[str], log: Path):
    proc = spawn(args, log)
    try:
        yield proc
    finally:
        stop(proc)


@contextmanager
def franky_sim_server(host: str, timeout: float = 60.0):
    """A franky-sim MuJoCo Franka speaking the libfranka protocol on ``host`` (a loopback
    address: each server takes the fixed FCI port 1337, so tests use distinct hosts)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "franky_sim.run_server", "-s", "mujoco",
                             "--hostname", host], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    _ahead_of_tests(proc.pid)
    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Connect to the server" in line:
                break
        else:
            raise RuntimeError("franky-sim did not start:\n" + "".join(lines))
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=timeout)


def _ahead_of_tests(pid: int) -> None:
    """Run the simulated arm ahead of the test workers where the OS allows it (CAP_SYS_NICE; a
    no-op elsewhere): it stands in for the Franka's own real-time controller, which no other work
    on the host can starve, and with a pytest worker per core it otherwise misses libfranka's
    UDP deadline now and then."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, -10)
    except PermissionError:
        pass


@contextmanager
def serving_in_thread(policy, **server_kw):
    """A real ``InferenceServer`` serving ``policy`` on a thread of this process -> its address."""
    import threading  # noqa: PLC0415

    from arli.runtime.server import InferenceServer  # noqa: PLC0415

    address = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    server = InferenceServer(policy, address, **server_kw)
    stop_event = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop_event,), daemon=True)
    thread.start()
    try:
        yield address
    finally:
        stop_event.set()
        thread.join()
        server.close()
