"""Building small LeRobot policies for tests (nothing downloaded): the package's own builder."""

from arli.policies.lerobot_build import save_random_lerobot_policy as save_lerobot_policy  # noqa: F401
