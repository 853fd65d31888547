"""Building small LeRobot policies for tests (nothing downloaded)."""

import torch


def save_lerobot_policy(kind: str, path, N: int, M: int, **kw) -> None:
    """A LeRobot policy with random weights and unit-normalising processors, saved with
    LeRobot's own save_pretrained (state and environment state of N dims, M-d actions)."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (N,)),
              "observation.environment_state": PolicyFeature(FeatureType.ENV, (N,))}
    cfg = make_policy_config(kind, device="cpu", input_features=inputs,
                             output_features={"action": PolicyFeature(FeatureType.ACTION, (M,))}, **kw)
    torch.manual_seed(0)
    policy = get_policy_class(kind)(cfg)

    def stat(n):
        return {"mean": torch.zeros(n), "std": torch.ones(n), "min": -torch.ones(n), "max": torch.ones(n)}

    pre, post = make_pre_post_processors(cfg, dataset_stats={
        "observation.state": stat(N), "observation.environment_state": stat(N), "action": stat(M)})
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
