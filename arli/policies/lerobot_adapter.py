"""Any LeRobot ``PreTrainedPolicy`` checkpoint (pi0, pi0.5, SmolVLA, ACT, Diffusion) behind the
base-policy interface, loaded from a local directory with its saved pre/post processors.

Policies that need an observation history (Diffusion: ``n_obs_steps = 2``) get it from the
adapter: it keeps the last ``n_obs_steps`` observations itself and fills the policy's
queues before asking for a chunk (LeRobot's async server does not, its issue #3445).
"""

from __future__ import annotations

import os
import numpy as np
import torch

from arli.policies.base import BasePolicy


class LeRobotPolicyAdapter(BasePolicy):
    """``predict_actions(state, ...) -> (H, m)`` for a saved LeRobot policy directory."""

    def __init__(self, path: str, device: str = "cpu", task: str = ""):
        from lerobot.configs.policies import PreTrainedConfig  # noqa: PLC0415 - heavy
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors  # noqa: PLC0415

        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"no LeRobot policy at {path} (missing config.json)")
        cfg = PreTrainedConfig.from_pretrained(path)
        cfg.device = device
        self.cfg = cfg
        self.policy = get_policy_class(cfg.type).from_pretrained(path, config=cfg)
        self.policy.eval()
        self.pre, self.post = make_pre_post_processors(cfg, pretrained_path=path)
        self.task = task
        self.state_key = "observation.state"
        feats = cfg.input_features
        if self.state_key not in feats:
            raise ValueError(f"{path}: policy has no {self.state_key} input; inputs: {sorted(feats)}")
        self.state_dim = int(feats[self.state_key].shape[0])
        self.image_keys = [k for k in feats if k.startswith("observation.image")]
        self.env_state = "observation.environment_state" in feats
        self.env_dim = int(feats["observation.environment_state"].shape[0]) if self.env_state else 0
        self.action_dim = int(cfg.output_features["action"].shape[0])
        self.n_obs_steps = int(getattr(cfg, "n_obs_steps", 1) or 1)
        # actions per chunk the policy is meant to execute (LeRobot's n_action_steps)
        self.chunk_size = int(getattr(cfg, "n_action_steps", None) or getattr(cfg, "chunk_size"))
        self._history = None

    def reset(self, seed: int | None = None) -> None:
        self.policy.reset()  # clears the observation history of history-based policies
        self._history: list[tuple[np.ndarray, np.ndarray | None]] | None = None
        if seed is not None:
            torch.manual_seed(seed)

    def set_history(self, frames: list[tuple[np.ndarray, np.ndarray | None]]) -> None:
        """The control steps before the next request (oldest first): a history-based
        policy's queue is rebuilt from them, so its n_obs_steps frames are consecutive
        control steps whatever the request period."""
        self._history = list(frames)

    def _observations(self, state: np.ndarray, image: np.ndarray | None) -> dict:
        processed = self.pre(self._batch(state, image))
        # the processor pipeline adds transition keys (action, reward, ...): keep observations
        return {k: v for k, v in processed.items() if k.startswith("observation.") or k == "task"}

    def _batch(self, state: np.ndarray, image: np.ndarray | None) -> dict:
        state = np.asarray(state, np.float32)
        if self.env_state and state.shape == (self.state_dim + self.env_dim,):
            # trained on our datasets: proprioception in observation.state, the object and
            # task state in observation.environment_state; the runtime gives both, concatenated
            batch = {self.state_key: torch.as_tensor(state[: self.state_dim])[None],
                     "observation.environment_state": torch.as_tensor(state[self.state_dim:])[None],
                     "task": self.task}
        elif state.shape == (self.state_dim,):
            batch = {self.state_key: torch.as_tensor(state)[None], "task": self.task}
            if self.env_state:  # a policy whose environment state is a copy of its state
                if self.env_dim != self.state_dim:
                    raise ValueError(f"policy wants observation.environment_state ({self.env_dim},) and the "
                                     f"observation has only a ({self.state_dim},) state")
                batch["observation.environment_state"] = batch[self.state_key]
        else:
            want = f"({self.state_dim},)" + (f" or ({self.state_dim + self.env_dim},) = state + environment "
                                              "state" if self.env_state else "")
            raise ValueError(f"observation.state must have shape {want}, got {state.shape}")
        for key in self.image_keys:
            if image is None:
                raise ValueError(f"policy needs image feature {key!r}; the observation has none")
            batch[key] = torch.as_tensor(np.asarray(image)).permute(2, 0, 1)[None].float() / 255.0
        return batch

    @torch.no_grad()
    def predict_actions(self, state: np.ndarray, committed_prefix: np.ndarray | None = None,
                        delay_steps: int | None = None, image: np.ndarray | None = None,
                        guidance: np.ndarray | None = None) -> np.ndarray:
        """(n,) -> (H, m). The committed prefix is written into the first slots (LeRobot
        policies have no prefix conditioning of their own)."""
        batch = self._observations(state, image)
        if hasattr(self.policy, "_queues"):
            # History-based policies (Diffusion) read the last n_obs_steps observations from
            # their queues; the first call fills them with copies (LeRobot's convention).
            from lerobot.policies.utils import populate_queues  # noqa: PLC0415

            history = getattr(self, "_history", None)
            if history is not None:  # the runtime's per-step frames replace the per-call queue
                self.policy.reset()
                for past_state, past_image in history:
                    self.policy._queues = populate_queues(self.policy._queues,
                                                          self._observations(past_state, past_image),
                                                          exclude_keys=["action"])
            self.policy._queues = populate_queues(self.policy._queues, batch, exclude_keys=["action"])
        chunk = self.policy.predict_action_chunk(batch)  # (1, >= H, m), normalised
        actions = self.post(chunk)[0].cpu().numpy().astype(np.float32)
        if actions.ndim != 2 or actions.shape[1] != self.action_dim or len(actions) < self.chunk_size:
            raise ValueError(f"policy returned actions of shape {actions.shape}, expected "
                             f"(>= {self.chunk_size}, {self.action_dim})")
        actions = actions[: self.chunk_size]
        if committed_prefix is not None and len(committed_prefix):
            k = min(len(committed_prefix), len(actions))
            actions[:k] = committed_prefix[:k]
        return np.clip(actions, -1.0, 1.0)

