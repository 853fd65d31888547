"""``arli launch sim``: inference server, learner and two sim actors as real processes on
loopback; transitions from both actors reach the one learner, whose weights reach both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from process_utils import ROOT, free_port_block

pytestmark = pytest.mark.timeout(400)


@pytest.mark.slow
def test_launch_two_actors_one_learner(tmp_path):
    out = tmp_path / "launch"
    base_port = free_port_block(3)
    learner_extra = '["run.anchor_episodes=3","run.learner.pretrain_updates=20","run.learn_after=100",' \
                    '"run.test_episodes=3",' \
                    '"checkpoint_every_s=1"]'
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "launch", "sim", "actors=2", "env=pick_cube",
                           "checkpoint=expert", "env_steps=400", f"base_port={base_port}", f"output_dir={out}",
                           f"extra_learner={learner_extra}", f"record_root={out}/rec"],
                          cwd=ROOT, capture_output=True, text=True, timeout=380)
    logs = {p.name: p.read_text() for p in out.glob("*.log")}
    assert proc.returncode == 0, (proc.stdout[-2000:], {k: v[-1500:] for k, v in logs.items()})
    summary = json.loads((out / "learner" / "summary.json").read_text())
    assert summary["actors"] == ["actor0", "actor1"] and summary["finished"] is True
    assert summary["env_steps"] >= 400 and summary["updates"] > 0
    by_actor = {a: [e for e in summary["episodes"] if e["actor_id"] == a] for a in ("actor0", "actor1")}
    actor_steps = 0
    for actor, episodes in by_actor.items():
        assert episodes, f"{actor} sent no episodes"
        stats = json.loads((out / actor / "stats.json").read_text())
        actor_steps += stats["steps"]
        # real latency: the server pads replies to 160 ms; measured on the robot side
        assert 160 <= stats["latency_ms"]["p50"] < 400, stats["latency_ms"]
        trace = json.loads((out / actor / "latency_trace.json").read_text())
        assert len(trace) >= 5 and min(trace) >= 0.16
        # every episode the actor ran is in its crash-safe recording, read by LeRobot's loader
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

        ds = LeRobotDataset("arli/local", root=out / "rec" / actor)
        assert ds.meta.total_episodes == stats["episodes"] >= len(episodes)  # the learner may stop first
        assert len(ds) == stats["steps"]
        # weights reached the actor while it ran (versions grow over its episodes)
        versions = [e["weights_version"] for e in episodes]
        assert versions[-1] > versions[0] or len(versions) == 1
    # one row per actor step, each applied once: the learner never holds more than the actors sent
    # (they may run on after it stops), and none was refused
    assert summary["env_steps"] <= actor_steps and summary["rejected_rows"] == 0
    # the final evaluation ran the 3 episodes asked for
    assert summary["eval"]["episodes"] == len(summary["outcomes"]) == 3
    assert summary["finetuned_success"] == sum(summary["outcomes"]) / 3
    assert summary["sim_unstable_episodes"] == {"test_final": 0} and "start_guard" in summary


@pytest.mark.slow
def test_launch_restarts_a_server_and_a_learner_killed_mid_run_and_it_resumes(tmp_path):
    """A supervisor's job: kill -9 the inference server, then the learner; launch restarts
    each after its backoff, the actor holds and reconnects, the learner resumes from its
    checkpoint, the actors' spooled transitions land and the run finishes with rc 0."""
    import os
    import signal
    import time

    out = tmp_path / "launch"
    base_port = free_port_block(3)
    extra = '["run.anchor_episodes=2","run.learner.pretrain_updates=10","run.learn_after=100",' \
            '"run.test_episodes=2","checkpoint_every_s=1"]'
    proc = subprocess.Popen([sys.executable, "-m", "arli.cli", "launch", "sim", "actors=1", "env=pick_cube",
                             "checkpoint=expert", "env_steps=700", f"base_port={base_port}", f"output_dir={out}",
                             f"extra_learner={extra}"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pids = {}
        for line in proc.stdout:
            if line.startswith("started "):
                pids[line.split()[1]] = int(line.split("pid ")[1].split(")")[0])
            if "learner" in pids and "serve" in pids:
                break
        deadline = time.time() + 200
        while not (out / "learner" / "checkpoint" / "service.json").exists() and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # some transitions applied and checkpointed
        os.kill(pids["serve"], signal.SIGKILL)
        time.sleep(1)
        os.kill(pids["learner"], signal.SIGKILL)
        rest = proc.stdout.read()
        assert proc.wait(timeout=300) == 0, rest[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "serve exited with -9; restarting it in 1 s (1/3)" in rest
    assert "learner exited with -9; restarting it in 1 s (1/3)" in rest
    assert "resumed" in (out / "learner.log").read_text()
    summary = json.loads((out / "learner" / "summary.json").read_text())
    assert summary["env_steps"] >= 700


@pytest.mark.slow
def test_launch_does_not_restart_a_learner_that_refuses_its_settings(tmp_path):
    """A config error (exit 2) fails the same way every time: no restarts, exit 2, and the
    learner's one-line reason is in its log."""
    out = tmp_path / "launch"
    base_port = free_port_block(3)
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "launch", "sim", "actors=1", "env=pick_cube",
                           "checkpoint=expert", f"base_port={base_port}", f"output_dir={out}",
                           'extra_learner=["run.learner.tau=0"]'], cwd=ROOT, capture_output=True, text=True,
                          timeout=200)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "learner refused its settings" in proc.stdout and "restarting" not in proc.stdout
    assert "run.learner.tau: expected in (0, 1], got 0.0" in (out / "learner.log").read_text()


def test_launch_does_not_restart_a_learner_whose_critic_diverged(tmp_path, monkeypatch, capsys):
    """The supervisor on real processes: a learner that exits with LearnerDiverged's code (its
    critic diverged; restarting from the same checkpoint would end the same way) is not
    restarted, launch exits with that code and stops the rest; a learner killed by a signal
    would have been (the kill test above)."""
    from arli.cli import compose
    from arli.commands import pipeline
    from arli.rl.learner import LearnerDiverged

    wait = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(pipeline, "launch_commands", lambda cfg: {
        "serve": wait, "learner": [sys.executable, "-c", f"import sys; sys.exit({LearnerDiverged.exit_code})"],
        "actor0": wait})
    cfg = compose("launch", ["checkpoint=expert", "env=pick_cube", f"output_dir={tmp_path}"])
    assert pipeline.launch_main(cfg) == LearnerDiverged.exit_code == 3
    out = capsys.readouterr().out
    assert "the learner's critic diverged; not restarted" in out and "restarting" not in out


def test_launch_gives_up_on_a_server_that_keeps_dying_and_stops_the_rest(tmp_path, monkeypatch, capsys):
    """Bounded retries: a server that dies at every start is restarted ``restarts`` times, each
    restart logged with its count and appended to the same log; then launch gives up with
    exit 1 and a line naming the process, and stops the learner and the actor it started with
    SIGINT (each gets its KeyboardInterrupt, to save what it holds), even with launch itself
    running with SIGINT ignored, as a script's background job does; none is left, not even
    as a zombie."""
    import signal

    from arli.cli import compose
    from arli.commands import pipeline

    pids = tmp_path / "pids"
    # the server dies once the other two are up (and said so), so the stop meets them running
    dying = [sys.executable, "-c", "import time\n"
             f"while len(open({str(pids)!r}).read().split()) < 2 and time.sleep(0.02) is None: pass\n"
             "print('serve started', flush=True); raise SystemExit(7)"]
    waiting = [sys.executable, "-c", f"import os, time\nwith open({str(pids)!r}, 'a') as f: f.write(f'{{os.getpid()}}\\n')\n"
               f"try: time.sleep(120)\nexcept KeyboardInterrupt: open({str(pids)!r} + '.int', 'a').write('x')"]
    pids.write_text("")
    monkeypatch.setattr(pipeline, "launch_commands", lambda cfg: {"serve": dying, "learner": waiting,
                                                                  "actor0": waiting})
    monkeypatch.setattr(pipeline, "RESTART_BACKOFF_S", (0.05,))
    cfg = compose("launch", ["checkpoint=expert", "env=pick_cube", f"output_dir={tmp_path}", "restarts=2"])
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `make test &` gives its children
    try:
        assert pipeline.launch_main(cfg) == 1
    finally:
        signal.signal(signal.SIGINT, previous)
    out = capsys.readouterr().out
    assert "serve exited with 7; restarting it in 0 s (1/2)" in out
    assert "serve exited with 7; restarting it in 0 s (2/2)" in out
    assert "serve exited with 7 after 2 restarts; giving up" in out and "(3/2)" not in out
    assert (tmp_path / "serve.log").read_text().count("serve started") == 3  # every start, one log
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2  # the learner and the actor, each started once
    assert (tmp_path / "pids.int").read_text() == "xx"  # both stopped by their SIGINT
    for pid in started:  # and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launch_passes_its_extra_overrides_to_each_process():
    from arli.cli import compose
    from arli.commands.pipeline import launch_commands

    cfg = compose("launch", ["extra_server=['max_batch=2','device=cpu']", "extra_learner=['run.device=cpu']"])
    cmds = launch_commands(cfg)
    assert cmds["serve"][-2:] == ["max_batch=2", "device=cpu"] and cmds["learner"][-1] == "run.device=cpu"



def test_actors_asked_to_stop_get_one_deadline_and_time_to_flush():
    """An actor that missed the learner's last weights is stopped with SIGTERM and given its
    flush time and more before it is killed; every actor shares one deadline (not one each)."""
    import time

    from arli.commands.pipeline import ACTOR_FLUSH_S, ACTOR_STOP_GRACE_S, _wait_all

    assert ACTOR_STOP_GRACE_S > ACTOR_FLUSH_S
    quick, slow = (subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({t})"]) for t in (0.2, 30))
    try:
        start = time.perf_counter()
        _wait_all([quick, slow], 1.0)
        waited = time.perf_counter() - start
        assert quick.poll() == 0 and slow.poll() is None and 1.0 <= waited < 3.0
        start = time.perf_counter()
        _wait_all([quick], 10.0)  # all gone: returns at once
        assert time.perf_counter() - start < 0.5
    finally:
        slow.kill()
        slow.wait()
