"""One loader for every kind of base policy the runtime can drive."""

from __future__ import annotations

import hashlib
import json
import os

EXPERT = "expert"  # the scripted expert's open-loop chunks (no checkpoint needed)
# files a checkpoint directory may hold that record how it was made, not what it does
RECORD_FILES = frozenset({"pretrain_summary.json"})


def policy_digest(path: str) -> str:
    """Content hash (12 hex digits) of a checkpoint directory's weights, configs and
    processors: two directories with equal digests drive the robot identically. Files that
    only record how it was made (``RECORD_FILES``: wall times, curves) and the path are left
    out, so a base re-trained with the same seed, demos and ``threads`` hashes the same."""
    if path == EXPERT:
        return EXPERT
    h = hashlib.sha1()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name in RECORD_FILES:
                continue
            h.update(os.path.relpath(os.path.join(root, name), path).encode())
            with open(os.path.join(root, name), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:12]


def load_base_policy(path: str, task: str = "", env_name: str = "", chunk_size: int = 16,
                     state_dim: int | None = None, device: str = "cpu"):
    """``expert``, a built-in flow checkpoint, or any LeRobot policy directory -> BasePolicy.

    task: language instruction for LeRobot VLAs; env_name, chunk_size: for ``expert``.
    state_dim: the task's state size; a checkpoint trained for another is refused (InputError).
    device: the torch device a LeRobot policy runs on (cpu, cuda, cuda:1).
    """
    policy = _load(path, task, env_name, chunk_size, device)
    if state_dim is not None and path != EXPERT:
        takes = _state_sizes(policy)
        if takes and state_dim not in takes:
            from arli.errors import InputError  # noqa: PLC0415

            trained = getattr(getattr(policy, "cfg", None), "instruction", "") or "another task"
            raise InputError(f"checkpoint: {path} takes a {' or '.join(map(str, sorted(takes)))}-d state "
                             f"(trained for: {trained!r}); env {env_name or '?'} has a {state_dim}-d state: pass "
                             f"that task's checkpoint (checkpoints/base_{env_name}) or pretrain one")
    return policy


def _state_sizes(policy) -> set[int]:
    cfg = getattr(policy, "cfg", None)
    if hasattr(policy, "env_dim"):  # LeRobot: its state alone, or state + environment state
        return {policy.state_dim, policy.state_dim + policy.env_dim} if policy.env_dim else {policy.state_dim}
    return {int(cfg.state_dim)} if cfg is not None and hasattr(cfg, "state_dim") else set()


def _load(path: str, task: str, env_name: str, chunk_size: int, device: str):
    if path == EXPERT:
        from sim_envs import task_name  # noqa: PLC0415
        from arli.policies.expert import ExpertChunkPolicy  # noqa: PLC0415

        return ExpertChunkPolicy(task_name(env_name), chunk_size)
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"no policy checkpoint at {path} (missing config.json); run "
                                "`arli pretrain`, point to a LeRobot policy directory, or use 'expert'")
    with open(cfg_path, encoding="utf-8") as fh:
        kind = json.load(fh).get("type")
    if kind == "arli_flow":
        from arli.policies.flow import FlowPolicy  # noqa: PLC0415

        return FlowPolicy.load(path).to(device)
    from arli.policies.lerobot_adapter import LeRobotPolicyAdapter  # noqa: PLC0415

    return LeRobotPolicyAdapter(path, device=device, task=task)
