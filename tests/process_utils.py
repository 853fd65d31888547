"""Spawning real ``arli`` processes on loopback for the pipeline tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


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
