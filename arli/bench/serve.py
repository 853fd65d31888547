"""``arli bench serve``: the inference server (``arli serve``, a real process) under 1, 2 and 4
robots at once, answering them in one batch per forward pass against one at a time, with the
built-in flow policy and a LeRobot ACT, both at random init (speed does not depend on the
weights): chunks/s and request latency p50 / p99, and the device each row ran on.

Each robot is a closed-loop DEALER client: it sends a request (two cameras, state, the
instruction, a committed prefix of 4 actions), waits for its chunk, and sends the next at
once, as robots whose requests are always due do. Requests of different robots arrive
together, which is when batching pays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from arli.bench.common import figure, machine_info, publish
from arli.bench.transport import _free_port
from arli.config import BenchServeConfig

STATE_DIM, ACTION_DIM, CHUNK, PREFIX = 20, 5, 16, 4
CAMERAS = ("front", "wrist")


def build_policy(kind: str, path: str, image_size: int) -> None:
    """A random-init checkpoint at ``path``: the built-in flow policy (the default
    hyperparameters, two cameras) or a LeRobot ACT (ResNet-18 backbone, two cameras)."""
    if kind == "flow":
        import torch  # noqa: PLC0415

        from arli.policies.flow import FlowPolicy  # noqa: PLC0415
        from arli.policies.flow_config import FlowPolicyConfig  # noqa: PLC0415

        torch.manual_seed(0)
        FlowPolicy(FlowPolicyConfig(state_dim=STATE_DIM, action_dim=ACTION_DIM, chunk_size=CHUNK,
                                    image_size=image_size, cameras=list(CAMERAS),
                                    instruction="insert the peg into the hole")).save(path)
    else:
        from arli.policies.lerobot_build import save_random_lerobot_policy  # noqa: PLC0415

        save_random_lerobot_policy("act", path, STATE_DIM, ACTION_DIM,
                                   {name: (3, image_size, image_size) for name in CAMERAS},
                                   chunk_size=CHUNK, n_action_steps=CHUNK, pretrained_backbone_weights=None)


def _serve(checkpoint: str, port: int, max_batch: int, device: str, threads: int, log) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "arli.cli", "serve", "env=peg_insert", f"checkpoint={checkpoint}",
                             f"transport.server=tcp://127.0.0.1:{port}", f"max_batch={max_batch}",
                             f"device={device}"], stdout=log, stderr=subprocess.STDOUT, env=env)


def _robots(port: int, n: int, image_size: int, timeout_s: float = 120.0) -> list:
    """``n`` DEALERs that have each had their ``hello_ok`` (the server is up and loaded)."""
    import zmq  # noqa: PLC0415

    from arli.transport.codec import decode, encode  # noqa: PLC0415
    from arli.transport.zmq_io import connect_socket  # noqa: PLC0415

    socks = [connect_socket(zmq.Context.instance(), zmq.DEALER, f"tcp://127.0.0.1:{port}") for _ in range(n)]
    deadline = time.perf_counter() + timeout_s
    for sock in socks:
        sock.send(encode("hello", role="bench"))
        while not sock.poll(100):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the server on port {port} did not answer within {timeout_s:.0f} s")
        meta = decode(sock.recv_multipart()).fields["meta"]
    return socks, meta


def closed_loop(socks: list, requests: int, warmup: int, image_size: int, bar) -> tuple[np.ndarray, float, float]:
    """Every robot keeps one request in flight until it has ``warmup + requests`` chunks ->
    (latencies in s of the measured requests, chunks/s over the measured span, the mean
    number of requests answered by the forward pass of each measured chunk, as the server
    reports it in the reply's timing)."""
    import zmq  # noqa: PLC0415

    from arli.transport.codec import decode, encode_frames  # noqa: PLC0415

    g = np.random.default_rng(0)
    images = {name: g.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8) for name in CAMERAS}
    prefix = g.uniform(-1, 1, (PREFIX, ACTION_DIM)).astype(np.float32)
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    sent, done = {}, {id(s): 0 for s in socks}
    latencies, batch_sizes, first_measured, last = [], [], None, None

    def send(sock, k):
        sent[id(sock)] = time.perf_counter()
        sock.send_multipart(encode_frames(
            "infer", request_id=k, t0=k, capture_ts=sent[id(sock)], state=g.standard_normal(STATE_DIM).astype(np.float32),
            images=images, instruction="insert the peg into the hole", delay_steps=PREFIX, committed_prefix=prefix,
            execute_horizon=8))

    for sock in socks:
        send(sock, 0)
    total = warmup + requests
    while any(v < total for v in done.values()):
        ready = poller.poll(60_000)
        if not ready:
            raise TimeoutError("no chunk from the server within 60 s (its log is in the bench's scratch directory)")
        for sock, _ in ready:
            msg = decode(sock.recv_multipart())
            now = time.perf_counter()
            if msg.kind != "chunk":
                raise RuntimeError(f"server error: {msg.fields}")
            done[id(sock)] += 1
            if done[id(sock)] > warmup:
                latencies.append(now - sent[id(sock)])
                batch_sizes.append(float(msg.fields["timing"]["batch"]))
                first_measured = first_measured or sent[id(sock)]
                last = now
                bar.update(1)
            if done[id(sock)] < total:
                send(sock, done[id(sock)])
    return np.asarray(latencies), len(latencies) / (last - first_measured), float(np.mean(batch_sizes))


def main(cfg: BenchServeConfig) -> int:
    from arli.compute import resolve_device  # noqa: PLC0415

    device = resolve_device(cfg.device)
    rows = []
    with tempfile.TemporaryDirectory(prefix="arli_bench_serve_") as scratch:
        total = len(cfg.policies) * 2 * sum(cfg.robots) * cfg.requests
        with tqdm(total=total, desc="chunks", unit="chunk", mininterval=1.0) as bar:
            for kind in cfg.policies:
                checkpoint = os.path.join(scratch, kind)
                build_policy(kind, checkpoint, cfg.image_size)
                for mode, max_batch in (("sequential", 1), ("batched", cfg.max_batch)):
                    port = _free_port()
                    with open(os.path.join(scratch, f"{kind}_{mode}.log"), "w", encoding="utf-8") as log:
                        proc = _serve(checkpoint, port, max_batch, device, cfg.threads, log)
                        try:
                            socks, meta = _robots(port, max(cfg.robots), cfg.image_size)
                            for n in cfg.robots:
                                lat, rate, mean_batch = closed_loop(socks[:n], cfg.requests, cfg.warmup,
                                                                    cfg.image_size, bar)
                                rows.append({"policy": kind, "server_policy": meta["policy"], "mode": mode,
                                             "max_batch": int(meta["max_batch"]), "robots": n,
                                             "device": meta.get("device", device), "chunks_per_s": rate,
                                             "mean_batch": mean_batch,
                                             "p50_ms": float(np.percentile(lat, 50) * 1000),
                                             "p99_ms": float(np.percentile(lat, 99) * 1000)})
                            for sock in socks:
                                sock.close(linger=0)
                        finally:
                            proc.terminate()
                            proc.wait(timeout=30)
    speedup = {}
    for kind in cfg.policies:
        for n in cfg.robots:
            seq, bat = ([r for r in rows if r["policy"] == kind and r["robots"] == n and r["mode"] == m][0]
                        for m in ("sequential", "batched"))
            speedup[f"{kind}@{n}"] = bat["chunks_per_s"] / seq["chunks_per_s"]
    payload = {"rows": rows, "batched_over_sequential_chunks_per_s": speedup, "requests": cfg.requests,
               "warmup": cfg.warmup, "threads": cfg.threads, "image_size": cfg.image_size,
               "request": f"{len(CAMERAS)} cameras {cfg.image_size}x{cfg.image_size}, {STATE_DIM}-d state, instruction, "
                          f"{PREFIX}-action committed prefix; chunk {CHUNK} x {ACTION_DIM}",
               "machine": machine_info()}
    os.makedirs(cfg.report_dir, exist_ok=True)
    with figure(os.path.join(cfg.report_dir, "serve.png"), figsize=(9, 3.6), ncols=len(cfg.policies)) as axes:
        for ax, kind in zip(np.atleast_1d(axes), cfg.policies):
            for mode, style in (("sequential", "o--"), ("batched", "s-")):
                pts = [r for r in rows if r["policy"] == kind and r["mode"] == mode]
                ax.plot([r["robots"] for r in pts], [r["chunks_per_s"] for r in pts], style, label=mode)
            ax.set_title(f"{kind} ({rows[0]['device']})")
            ax.set_xlabel("robots at once")
            ax.set_ylabel("chunks / s")
            ax.set_xticks(cfg.robots)
            ax.legend()
    md = ["# Serving: chunks/s and latency under several robots", "",
          f"`arli bench serve` — `arli serve` as a process ({cfg.threads} torch thread(s)), robots as closed-loop "
          f"clients on loopback, {cfg.requests} measured requests per robot after {cfg.warmup} warm-up; each request "
          f"{payload['request']}. *sequential*: `max_batch=1`; *batched*: `max_batch={cfg.max_batch}` (the requests "
          "waiting together go through one forward pass; *mean batch*: requests per forward pass, as the server "
          "reports it in each reply). Both policies at random init.", "",
          "| policy | device | robots | mode | chunks/s | p50 (ms) | p99 (ms) | mean batch |",
          "|---|---|---:|---|---:|---:|---:|---:|"]
    md += [f"| {r['policy']} ({r['server_policy']}) | {r['device']} | {r['robots']} | {r['mode']} | "
           f"{r['chunks_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['mean_batch']:.2f} |" for r in rows]
    md += ["", "Batched / sequential chunks/s: " + ", ".join(f"{k} {v:.2f}x" for k, v in speedup.items()), "",
           "![chunks/s](serve.png)", "", f"Machine: {machine_info()}", ""]
    return publish(cfg.report_dir, "serve", payload, md, slice(4, 6 + len(rows)), speedup if cfg.json else None)
