"""The learner service's tail, in process over real sockets: after its env-step target it
waits only for the actors this process heard from, counts an actor as told only when a
reply to its own batch said so, re-publishes its done weights while it waits, and gives up
after ``TAIL_MAX_S`` on an actor that never asks again. Also the batches at the edge of the
protocol: an episode's end sent without rows is applied, and a batch the learner refuses is
reported by the link once."""

from __future__ import annotations

import logging
import re
import threading
import time

import numpy as np
import pytest
import zmq

from arli.rl.config import LearnerConfig
from arli.rl.learner import ResidualLearner
from arli.rl.replay import ReplayBuffer
from arli.rl.trainer import Trainer
from arli.runtime import learner_service as ls
from arli.transport.codec import decode, encode
from process_utils import free_ports

pytestmark = pytest.mark.timeout(60)

D, M = 3, 2
WIDTH = ReplayBuffer(1, D, M).rows.shape[1]


@pytest.fixture
def service(tmp_path, monkeypatch):
    """A real service (real trainer, real ROUTER and PUB sockets) with a target of 10 env steps
    and a short tail: quiet 0.3 s, cap 2 s."""
    monkeypatch.setattr(ls, "TAIL_QUIET_S", 0.3)
    monkeypatch.setattr(ls, "TAIL_MAX_S", 2.0)
    cfg = LearnerConfig(hidden=8, critic_hidden=8, critic_heads=2, critic_subset=2, batch_size=4)
    trainer = Trainer(ResidualLearner(cfg, D, M, seed=0), ReplayBuffer(100, D, M), ReplayBuffer(100, D, M),
                      learn_after=10_000)  # no updates: the tail is about messages
    ports = free_ports(2)
    svc = ls.LearnerService(trainer, {"state_dim": D}, {}, lambda d: None, lambda d: None,
                            f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}", str(tmp_path),
                            target_env_steps=10)
    svc.addresses = ports
    yield svc
    svc.close()


class Actor:
    """A DEALER that sends numbered batches of zero rows and reads the acks."""

    def __init__(self, ctx: zmq.Context, port: int, actor_id: str):
        self.sock, self.id, self.seq = ctx.socket(zmq.DEALER), actor_id, 0
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def send(self, rows: int) -> None:
        self.seq += 1
        self.sock.send_multipart([encode("transitions", actor_id=self.id, seq=self.seq,
                                         rows=np.zeros((rows, WIDTH), np.float32))])

    def acks(self, timeout_s: float = 5.0) -> list:
        out, deadline = [], time.perf_counter() + timeout_s
        while time.perf_counter() < deadline and not out:
            while self.sock.poll(50):
                out.append(decode(self.sock.recv_multipart()))
        return out


def _serve_until(svc, cond, timeout_s: float = 5.0) -> None:
    """Answer batches in the test's thread (the service's own loop does the same) until ``cond``."""
    deadline = time.perf_counter() + timeout_s
    while not cond():
        assert time.perf_counter() < deadline, "the service never got there"
        if svc.router.poll(20):
            frames = svc.router.recv_multipart()
            svc.router.send_multipart([frames[0], svc.handle(frames[1:], frames[0])])


def test_a_broadcast_ack_does_not_count_as_telling_an_actor_only_a_reply_to_its_batch_does(service):
    ctx = zmq.Context()
    a, b = Actor(ctx, service.addresses[0], "a"), Actor(ctx, service.addresses[0], "b")
    try:
        a.send(4)
        b.send(4)
        _serve_until(service, lambda: service.env_steps == 8)
        assert all("learner_done" not in m.fields for m in a.acks() + b.acks())  # before the target: no field
        a.send(4)
        _serve_until(service, lambda: service.env_steps == 12)
        service.finished = True
        service.save()  # broadcasts an ack to every identity: b's may be a stale connection
        assert service.told_done == set()
        assert any(m.get("learner_done") for m in b.acks())  # b does get it, but it is not counted
        b.send(1)
        _serve_until(service, lambda: "b" in service.told_done)
        assert service.told_done == {"b"}
    finally:
        a.sock.close(0)
        b.sock.close(0)
        ctx.term()


def test_the_tail_gives_up_after_its_cap_on_an_actor_never_told_and_republishes_done_weights(service, caplog):
    ctx = zmq.Context()
    actor = Actor(ctx, service.addresses[0], "gone")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{service.addresses[1]}")
    try:
        actor.send(12)
        _serve_until(service, lambda: service.env_steps == 12)
        actor.sock.close(0)  # its link went away before any reply said done
        time.sleep(0.3)  # the SUB's connection is up before the tail publishes
        service.finished = True
        start = time.perf_counter()
        with caplog.at_level(logging.WARNING, logger="arli.learner"):
            service._answer_stragglers()
        took = time.perf_counter() - start
        assert ls.TAIL_MAX_S <= took < ls.TAIL_MAX_S + 1.0
        assert "['gone'] were not told" in caplog.text
        done = []
        while sub.poll(100):
            done.append(decode(sub.recv()))
        assert len(done) >= 1 and all(m["meta"]["done"] for m in done)  # once a second while waiting
    finally:
        sub.close(0)
        ctx.term()


def test_the_tail_waits_for_a_told_actor_to_go_quiet_and_not_for_one_known_only_from_a_checkpoint(service,
                                                                                                   monkeypatch):
    monkeypatch.setattr(ls, "TAIL_QUIET_S", 1.0)  # late batches 0.2 s apart: slack on a loaded machine
    monkeypatch.setattr(ls, "TAIL_MAX_S", 5.0)
    service.applied["from_checkpoint"] = 7  # an actor of an earlier process: it never speaks here
    ctx = zmq.Context()
    actor = Actor(ctx, service.addresses[0], "live")
    try:
        actor.send(12)
        _serve_until(service, lambda: service.env_steps == 12)
        service.finished = True
        actor.acks()
        sent: list[float] = []

        def late_batches():  # the actor flushes three more batches, 0.2 s apart (< TAIL_QUIET_S)
            for _ in range(3):
                time.sleep(0.2)
                actor.send(1)
                sent.append(time.perf_counter())

        t = threading.Thread(target=late_batches)
        start = time.perf_counter()
        t.start()
        service._answer_stragglers()
        ended = time.perf_counter()
        t.join()
        assert service.applied["live"] == 4 and service.told_done == {"live"}  # every late batch answered
        assert ended - sent[-1] >= ls.TAIL_QUIET_S  # it waited for the actor to go quiet ...
        assert ended - start < ls.TAIL_MAX_S  # ... and not for the checkpoint's actor
        assert all(m.get("learner_done") for m in actor.acks())
    finally:
        actor.sock.close(0)
        ctx.term()


def test_a_stop_signal_ends_the_tail_at_once(service):
    service.identities["never_told"] = b"x"
    service.finished = True
    stop = threading.Event()
    stop.set()
    start = time.perf_counter()
    service._answer_stragglers(stop)
    assert time.perf_counter() - start < 0.5


def test_a_batch_that_carries_only_an_episode_end_is_acknowledged_and_its_episode_kept(service):
    """The link sends an episode's end alone when its rows left in the batch before (batch full,
    or the flush timer): zero rows of unknown width, ``np.zeros((0, 1))``."""
    ctx = zmq.Context()
    actor = Actor(ctx, service.addresses[0], "a")
    try:
        actor.send(4)
        actor.seq += 1
        actor.sock.send_multipart([encode("transitions", actor_id="a", seq=actor.seq, rows=np.zeros((0, 1), np.float32),
                                          episodes=[{"success": True, "steps": 4}])])
        _serve_until(service, lambda: service.applied.get("a", 0) == 2)
        acks = actor.acks()
        assert [m.kind for m in acks] == ["ack", "ack"] and acks[-1]["applied_seq"] == 2
        assert service.env_steps == 4 and [e["success"] for e in service.episodes] == [True]
    finally:
        actor.sock.close(0)
        ctx.term()


def _serving(svc):
    """The service's own loop in a thread (its target out of reach); returns the stop event."""
    svc.target = 10**9
    stop = threading.Event()
    thread = threading.Thread(target=svc.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    return stop, thread


def test_a_link_whose_episode_end_leaves_alone_flushes_it_and_a_refused_batch_is_reported(service, caplog):
    from arli.runtime.link import LearnerLink  # noqa: PLC0415

    stop, thread = _serving(service)
    link = LearnerLink("a", f"tcp://127.0.0.1:{service.addresses[0]}", f"tcp://127.0.0.1:{service.addresses[1]}",
                       batch_rows=4, flush_s=0.05, ack_timeout_s=0.3).start()
    try:
        for _ in range(4):  # a full batch: it leaves before the episode's end is added
            link.add_row(np.zeros(WIDTH, np.float32))
        assert link.flush(timeout_s=5)
        link.add_episode({"success": True, "steps": 4})
        assert link.flush(timeout_s=5), "an episode's end sent alone is applied"
        assert [e["success"] for e in service.episodes] == [True] and service.env_steps == 4
        with caplog.at_level(logging.ERROR, logger="arli.link"):
            link.add_row(np.zeros(WIDTH + 1, np.float32))  # another config's row width
            assert not link.flush(timeout_s=1.5)  # never applied, resent ...
        assert len(re.findall(r"the learner refused batch \d+ \(schema", caplog.text)) == 1  # ... and said once
    finally:
        link.close()
        stop.set()
        thread.join(timeout=10)


def test_the_tail_ends_when_every_actor_has_sent_its_last_batch_without_waiting_out_the_quiet(service, monkeypatch):
    from arli.runtime.link import LearnerLink  # noqa: PLC0415

    monkeypatch.setattr(ls, "TAIL_QUIET_S", 5.0)
    monkeypatch.setattr(ls, "TAIL_MAX_S", 20.0)
    link = LearnerLink("a", f"tcp://127.0.0.1:{service.addresses[0]}", f"tcp://127.0.0.1:{service.addresses[1]}",
                       batch_rows=4, flush_s=0.05, ack_timeout_s=0.3).start()
    ended: list[float] = []
    thread = threading.Thread(target=lambda: (service.run(), ended.append(time.perf_counter())), daemon=True)
    thread.start()
    try:
        for _ in range(12):  # past the target of 10: the service enters its tail
            link.add_row(np.zeros(WIDTH, np.float32))
        deadline = time.perf_counter() + 10
        while not link.learner_done:
            assert time.perf_counter() < deadline, "no ack said the learner is done"
            time.sleep(0.02)
        link.add_episode({"success": False, "steps": 12})
        assert link.finish(timeout_s=5)
        finished = time.perf_counter()
        thread.join(timeout=10)
        assert ended and ended[0] - finished < 1.0  # told, and its last batch is in: no 5 s quiet wait
        assert service.stopped == {"a"} and len(service.episodes) == 1
    finally:
        link.close()


def test_a_learner_at_its_target_that_heard_from_no_actor_waits_out_the_quiet_period(service):
    """A learner resumed from a checkpoint at its target: actors reconnecting and resending are
    still answered for ``TAIL_QUIET_S`` (no actor heard from is not every actor stopped)."""
    service.finished = True
    start = time.perf_counter()
    service._answer_stragglers()
    assert ls.TAIL_QUIET_S <= time.perf_counter() - start < ls.TAIL_MAX_S


def test_an_actor_that_stopped_before_the_target_is_not_waited_for(service, caplog):
    ctx = zmq.Context()
    early, late = Actor(ctx, service.addresses[0], "early"), Actor(ctx, service.addresses[0], "late")
    try:
        early.seq += 1  # its max_episodes reached: its last batch, before the target
        early.sock.send_multipart([encode("transitions", actor_id="early", seq=early.seq,
                                          rows=np.zeros((4, WIDTH), np.float32), last=True)])
        late.send(8)
        _serve_until(service, lambda: service.env_steps == 12)
        service.finished = True
        late.send(1)
        start = time.perf_counter()
        with caplog.at_level(logging.WARNING, logger="arli.learner"):
            service._answer_stragglers()
        assert time.perf_counter() - start < ls.TAIL_MAX_S and "not told" not in caplog.text
        assert service.stopped == {"early"} and service.told_done == {"late"}
    finally:
        early.sock.close(0)
        late.sock.close(0)
        ctx.term()


def test_a_link_finishing_against_a_learner_of_the_previous_protocol_loses_no_rows(service, monkeypatch):
    """That learner refuses the unknown ``last`` field: the rows went in a batch before the marker,
    so they land, and ``finish`` completes without the marker."""
    from arli.runtime.link import LearnerLink  # noqa: PLC0415
    from arli.transport.codec import ProtocolError  # noqa: PLC0415

    def old_decode(frame):
        msg = decode(frame)
        if "last" in msg.fields:
            raise ProtocolError("schema", "unknown field(s) ['last'] for 'transitions'")
        return msg

    monkeypatch.setattr(ls, "decode", old_decode)
    stop, thread = _serving(service)
    link = LearnerLink("a", f"tcp://127.0.0.1:{service.addresses[0]}", f"tcp://127.0.0.1:{service.addresses[1]}",
                       batch_rows=64, flush_s=10.0, ack_timeout_s=0.3).start()
    try:
        for _ in range(5):  # queued (batch not full, flush timer far): they leave with finish
            link.add_row(np.zeros(WIDTH, np.float32))
        link.add_episode({"success": True, "steps": 5})
        assert link.finish(timeout_s=5)
        assert service.env_steps == 5 and len(service.episodes) == 1 and service.stopped == set()
    finally:
        link.close()
        stop.set()
        thread.join(timeout=10)


def test_an_actor_restarted_under_its_id_numbers_after_the_batches_the_learner_has(service):
    """Its new link starts at seq 1: without the hello its batches would be taken as duplicates of
    the earlier run's and dropped."""
    from arli.runtime.link import LearnerLink  # noqa: PLC0415

    stop, thread = _serving(service)
    addrs = (f"tcp://127.0.0.1:{service.addresses[0]}", f"tcp://127.0.0.1:{service.addresses[1]}")
    try:
        for run, rows in ((1, 12), (2, 8)):
            link = LearnerLink("a", *addrs, batch_rows=4, flush_s=0.05, ack_timeout_s=0.3)
            for _ in range(rows):  # spooled before the link has heard from the learner
                link.add_row(np.zeros(WIDTH, np.float32))
            link.start()
            try:
                assert link.finish(timeout_s=5), f"run {run}: every batch applied"
            finally:
                link.close()
        assert service.env_steps == 20 and service.applied["a"] == 4  # per run: its rows in one batch, the marker
    finally:
        stop.set()
        thread.join(timeout=10)


def test_a_hello_the_learner_refuses_is_reported_once_and_no_batch_is_sent(service, monkeypatch, caplog):
    """A learner that cannot read this link's messages (another protocol version) answers the
    hello with an error: the link says so once and keeps its rows spooled."""
    from arli.runtime.link import LearnerLink  # noqa: PLC0415
    from arli.transport.codec import ProtocolError  # noqa: PLC0415

    def refusing(frame):
        raise ProtocolError("version", "protocol version 9 not supported")

    monkeypatch.setattr(ls, "decode", refusing)
    stop, thread = _serving(service)
    link = LearnerLink("a", f"tcp://127.0.0.1:{service.addresses[0]}", f"tcp://127.0.0.1:{service.addresses[1]}",
                       batch_rows=4, flush_s=0.05, ack_timeout_s=0.2)
    try:
        with caplog.at_level(logging.ERROR, logger="arli.link"):
            link.start()
            for _ in range(4):
                link.add_row(np.zeros(WIDTH, np.float32))
            assert not link.flush(timeout_s=1.5)  # several hellos refused meanwhile
        assert caplog.text.count("refused this actor's hello (version") == 1
        assert link.pending_rows() == 4 and service.env_steps == 0 and service.duplicates == 0
    finally:
        link.close()
        stop.set()
        thread.join(timeout=10)


@pytest.mark.parametrize("learner", ["current", "no ranges", "previous protocol"])
def test_a_spool_that_overflowed_while_the_learner_was_away_still_delivers_what_it_kept(service, monkeypatch,
                                                                                        caplog, learner):
    """Nothing answers while 5 batches of 4 rows go into a spool of 8 rows: the 3 oldest lose
    their rows but keep their seqs, so once the learner answers, one placeholder for the 3 seqs
    says 12 rows were lost and the 2 batches kept land after it (numbered after an earlier run of
    the same actor id), instead of a gap the learner refuses on every resend. A learner that
    refuses the range takes one placeholder per seq, each with its count; one of the previous
    protocol refuses the count (and the last-batch marker) and takes bare placeholders."""
    from arli.runtime.link import LearnerLink  # noqa: PLC0415
    from arli.transport.codec import ProtocolError  # noqa: PLC0415

    refused = {"current": set(), "no ranges": {"through"}, "previous protocol": {"last", "dropped", "through"}}[learner]
    placeholders = []  # (seq, fields) of every placeholder the learner got, refused ones included

    def learner_decode(frame):
        msg = decode(frame)
        if msg.kind == "transitions" and msg["seq"] > 0 and not len(msg["rows"]) and not msg.get("last"):
            placeholders.append((msg["seq"], sorted(set(msg.fields) & {"dropped", "through"})))
        if refused & set(msg.fields):  # worded as the codec words it
            raise ProtocolError("schema", f"transitions: unknown field(s) {sorted(refused & set(msg.fields))}; "
                                          f"allowed: ['actor_id', 'dropped', 'episodes', 'last', 'rows', 'seq']")
        return msg

    monkeypatch.setattr(ls, "decode", learner_decode)
    service.applied["a"] = 2  # an earlier run of this actor id, as read from the learner's checkpoint
    link = LearnerLink("a", f"tcp://127.0.0.1:{service.addresses[0]}", f"tcp://127.0.0.1:{service.addresses[1]}",
                       batch_rows=4, flush_s=10.0, spool_max_rows=8, ack_timeout_s=0.3).start()
    stop = thread = None
    try:
        deadline = time.perf_counter() + 5
        for i in range(5):
            row = np.zeros(WIDTH, np.float32)
            row[0] = i  # the first state feature names the batch
            for _ in range(4):
                link.add_row(row)
            if i == 0:
                link.add_episode({"success": False, "steps": 4})  # its end is lost with the batch
            while link.next_seq < i + 2:  # one batch each: the link takes every queued row at once
                assert time.perf_counter() < deadline, "the link never batched its rows"
                time.sleep(0.01)
        # the last batch is spooled after its seq is reserved
        while not (link.dropped_rows == 12 and link.dropped_episodes == 1 and link.spool_rows == 8):
            assert time.perf_counter() < deadline, (link.dropped_rows, link.dropped_episodes, link.spool_rows)
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING):
            stop, thread = _serving(service)
            assert link.finish(timeout_s=5), "the batches kept were applied"
        assert service.env_steps == 8 and service.episodes == []
        assert sorted(service.trainer.online.rows[:8, 0]) == [3.0] * 4 + [4.0] * 4  # the newest two
        ranged = (3, ["dropped", "through"])
        if learner == "current":
            assert placeholders == [ranged]  # one round trip for the three seqs
            assert service.applied["a"] == 2 + 3 + 2 + 1  # earlier run, placeholders, batches kept, marker
            assert caplog.text.count("lost rows to its spool's overflow (12 so far, up to batch 5)") == 1
            assert service.lost_rows == {"a": 12}
            service.save()
            service.lost_rows = {}
            assert service.load() and service.lost_rows == {"a": 12}  # the count survives a restart
        elif learner == "no ranges":
            assert placeholders == [ranged, (3, ["dropped"]), (4, ["dropped"]), (5, ["dropped"])]
            assert service.applied["a"] == 2 + 3 + 2 + 1 and service.lost_rows == {"a": 12}
            assert caplog.text.count("lost rows to its spool's overflow (4 so far, up to batch 3)") == 1  # one line
            assert caplog.text.count("does not take a range of seqs") == 1
        else:
            assert placeholders == [ranged, (3, []), (4, []), (5, [])]  # straight to bare: it named 'dropped'
            assert service.applied["a"] == 2 + 3 + 2 and service.lost_rows == {}
            assert caplog.text.count("does not take the dropped-rows count") == 1
    finally:
        link.close()
        if stop is not None:
            stop.set()
            thread.join(timeout=10)


@pytest.mark.parametrize("dropped,rows", [(-3, 0), (4, 2)])
def test_a_dropped_count_that_is_negative_or_rides_on_rows_is_refused_and_changes_nothing(service, dropped, rows):
    frame = encode("transitions", actor_id="a", seq=1, rows=np.zeros((rows, WIDTH), np.float32), dropped=dropped)
    reply = decode(service.handle([frame]))
    assert reply.kind == "error" and reply["code"] == "schema" and "'dropped'" in reply["message"]
    assert service.applied == {} and service.lost_rows == {} and service.env_steps == 0


@pytest.mark.parametrize("fields,rows", [({"through": 5}, 0), ({"dropped": 4, "through": 1}, 0),
                                         ({"dropped": 4, "through": 2}, 0), ({"dropped": 0, "through": 5}, 3)])
def test_a_range_without_a_count_or_that_ends_before_it_starts_is_refused_and_changes_nothing(service, fields, rows):
    """A range rides only on a placeholder: one on a batch of rows would skip seqs past rows it applied."""
    frame = encode("transitions", actor_id="a", seq=2, rows=np.zeros((rows, WIDTH), np.float32), **fields)
    service.applied["a"] = 1
    reply = decode(service.handle([frame]))
    assert reply.kind == "error" and reply["code"] == "schema" and "'through'" in reply["message"]
    assert service.applied == {"a": 1} and service.lost_rows == {} and service.env_steps == 0


def test_a_ranged_placeholder_applies_its_seqs_at_once_and_a_resend_is_a_duplicate(service):
    frame = encode("transitions", actor_id="a", seq=1, rows=np.zeros((0, WIDTH), np.float32), dropped=30, through=10)
    for _ in range(2):
        reply = decode(service.handle([frame]))
        assert reply.kind == "ack" and reply["applied_seq"] == 10
    assert service.lost_rows == {"a": 30} and service.duplicates == 1


def _link_with_holes(holes: list[tuple[int, int]], send_from: int):
    from collections import deque  # noqa: PLC0415

    from arli.runtime.link import LearnerLink  # noqa: PLC0415
    link = LearnerLink("a", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")  # never started: no sockets
    link.holes, link.send_from = deque(holes), send_from
    return link


def test_a_range_starts_where_the_learner_stopped_and_counts_only_the_rows_after_it():
    link = _link_with_holes([(3, 4), (4, 5), (5, 6)], send_from=4)  # seq 3 applied before a restart
    seq, frame = link._next_to_send()
    msg = decode(frame)
    assert (seq, msg["seq"], msg["through"], msg["dropped"]) == (4, 4, 5, 11)
    link.send_from = 5  # the last hole alone: no range
    msg = decode(link._next_to_send()[1])
    assert (msg["seq"], msg["dropped"], "through" in msg.fields) == (5, 6, False)


def test_holes_that_are_not_consecutive_go_one_per_seq():
    link = _link_with_holes([(3, 4), (5, 6)], send_from=4)
    msg = decode(link._next_to_send()[1])
    assert (msg["seq"], msg["dropped"], "through" in msg.fields) == (5, 6, False)


def test_a_late_copy_of_a_refusal_does_not_step_the_placeholders_down_twice(caplog):
    """Resends queue several copies of a ranged placeholder at an older learner that is slow to
    answer: every copy is refused for ``through``, and each refusal may land on a later send."""
    from arli.runtime.link import HOLES_PLAIN, HOLES_RANGED, HOLES_SINGLE  # noqa: PLC0415
    link = _link_with_holes([(3, 4), (4, 5)], send_from=3)
    refusal = "transitions: unknown field(s) ['through']; allowed: ['actor_id', 'dropped', 'rows', 'seq']"
    assert link._hole_mode == HOLES_RANGED
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert link._on_hole_refused("schema", refusal)
    assert link._hole_mode == HOLES_SINGLE and caplog.text.count("does not take a range of seqs") == 1
    assert not link._on_hole_refused("schema", "transitions: field 'rows' must have 2 dims")  # not about holes
    assert not link._on_hole_refused("other", refusal.replace("through", "x"))
    assert link._hole_mode == HOLES_SINGLE
    assert link._on_hole_refused("schema", "transitions: unknown field(s) ['dropped']; allowed: ['seq']")
    assert link._hole_mode == HOLES_PLAIN
