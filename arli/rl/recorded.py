"""Recorded intervention datasets (LeRobotDataset v3 written by ``arli record`` or the
actor's ``record_root``) as replay: every row carries the ARLI state the residual acted on,
so the episodes replay exactly as n-step transitions. Intervention steps are credited to
the intervener (anchor replay), the robot's own steps go to online replay."""

from __future__ import annotations

import os

import numpy as np

from arli.errors import InputError
from arli.rl.replay import ReplayBuffer
from arli.rl.transitions import NStepAccumulator
from arli.types import INTERVENTION, ONLINE

REQUIRED = ("arli.state", "base_action", "action", "intervention", "next.reward", "next.done")


def load_recorded(root: str, state_dim: int, action_dim: int, n_step: int, gamma: float,
                  online: ReplayBuffer, anchor: ReplayBuffer) -> dict[str, int]:
    """Add the dataset at ``root`` to ``online`` / ``anchor``; returns row counts.

    Raises ``InputError`` (one line, what to do) for a dataset that is not a recording, was
    recorded for another task or state variant, or cannot be read.
    """
    if not os.path.isfile(os.path.join(root, "meta", "info.json")):
        raise InputError(f"datasets: {root} is not a LeRobotDataset (no meta/info.json); pass a root "
                         "written by `arli record` or `arli actor record_root=...`")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: PLC0415

    try:
        ds = LeRobotDataset("arli/local", root=root)
    except Exception as exc:  # noqa: BLE001  (LeRobot raises many kinds for a broken dataset)
        raise InputError(f"datasets: cannot read {root}: {exc}") from None
    missing = [k for k in REQUIRED if k not in ds.features]
    if missing:
        raise InputError(f"datasets: {root} lacks {missing}: it is not an intervention recording (demos "
                         "go through anchor_episodes; record with `arli record`)")
    dim = int(ds.features["arli.state"]["shape"][0])
    if dim != state_dim or int(ds.features["action"]["shape"][0]) != action_dim:
        raise InputError(f"datasets: {root} holds {dim}-d ARLI states and "
                         f"{ds.features['action']['shape'][0]}-d actions; this learner uses {state_dim} and "
                         f"{action_dim}: it was recorded for another task, variant or chunk size")
    t = ds.hf_dataset.with_format("numpy")
    states = np.asarray(t["arli.state"], np.float32)
    if not np.any(states):
        raise InputError(f"datasets: {root} was recorded without a residual (ARLI state all zero); "
                         "record with the residual controller to use it as replay")
    base = np.asarray(t["base_action"], np.float32)
    action = np.asarray(t["action"], np.float32)
    reward = np.asarray(t["next.reward"], np.float32).reshape(-1)
    done = np.asarray(t["next.done"]).reshape(-1).astype(bool)
    intervened = np.asarray(t["intervention"]).reshape(-1).astype(bool)
    episode = np.asarray(t["episode_index"]).reshape(-1)
    acc = NStepAccumulator(n_step, gamma)
    counts = {"online": 0, "anchor": 0, "episodes": int(len(np.unique(episode)))}
    for i in range(len(states)):
        last = i + 1 == len(states) or episode[i + 1] != episode[i]
        nxt = i if last else i + 1
        source = INTERVENTION if intervened[i] else ONLINE
        # the recording ends every episode with done: no value beyond it (as in training)
        for tr in acc.push(states[i], base[i], action[i], float(reward[i]), states[nxt], base[nxt],
                           bool(done[i] or last), False, source):
            if tr["source"] == ONLINE:
                online.add(tr)
                counts["online"] += 1
            else:
                anchor.add(tr)
                counts["anchor"] += 1
        if last:
            acc.reset()
    return counts
