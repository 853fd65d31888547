"""Intervention devices, up to the hardware boundary: real SpaceMouse HID report layouts,
pygame joystick events, key presses, and the scripted operator behind the same interface."""

from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

from robot_drivers.teleop.base import Event
from robot_drivers.teleop.gamepad import Gamepad
from robot_drivers.teleop.keyboard import Keyboard
from robot_drivers.teleop.scripted import ScriptedOperator
from robot_drivers.teleop.spacemouse import SpaceMouse

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def test_spacemouse_reports_map_to_actions_and_events():
    sm = SpaceMouse()
    sm.feed(struct.pack("<B3h", 1, 0, -350, 0))  # old layout, translation only: full push forward
    state = sm.poll()
    np.testing.assert_allclose(state.twist, [1.0, 0.0, 0.0, 0.0], atol=1e-6)
    assert state.gripper == -1.0 and state.events == []
    sm.feed(b"\x01" + struct.pack("<6h", 100, 0, 0, 0, 0, -350))  # new layout: translation + rotation
    state = sm.poll()
    np.testing.assert_allclose(state.twist, [0.0, -(100 / 350 - 0.08) / 0.92, 0.0, 1.0], atol=1e-5)
    sm.feed(struct.pack("<B3h", 2, 0, 0, 20))  # rotation report inside the dead zone
    assert sm.poll().twist[3] == 0.0
    sm.feed(b"\x03\x01")  # left button down: take over
    sm.feed(b"\x03\x00")  # released: nothing
    assert sm.poll().events == [Event.TAKE_OVER] and sm.active
    sm.feed(b"\x03\x01")  # pressed again: hand back
    assert sm.poll().events == [Event.HAND_BACK] and not sm.active
    sm.feed(b"\x03\x02")  # right button: gripper closes
    assert sm.poll().gripper == 1.0
    np.testing.assert_allclose(sm.poll().action()[4], 1.0)


def test_spacemouse_bad_reports_and_missing_device_are_clear():
    sm = SpaceMouse()
    with pytest.raises(ValueError, match="report 1 has 3 data bytes"):
        sm.feed(b"\x01\x00\x00\x00")
    sm.feed(b"\x07\x01\x02")  # an unknown report id is ignored
    assert sm.poll().events == []
    started = SpaceMouse().start()  # no 3Dconnexion device on this machine
    assert not started.connected and "unavailable" in started.status


def test_gamepad_events_map_to_actions_and_events():
    import pygame

    pad = Gamepad()
    pad.feed(pygame.event.Event(pygame.JOYAXISMOTION, axis=1, value=-1.0, joy=0, instance_id=0))  # left stick up
    pad.feed(pygame.event.Event(pygame.JOYAXISMOTION, axis=3, value=0.05, joy=0, instance_id=0))  # inside dead zone
    pad.feed(pygame.event.Event(pygame.JOYBUTTONDOWN, button=0, joy=0, instance_id=0))
    pad.feed(pygame.event.Event(pygame.JOYBUTTONDOWN, button=5, joy=0, instance_id=0))
    state = pad.poll()
    np.testing.assert_allclose(state.twist, [1.0, 0.0, 0.0, 0.0])
    assert state.events == [Event.TAKE_OVER] and state.gripper == 1.0 and pad.active
    pad.feed(pygame.event.Event(pygame.JOYBUTTONDOWN, button=2, joy=0, instance_id=0))
    assert pad.poll().events == [Event.SUCCESS] and not pad.active
    pad.connected = True
    pad.feed(pygame.event.Event(pygame.JOYDEVICEREMOVED, instance_id=0))
    assert not pad.connected and "unplugged" in pad.status


def test_gamepad_missing_is_reported_not_fatal():
    pad = Gamepad(index=3).start()
    assert not pad.connected and "unavailable" in pad.status
    assert pad.poll().events == []  # the run goes on without it


def test_keyboard_held_keys_and_events():
    kb = Keyboard()
    kb.press("w")
    kb.press("q")
    kb.press("space")
    kb.press("t")
    state = kb.poll()
    np.testing.assert_allclose(state.twist, [0.5, 0.0, 0.0, 0.5])
    assert state.gripper == 1.0 and state.events == [Event.TAKE_OVER]
    kb.release("w")
    kb.press("enter")
    state = kb.poll()
    np.testing.assert_allclose(state.twist, [0.0, 0.0, 0.0, 0.5])
    assert state.events == [Event.SUCCESS] and not kb.active



def test_a_keyboard_without_a_display_is_unavailable_with_the_reason(monkeypatch):
    """pynput raises ImportError without an X display or uinput: the device says so."""
    monkeypatch.setitem(sys.modules, "pynput", None)  # import pynput -> ImportError, as without a display
    started = Keyboard().start()
    assert not started.connected and started.status.startswith("keyboard unavailable:")
    assert started.poll().events == [] and not started.active
    started.close()


def test_scripted_operator_takes_over_and_hands_back_through_the_device_interface():
    from sim_envs import make_env
    from sim_envs.experts import EXPERTS

    env = make_env("pick_cube")
    state = env.reset(seed=0)[0]["state"]
    op = ScriptedOperator(EXPERTS["pick_cube"], threshold=0.5, patience=2, segment=3)
    expert = EXPERTS["pick_cube"](state)
    far = -np.sign(expert + 1e-3).astype(np.float32)  # the robot proposes the opposite
    events = []
    for _ in range(6):
        op.observe(state, far)
        s = op.poll()
        events.append(s.events)
        np.testing.assert_allclose(s.action(), expert, atol=1e-6)  # the operator's command is the expert's
    # takes over on the 2nd deviating step, drives 3 steps, hands back on the 4th and judges
    # again: the robot still deviates, so it takes over again after 2 more steps
    assert events == [[], [Event.TAKE_OVER], [], [], [Event.HAND_BACK], [Event.TAKE_OVER]]


def test_an_unplugged_device_is_reported_once_and_the_run_goes_on(caplog):
    """A person's device that is not there: the intervener never acts, says so once, and
    the robot keeps running its own policy; events of a device that is there still pass."""
    from arli.runtime.intervention import Intervention  # noqa: PLC0415
    from arli.rl.config import InterventionSpec  # noqa: PLC0415

    gone = SpaceMouse(path=b"/dev/hidraw-nothing").start()
    assert not gone.connected and "unavailable" in gone.status
    intervention = Intervention(None, InterventionSpec(prob=1.0), gone)
    intervention.begin_episode(watching=True)
    with caplog.at_level("WARNING", logger="arli.intervention"):
        for t in range(20):
            assert intervention.decide(t, np.zeros(9), np.zeros(5)) is None
    assert sum("going on without it" in r.message for r in caplog.records) == 1

    pad = Gamepad()
    pad.connected, pad.status = True, "test"
    intervention = Intervention(None, InterventionSpec(prob=1.0), pad)
    intervention.begin_episode(watching=True)
    pad._events.append(Event.SUCCESS)
    intervention.decide(0, np.zeros(9), np.zeros(5))
    assert intervention.events == [Event.SUCCESS]
