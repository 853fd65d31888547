"""The actor's link to the learner: transitions out (acknowledged, spooled), weights in.

Runs in a background thread that owns its two sockets, so the control loop never waits on
the network. Transitions are batched into numbered batches (``seq`` 1, 2, ...) kept in a
bounded spool until the learner reports them *durable* (written to a checkpoint). Every
``ack`` carries the learner's ``applied_seq`` for this actor: the link resends from
``applied_seq + 1``, so after a learner crash and restart from its checkpoint each batch
lands exactly once (the learner ignores seqs it has applied and refuses gaps). A link first
sends a hello (seq 0, no rows) and numbers its batches after the learner's ``applied_seq`` for
its actor id, so an actor restarted under its id is not taken for a duplicate. When the
spool overflows (the learner away for hours) its oldest batches lose their rows but keep
their seqs: the whole run of them is sent as one placeholder of no rows (seqs ``seq`` to
``through``) that says how many rows were lost, so the learner counts the loss and the seqs
after it still land, one round trip for any length of outage (a learner that refuses the
range gets one placeholder per seq; one that refuses the count, bare placeholders). Weights
come over PUB/SUB with conflation: only the newest version is ever kept.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections import deque

import numpy as np
import zmq
import zmq.auth

from arli.transport.codec import ProtocolError, decode, encode
from arli.transport.zmq_io import CurveConfig, connect_socket

log = logging.getLogger("arli.link")

HOLES_RANGED, HOLES_SINGLE, HOLES_PLAIN = 0, 1, 2
_UNKNOWN_FIELDS = re.compile(r"unknown field\(s\) \[([^\]]*)\]")  # the codec's refusal (not its ``allowed`` list)


class LearnerLink:
    def __init__(self, actor_id: str, transitions_addr: str, weights_addr: str,
                 curve: CurveConfig | None = None, batch_rows: int = 64, flush_s: float = 0.5,
                 spool_max_rows: int = 500_000, ack_timeout_s: float = 1.0):
        self.actor_id, self.curve = actor_id, curve
        self.transitions_addr, self.weights_addr = transitions_addr, weights_addr
        self.batch_rows, self.flush_s, self.ack_timeout_s = batch_rows, flush_s, ack_timeout_s
        self.spool_max_rows = spool_max_rows
        self._lock = threading.Lock()
        self._rows: list[np.ndarray] = []
        self._episodes: list[dict] = []
        self._oldest = 0.0
        self.spool: deque[tuple[int, bytes, int]] = deque()  # (seq, frame, rows), not yet durable
        self.spool_rows = 0
        self.next_seq, self.send_from, self.applied, self.durable = 1, 1, 0, 0
        # spool overflow (the learner was away too long): rows and episode ends let go before the learner
        # made them durable; the learner's ``lost_rows`` counts those of them it never applied
        self.dropped_rows = self.dropped_episodes = 0
        # the seqs of the batches dropped, with their row counts: consecutive, and all older than
        # the spool's (a few bytes each where a batch of 64 rows is ~10 KB)
        self.holes: deque[tuple[int, int]] = deque()
        # how holes are sent: one ranged placeholder with the count; one per seq with its count (a learner
        # refused ``through``); one per seq, bare (a learner of the previous protocol refused ``dropped``)
        self._hole_mode = HOLES_RANGED
        self.sent_rows = 0
        self._weights: tuple[int, dict, dict] | None = None
        self.weights_version = 0
        self.learner_done = False  # an ack said the learner reached its target
        self._finishing = False  # ``finish``: the queue leaves, then the last-batch marker
        self._marker_seq = 0  # the marker's seq once sent
        self._marker_refused = False  # a learner of the previous protocol refused the marker
        # batches are numbered from what the learner has applied for this actor id (an earlier run
        # of the same actor): until it answers the hello, spooled batches are numbered from 1
        self._based = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link-{actor_id}", daemon=True)

    # -- control-loop side (thread-safe, never blocks on the network) -----------------------
    def start(self) -> "LearnerLink":
        self._thread.start()
        return self

    def add_row(self, row: np.ndarray) -> None:
        with self._lock:
            if not self._rows:
                self._oldest = time.perf_counter()
            self._rows.append(np.asarray(row, np.float32))

    def add_episode(self, info: dict) -> None:
        with self._lock:
            self._episodes.append(info)
            if not self._rows:
                self._oldest = time.perf_counter()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def take_weights(self) -> tuple[int, dict, dict] | None:
        """The newest weights (version, arrays, meta) if they changed since the last call."""
        with self._lock:
            w, self._weights = self._weights, None
        return w

    def pending_rows(self) -> int:
        with self._lock:
            return len(self._rows) + self.spool_rows

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every row handed over has been applied by the learner."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            with self._lock:
                queued = bool(self._rows or self._episodes or self._finishing)
                settled = self.applied + int(self._marker_refused and self._marker_seq == self.applied + 1)
                done = not queued and settled >= self.next_seq - 1
            if done:
                return True
            time.sleep(0.02)
        return False

    def finish(self, timeout_s: float = 10.0) -> bool:
        """The actor has stopped: send what is queued, then a batch of no rows marked ``last`` (the
        learner need not wait for more), and wait until the learner has applied both (a learner
        of the previous protocol refuses the marker: then until it has applied the rows)."""
        with self._lock:
            self._finishing = True
        return self.flush(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # -- network thread ---------------------------------------------------------------------
    def _batch(self, force: bool = False) -> None:
        with self._lock:
            due = bool(self._rows or self._episodes)
            # once finishing, what is queued leaves at once, then the marker alone (zero rows): a
            # learner of the previous protocol refuses the marker's field, and loses no rows for it
            marker = self._finishing and not due
            if not (due or marker) or (not force and not self._finishing and len(self._rows) < self.batch_rows
                                        and time.perf_counter() - self._oldest < self.flush_s):
                return
            rows, self._rows = self._rows, []
            episodes, self._episodes = self._episodes, []
            seq = self.next_seq  # reserved before the lock is let go: ``flush`` waits for it from now on
            self.next_seq += 1
            if marker:
                self._finishing, self._marker_seq = False, seq
        data = np.stack(rows) if rows else np.zeros((0, 1), np.float32)
        frame = encode("transitions", actor_id=self.actor_id, seq=seq, rows=data, episodes=episodes,
                       **({"last": True} if marker else {}))
        with self._lock:
            self.spool.append((seq, frame, len(rows)))
            self.spool_rows += len(rows)
            while self.spool_rows > self.spool_max_rows and len(self.spool) > 1:
                old, lost, n = self.spool.popleft()  # oldest first: bounded memory, loss counted
                episodes = len(decode(lost).get("episodes", []))  # an episode's end can travel without rows
                self.spool_rows -= n
                self.dropped_rows += n
                self.dropped_episodes += episodes
                self.holes.append((old, n))  # a learner that has not applied it must still hear of its seq
                log.warning("spool full (%d rows): dropped batch %d (%d rows, %d episode ends); the learner is told "
                            "of the rows", self.spool_max_rows, old, n, episodes)

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        dealer = connect_socket(ctx, zmq.DEALER, self.transitions_addr, self.curve)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.CONFLATE, 1)  # keep only the newest weights
        if self.curve is not None and self.curve.enabled:
            public, secret = zmq.auth.load_certificate(self.curve.path("client.key_secret"))
            sub.curve_secretkey, sub.curve_publickey = secret, public
            sub.curve_serverkey, _ = zmq.auth.load_certificate(self.curve.path("server.key"))
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.weights_addr)
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        waiting: tuple[int, float] | None = None
        refused = 0  # the last batch the learner refused (-1: the hello)
        # seq 0 applies nothing (every learner takes it as a duplicate) and is answered with the
        # learner's applied_seq for this actor id
        hello, hello_at = encode("transitions", actor_id=self.actor_id, seq=0, rows=np.zeros((0, 1), np.float32)), 0.0
        try:
            while not self._stop.is_set():
                self._batch()
                if not self._based:
                    if time.perf_counter() - hello_at > self.ack_timeout_s:
                        try:
                            dealer.send(hello, zmq.NOBLOCK)
                            hello_at = time.perf_counter()
                        except zmq.Again:
                            pass
                elif waiting is None:
                    item = self._next_to_send()
                    if item is not None:
                        try:
                            dealer.send(item[1], zmq.NOBLOCK)
                            waiting = (item[0], time.perf_counter())
                        except zmq.Again:
                            pass  # no learner connected: keep spooling
                elif time.perf_counter() - waiting[1] > self.ack_timeout_s:
                    waiting = None  # lost (learner died?): resend from applied + 1
                    self.send_from = self.applied + 1
                for sock, _ in poller.poll(20):
                    try:
                        msg = decode(sock.recv_multipart(zmq.NOBLOCK))
                    except (ProtocolError, zmq.Again) as exc:
                        log.warning("bad message from the learner: %s", exc)
                        continue
                    if msg.kind == "ack":
                        if not self._based:
                            self._number_from(msg["applied_seq"])
                        self._on_ack(msg["applied_seq"], msg["durable_seq"])
                        self.learner_done = self.learner_done or bool(msg.get("learner_done", False))
                        waiting = None
                    elif msg.kind == "error" and not self._based and refused != -1:
                        refused = -1  # the hello: resent each ack_timeout_s, said once
                        log.error("the learner refused this actor's hello (%s: %s); nothing is sent until a learner "
                                  "takes it: run the actor with the learner's version", msg["code"], msg["message"])
                    elif msg.kind == "error" and waiting is not None and waiting[0] == self._marker_seq:
                        with self._lock:  # the marker carries nothing: not resent, the link is done
                            self._marker_refused = True
                            self.spool = deque(b for b in self.spool if b[0] != waiting[0])
                        log.info("the learner does not take the last-batch marker (%s): an older learner", msg["message"])
                        waiting = None
                    elif (msg.kind == "error" and waiting is not None
                          and self._on_hole_refused(msg["code"], msg["message"])):
                        if self._is_hole(waiting[0]):
                            waiting = None  # resent at once in the mode the refusal asked for
                        # else a late copy about an earlier placeholder (a batch of rows never carries
                        # those fields): the batch in flight waits on its own ack
                    elif msg.kind == "error" and waiting is not None and waiting[0] != refused:
                        refused = waiting[0]  # resent after ack_timeout_s: said once per batch
                        log.error("the learner refused batch %d (%s: %s); it is resent until a learner takes it: run "
                                  "the actor with the learner's config and version", refused, msg["code"], msg["message"])
                    elif msg.kind == "weights":
                        with self._lock:
                            self._weights = (msg["version"], msg["arrays"], msg.get("meta", {}))
                            self.weights_version = msg["version"]
        finally:
            dealer.close(linger=0)
            sub.close(linger=0)

    def _on_hole_refused(self, code: str, message: str) -> bool:
        """A learner refused a placeholder: if for a field it does not know (an older learner), send
        the next ones without it and say so once. An error does not say which send it answers, so a
        late copy of an earlier refusal can arrive after the fallback: the mode only ever moves to
        what the named fields ask for, never a step per error. False: not a placeholder field."""
        named = _UNKNOWN_FIELDS.search(message) if code == "schema" else None
        unknown = named.group(1) if named else ""
        mode = HOLES_PLAIN if "'dropped'" in unknown else HOLES_SINGLE if "'through'" in unknown else None
        if mode is None:
            return False
        if mode > self._hole_mode:
            self._hole_mode = mode  # batches of no rows it applies: at worst the loss is only logged here
            log.warning("the learner does not take %s (%s): an older learner; placeholders go %s",
                        *(("a range of seqs", message, "one per seq") if mode == HOLES_SINGLE else
                          ("the dropped-rows count", message, "one per seq, without it")))
        return True

    def _is_hole(self, seq: int) -> bool:
        with self._lock:
            return bool(self.holes) and self.holes[0][0] <= seq <= self.holes[-1][0]

    def _next_to_send(self) -> tuple[int, bytes] | None:
        """The first batch from ``send_from`` on: a dropped batch's placeholder, or a spooled frame."""
        with self._lock:
            if self.holes and self.send_from <= self.holes[-1][0]:
                first, last = self.holes[0][0], self.holes[-1][0]
                consecutive = last - first == len(self.holes) - 1  # as spooled batches drop, oldest first
                i = (max(0, self.send_from - first) if consecutive else
                     next(k for k, (s, _) in enumerate(self.holes) if s >= self.send_from))
                seq, lost = self.holes[i]
                if self._hole_mode == HOLES_RANGED and consecutive and last > seq:
                    fields = {"dropped": sum(n for _, n in itertools.islice(self.holes, i, None)), "through": last}
                else:
                    fields = {} if self._hole_mode == HOLES_PLAIN else {"dropped": lost}
                return seq, encode("transitions", actor_id=self.actor_id, seq=seq,
                                   rows=np.zeros((0, 1), np.float32), **fields)
            return next(((s, f) for s, f, _ in self.spool if s >= self.send_from), None)

    def _number_from(self, base: int) -> None:
        """Renumber the spooled batches after ``base``, the last batch the learner applied for this
        actor id before this link started (else they would be taken as duplicates and lost)."""
        with self._lock:
            if base:
                log.info("the learner has applied %d batches of actor id %s from an earlier run: numbering from %d",
                         base, self.actor_id, base + 1)
                self.spool = deque((seq + base, encode("transitions", **{**decode(frame).fields, "seq": seq + base}), n)
                                   for seq, frame, n in self.spool)
                self.holes = deque((seq + base, n) for seq, n in self.holes)
                self.next_seq += base
                self._marker_seq += base if self._marker_seq else 0
            self._based = True

    def _on_ack(self, applied: int, durable: int) -> None:
        with self._lock:
            self.applied, self.durable = applied, durable
            self.send_from = applied + 1
            while self.holes and self.holes[0][0] <= durable:
                self.holes.popleft()
            while self.spool and self.spool[0][0] <= durable:
                _, _, n = self.spool.popleft()
                self.spool_rows -= n
                self.sent_rows += n
