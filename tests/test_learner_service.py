"""The learner service as a real process: kill -9 it mid-run; the actor side keeps going
and spools, and after a restart from the checkpoint every transition lands exactly once."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import torch

from arli.rl.replay import ReplayBuffer
from arli.runtime.link import LearnerLink
from process_utils import free_ports, spawn, stop

pytestmark = pytest.mark.timeout(240)


def learner_args(ports, out) -> list[str]:
    return ["learner", "env=pick_cube", "checkpoint=expert", "run.anchor_episodes=2", "run.learner.pretrain_updates=5",
            "run.learn_after=50", "run.env_steps=1000000", "checkpoint_every_s=0.5", f"output_dir={out}",
            f"transport.learner=tcp://127.0.0.1:{ports[0]}", f"transport.weights=tcp://127.0.0.1:{ports[1]}"]


def settled(read, quiet_s: float = 1.0, timeout: float = 30.0):
    """``read()`` once it has not changed for ``quiet_s``: weights the learner published just
    before it died may still sit in the link's socket and land after the kill."""
    last, since, deadline = read(), time.perf_counter(), time.perf_counter() + timeout
    while time.perf_counter() - since < quiet_s:
        if time.perf_counter() > deadline:
            raise AssertionError(f"still changing after {timeout} s: {last}")
        time.sleep(0.05)
        if (now := read()) != last:
            last, since = now, time.perf_counter()
    return last


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_learner_kill9_and_restart_loses_and_duplicates_nothing(tmp_path):
    ports = free_ports(2)
    out = tmp_path / "learner"
    link = LearnerLink("actor0", f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}",
                       batch_rows=16, flush_s=0.05, ack_timeout_s=0.5).start()
    learner = spawn(learner_args(ports, out), tmp_path / "learner1.log")
    try:
        got: list = []
        wait_for(lambda: got.append(link.take_weights()) or got[-1] is not None, 90, "first weights")
        version_before = link.weights_version
        meta_dim = got[-1][2]["state_dim"]  # the learner's residual state dim fixes the row width
        width = ReplayBuffer(1, meta_dim, 5).rows.shape[1]

        def rows(ids, dim):
            r = np.zeros((len(ids), dim), np.float32)
            r[:, 0] = ids  # the id rides in state[0]; source column = 0 (online)
            return r

        sent = 0

        def send(n):
            nonlocal sent
            for row in rows(range(sent, sent + n), width):
                link.add_row(row)
            sent += n

        send(300)
        wait_for(lambda: link.pending_rows() == 0, 60, "first batches durable")
        learner.send_signal(signal.SIGKILL)
        learner.wait()
        version_at_kill = settled(lambda: link.weights_version)
        # learner gone: the actor keeps adding (never blocks) and its spool grows
        start = time.perf_counter()
        send(300)
        assert time.perf_counter() - start < 0.5
        time.sleep(1.5)
        assert link.pending_rows() >= 300 and link.weights_version == version_at_kill
        learner = spawn(learner_args(ports, out), tmp_path / "learner2.log")  # resumes from its checkpoint
        send(200)
        assert link.flush(timeout_s=120), "every batch applied after the restart"
        # the restarted learner publishes newer weights (they may land just after the acks)
        wait_for(lambda: link.weights_version > version_at_kill, 60, "weights from the restarted learner")
        assert version_at_kill >= version_before
        assert stop(learner, signal.SIGINT, timeout=60) == 0  # checkpoints on the way out
    finally:
        link.close()
        stop(learner, signal.SIGKILL)
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    ids = np.sort(state["trainer"]["online"]["data.state"][:, 0])
    np.testing.assert_array_equal(ids, np.arange(sent, dtype=np.float32))  # exactly once, all of them
    assert "resumed" in (tmp_path / "learner2.log").read_text()


@pytest.mark.slow
def test_actor_hears_the_learner_is_done_through_its_acks_when_the_done_weights_are_lost(tmp_path):
    """The weights that say ``done`` travel over PUB/SUB, which may drop them (a slow
    subscriber, a closing publisher): this actor's SUB listens where nothing publishes, so only
    the acknowledgements of its own batches can tell it the learner reached its target."""
    ports = free_ports(3)
    out = tmp_path / "learner"
    watcher = LearnerLink("watcher", f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}").start()
    deaf = LearnerLink("actor0", f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[2]}",
                       batch_rows=16, flush_s=0.05, ack_timeout_s=0.5).start()
    args = [a for a in learner_args(ports, out) if not a.startswith("run.env_steps")] + ["run.env_steps=400"]
    learner = spawn(args, tmp_path / "learner.log")
    try:
        got: list = []
        wait_for(lambda: got.append(watcher.take_weights()) or got[-1] is not None, 60, "first weights")
        width = ReplayBuffer(1, got[-1][2]["state_dim"], 5).rows.shape[1]
        rows = np.zeros((300, width), np.float32)
        for row in rows:
            deaf.add_row(row)
        wait_for(lambda: deaf.pending_rows() == 0, 30, "the first 300 rows durable")
        assert not deaf.learner_done and deaf.weights_version == 0  # 300 of 400 steps; it hears no weights
        for row in rows:  # past the target: the learner finishes and says so in its acks
            deaf.add_row(row)
        wait_for(lambda: deaf.learner_done, 30, "an ack that says the learner is done")
        assert deaf.weights_version == 0
        assert deaf.flush(timeout_s=15), "the learner answers an actor's last batches after its target"
    finally:
        watcher.close()
        deaf.close()
        stop(learner, signal.SIGKILL)
