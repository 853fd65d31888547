"""One loader for every kind of base policy the runtime can drive."""

from __future__ import annotations

import json
import os

EXPERT = "expert"  # the scripted expert's open-loop chunks (no checkpoint needed)


def load_base_policy(path: str, task: str = "", env_name: str = "", chunk_size: int = 16):
    """``expert``, a built-in flow checkpoint, or any LeRobot policy directory -> BasePolicy.

    task: language instruction for LeRobot VLAs; env_name, chunk_size: for ``expert``.
    """
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

        return FlowPolicy.load(path)
    from arli.policies.lerobot_adapter import LeRobotPolicyAdapter  # noqa: PLC0415

    return LeRobotPolicyAdapter(path, task=task)
