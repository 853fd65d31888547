"""Small LeRobot policies at random init, saved as a checkpoint directory (LeRobot's own
``save_pretrained`` + processors): what tests and speed benchmarks serve when no trained
checkpoint may be downloaded. Weights do not matter for speed, and for the tests' checks."""

from __future__ import annotations


def save_random_lerobot_policy(kind: str, path, N: int, M: int, cameras: dict | None = None, **kw) -> None:
    """A LeRobot ``kind`` policy (act, diffusion, ...) with random weights and unit-normalising
    processors at ``path``: state and environment state of N dims, M-d actions and ``cameras``
    (name -> (3, h, w) as ``observation.images.<name>``); ``kw`` go to its config."""
    import torch  # noqa: PLC0415 - heavy
    from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: PLC0415
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors  # noqa: PLC0415

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (N,)),
              "observation.environment_state": PolicyFeature(FeatureType.ENV, (N,))}
    image_stats = {}
    for name, shape in (cameras or {}).items():
        inputs[f"observation.images.{name}"] = PolicyFeature(FeatureType.VISUAL, tuple(shape))
        image_stats[f"observation.images.{name}"] = {
            "mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25),
            "min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}
    cfg = make_policy_config(kind, device="cpu", input_features=inputs,
                             output_features={"action": PolicyFeature(FeatureType.ACTION, (M,))}, **kw)
    torch.manual_seed(0)
    policy = get_policy_class(kind)(cfg)

    def stat(n):
        return {"mean": torch.zeros(n), "std": torch.ones(n), "min": -torch.ones(n), "max": torch.ones(n)}

    pre, post = make_pre_post_processors(cfg, dataset_stats={
        "observation.state": stat(N), "observation.environment_state": stat(N), "action": stat(M),
        **image_stats})
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
