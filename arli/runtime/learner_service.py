"""Learner service (``arli learner``): the in-process learner behind ZeroMQ, for a fleet.

* Transitions arrive on a ROUTER socket as numbered batches per actor id; a batch is
  applied only if it is the next one for its actor (duplicates are acknowledged and
  ignored, gaps refused), so replay receives every transition exactly once. Batches an
  actor's spool dropped arrive as one placeholder of no rows for the whole run of their seqs
  (``through``), with the count of rows lost (``dropped``).
* The acknowledgement carries ``applied_seq`` and ``durable_seq`` (applied and written to
  a checkpoint); actors keep batches until they are durable.
* Rows go to the same ``Trainer`` as in process (``arli.rl.trainer``): it routes them to
  replay and owes ``learner.utd`` updates per environment step once ``learn_after`` rows
  are in; the service runs them interleaved with receiving.
* Weights are published on a PUB socket with a version number, on every
  ``publish_every`` updates and at least once a second (late joiners get them).
* At its env-step target the service says so in every ack (``learner_done``) as well as in
  its last weights' meta: PUB/SUB may drop a message, an ack answers a batch the actor sent.
* Checkpoints are atomic (the run's ``save`` + ``service.json`` via rename) and a restarted
  service resumes from them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Callable

import numpy as np
import zmq

from arli.policies.residual_np import CRITIC_PREFIX
from arli.rl.trainer import Trainer
from arli.transport.codec import ProtocolError, decode, encode, error_frame
from arli.transport.zmq_io import CurveConfig, bind_socket, stop_auth

log = logging.getLogger("arli.learner")

# after the target: no batch from any actor this long ends the tail even before every actor has
# marked its last batch (an actor of the previous protocol never marks it; a link batches every
# 0.5 s, and an episode's end, recording included, can take longer on a loaded machine)
TAIL_QUIET_S = 3.0
TAIL_MAX_S = 30.0  # after the target: the longest the learner waits for its actors to hear it
PUB_LINGER_MS = 1000
LOST_LOG_EVERY_S = 10.0  # an actor of the previous protocol back from a long outage sends thousands of placeholders
ROUTER_LINGER_MS = 500  # the acks of an actor's last batches, answered just before the close


class LearnerService:
    """``trainer``: the learner and its replays. ``weights_meta``: what an actor needs to
    rebuild the residual (variant, state dim, chunk size, episode steps, learner config) and
    ``norm``: its state normalisation arrays, both sent with every weights message.
    ``save_run`` / ``load_run``: the run's own checkpoint of a directory (trainer included)."""

    def __init__(self, trainer: Trainer, weights_meta: dict, norm: dict[str, np.ndarray],
                 save_run: Callable[[str], None], load_run: Callable[[str], None],
                 transitions_addr: str, weights_addr: str, checkpoint_dir: str, target_env_steps: int,
                 curve: CurveConfig | None = None, publish_every: int = 50, checkpoint_every_s: float = 10.0):
        self.trainer, self.weights_meta, self.norm = trainer, weights_meta, norm
        self.save_run, self.load_run = save_run, load_run
        self.checkpoint_dir, self.target = checkpoint_dir, target_env_steps
        self.publish_every, self.checkpoint_every_s = publish_every, checkpoint_every_s
        self.ctx = zmq.Context()
        self.router = bind_socket(self.ctx, zmq.ROUTER, transitions_addr, curve)
        self.pub = bind_socket(self.ctx, zmq.PUB, weights_addr, curve)
        self.applied: dict[str, int] = {}
        self.identities: dict[str, bytes] = {}  # actor id -> its connection's ROUTER identity
        self.durable: dict[str, int] = {}
        self.episodes: list[dict] = []
        self.received_rows = 0
        self.duplicates = 0
        self.lost_rows: dict[str, int] = {}  # per actor: rows its spool dropped before they got here
        self._lost_logged: dict[str, float] = {}  # when each actor's loss was last logged
        self.version = 0
        # the env-step target is reached: every ack says so, because the weights that say so
        # (PUB/SUB) can be lost, and an actor that never hears it would run on
        self.finished = False
        self.told_done: set[str] = set()
        self.stopped: set[str] = set()  # actors whose last batch (``last``) has arrived
        self._last_publish = 0.0
        self._last_checkpoint = time.perf_counter()

    # -- state -------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return self.trainer.env_steps

    @property
    def rejected_rows(self) -> int:
        return self.trainer.rejected_rows

    def save(self) -> None:
        """Atomic checkpoint of learner + replay + per-actor sequence numbers."""
        self.save_run(self.checkpoint_dir)
        state = {"applied": self.applied, "episodes": self.episodes, "version": self.version,
                 "received_rows": self.received_rows, "lost_rows": self.lost_rows}
        path = os.path.join(self.checkpoint_dir, "service.json")
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(state, fh)
        os.replace(path + ".tmp", path)
        self.durable = dict(self.applied)
        self._last_checkpoint = time.perf_counter()
        for actor, identity in self.identities.items():  # tell actors they may free their spools
            self.router.send_multipart([identity, self._ack(actor)])

    def load(self) -> bool:
        """Resume from ``checkpoint_dir`` if a checkpoint is there; returns whether it was."""
        path = os.path.join(self.checkpoint_dir, "service.json")
        if not os.path.exists(path):
            return False
        self.load_run(self.checkpoint_dir)
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        self.applied = {k: int(v) for k, v in state["applied"].items()}
        self.durable = dict(self.applied)
        self.episodes, self.version = state["episodes"], state["version"]
        self.received_rows = state["received_rows"]
        self.lost_rows = state.get("lost_rows", {})  # a checkpoint of the previous version has none
        return True

    # -- messages ----------------------------------------------------------------------
    def handle(self, frame, identity: bytes = b"") -> bytes:
        try:
            msg = decode(frame)
            if msg.kind != "transitions":
                raise ProtocolError("unknown_kind", f"the learner accepts transitions, not {msg.kind!r}")
            actor, seq = msg["actor_id"], msg["seq"]
            if msg.get("dropped", 0) < 0 or (msg.get("dropped", 0) and len(msg["rows"])):
                raise ProtocolError("schema", f"field 'dropped' of batch {seq} must be a count >= 0 on a batch of no "
                                    f"rows, got {msg['dropped']} with {len(msg['rows'])} rows")
            through = msg.get("through", seq)
            if "through" in msg.fields and (through <= seq or "dropped" not in msg.fields or len(msg["rows"])):
                raise ProtocolError("schema", f"field 'through' of batch {seq} must be a later seq on a placeholder "
                                    f"(a batch of no rows with 'dropped'), got {through} with {len(msg['rows'])} rows")
            if identity:
                self.identities[actor] = identity
            applied = self.applied.get(actor, 0)
            if seq == applied + 1:
                self._apply(msg)
                self.applied[actor] = through
            elif 0 < seq <= applied:  # seq 0 is a link's hello, asking for applied_seq
                self.duplicates += 1
            if seq <= self.applied.get(actor, 0) and msg.get("last", False):
                self.stopped.add(actor)
            return self._ack(actor, reply=True)
        except ProtocolError as exc:
            return error_frame(exc)
        except ValueError as exc:  # rows of the wrong width: the actor runs another config
            return error_frame("schema", str(exc))

    def _ack(self, actor: str, reply: bool = False) -> bytes:
        """``reply``: the answer to a batch this actor just sent, so it goes to a live connection
        (a broadcast from ``save`` may go to a stale identity and does not count as telling it)."""
        if self.finished and reply:
            self.told_done.add(actor)
        # the field only once true: a peer of the previous protocol refuses unknown fields
        done = {"learner_done": True} if self.finished else {}
        return encode("ack", actor_id=actor, applied_seq=self.applied.get(actor, 0),
                      durable_seq=self.durable.get(actor, 0), **done)

    def _apply(self, msg) -> None:
        rows = msg["rows"]
        # an episode's end can travel alone (its rows left in the batch before): zero rows, no width
        n = self.trainer.ingest_rows(rows) if len(rows) else 0
        if n < len(rows):  # NaN/inf rows are never stored; say so instead of losing them silently
            log.warning("actor %s batch %d: %d row(s) with NaN/inf not stored", msg["actor_id"], msg["seq"],
                        len(rows) - n)
        self.received_rows += n
        if msg.get("dropped", 0):
            actor = msg["actor_id"]
            self.lost_rows[actor] = self.lost_rows.get(actor, 0) + msg["dropped"]
            now = time.perf_counter()
            if now - self._lost_logged.get(actor, -LOST_LOG_EVERY_S) >= LOST_LOG_EVERY_S:  # one line per burst
                self._lost_logged[actor] = now
                log.warning("actor %s lost rows to its spool's overflow (%d so far, up to batch %d): the learner was "
                            "away longer than the actor's spool holds", actor, self.lost_rows[actor],
                            msg.get("through", msg["seq"]))
        for ep in msg.get("episodes", []):
            self.episodes.append({**ep, "actor_id": msg["actor_id"], "env_steps": self.env_steps})

    def publish(self, done: bool = False) -> None:
        self.version += 1
        learner = self.trainer.learner
        arrays = {k: v.detach().cpu().numpy() for k, v in learner.actor.state_dict().items()}
        if learner.cfg.gate_candidates > 1:  # a value-gated actor acts through the critic too
            arrays.update({CRITIC_PREFIX + k: v.detach().cpu().numpy() for k, v in learner.critic.state_dict().items()})
        arrays.update(self.norm)
        meta = {**self.weights_meta, "done": done, "env_steps": self.env_steps, "updates": learner.updates}
        self.pub.send(encode("weights", version=self.version, arrays=arrays, meta=meta))
        self._last_publish = time.perf_counter()

    # -- loop --------------------------------------------------------------------------
    def run(self, max_seconds: float | None = None, progress=None, stop=None) -> None:
        """Receive, learn and publish until ``target_env_steps`` transitions have arrived
        (or ``stop`` is set: then it checkpoints and returns)."""
        deadline = None if max_seconds is None else time.perf_counter() + max_seconds
        while self.env_steps < self.target and not (stop is not None and stop.is_set()):
            if deadline is not None and time.perf_counter() > deadline:
                break
            while self.router.poll(0 if self.trainer.owed else 20):
                frames = self.router.recv_multipart()
                if len(frames) >= 2:
                    before = self.env_steps
                    self.router.send_multipart([frames[0], self.handle(frames[1:], frames[0])])
                    if progress is not None and self.env_steps > before:
                        progress(self)
            for _ in range(8):  # at most 8 updates between two polls: actors are answered promptly
                if not self.trainer.run_owed(limit=1):
                    break
                if self.trainer.learner.updates % self.publish_every == 0:
                    self.publish()
            now = time.perf_counter()
            if now - self._last_publish > 1.0:
                self.publish()
            if now - self._last_checkpoint > self.checkpoint_every_s:
                self.save()
        self.finished = self.env_steps >= self.target
        self.save()  # its acks tell every known actor whether the learner is done
        self.publish(done=self.finished)
        self._answer_stragglers(stop)
        self.save()

    def _answer_stragglers(self, stop=None) -> None:
        """Acknowledge what still arrives, so actors can flush and stop. Once the target is
        reached, until every actor this process has heard from has been told so in a reply (or has
        stopped: its last batch arrived) and each has sent its last batch or none has sent
        anything for ``TAIL_QUIET_S``, at most ``TAIL_MAX_S``
        or until ``stop`` is set; the done weights are published again each second for an actor
        that reads only those. Actors known only from a checkpoint are not waited for."""
        start = last_batch = self._last_publish = time.perf_counter()
        while True:
            now = time.perf_counter()
            if (not self.finished and now - start > TAIL_QUIET_S) or (stop is not None and stop.is_set()):
                return
            heard = set(self.identities)
            told = (self.told_done | self.stopped) >= heard  # an actor that stopped needs no telling
            # with no actor heard from (a learner resumed at its target) only the quiet period ends it
            flushed = (bool(heard) and self.stopped >= heard) or now - last_batch > TAIL_QUIET_S
            if self.finished and ((told and flushed) or now - start > TAIL_MAX_S):
                if not told:
                    log.warning("actor(s) %s were not told that the learner is done (their links are away)",
                                sorted(heard - self.told_done - self.stopped))
                return
            if self.finished and now - self._last_publish > 1.0:
                self.publish(done=True)
            if self.router.poll(50):
                frames = self.router.recv_multipart()
                if len(frames) >= 2:
                    self.router.send_multipart([frames[0], self.handle(frames[1:], frames[0])])
                    last_batch = time.perf_counter()

    def close(self) -> None:
        self.router.close(linger=ROUTER_LINGER_MS)
        # weights still queued for a slow subscriber (the done ones last) get a moment to leave
        self.pub.close(linger=PUB_LINGER_MS)
        stop_auth(self.ctx)
        self.ctx.term()
