"""Any LeRobot ``PreTrainedPolicy`` checkpoint (pi0, pi0.5, SmolVLA, ACT, Diffusion) behind the
base-policy interface, loaded from a local directory with its saved pre/post processors.

Each request's cameras are matched by name to the checkpoint's ``observation.images.<name>``
input features and, with the state and the request's instruction as the task, go through
the checkpoint's own pre-processor. Policies that need an observation history (Diffusion:
``n_obs_steps = 2``) get the request's per-step history in their queues. A pi0-family
checkpoint on a transformers without the openpi fork is refused up front, in one line.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import torch

from arli.errors import InputError
from arli.logs import RateLimitedLog
from arli.policies.base import BasePolicy, BatchRequestError, with_prefix
from arli.types import Observation, PolicyRequest

# LeRobot 0.4.4 builds these only on huggingface's transformers fork for openpi (Gemma with
# adaRMS conditioning, ``transformers.models.siglip.check``): on stock transformers it first
# allocates the whole model (GBs, tens of seconds), then raises "An incorrect transformer
# version is used"
PI_POLICIES = ("pi0", "pi05", "pi0_fast")
PI_TRANSFORMERS = "transformers @ git+https://github.com/huggingface/transformers.git@fix/lerobot_openpi"
ACTION_RANGE_TOLERANCE = 1e-3  # post-processed actions this far past [-1, 1] are reported, then clipped
log = logging.getLogger("arli.policies")


def pi_transformers_installed() -> bool:
    """Whether the transformers installed is the fork LeRobot's pi0 / pi0.5 / pi0-FAST need."""
    try:
        from transformers.models.siglip import check  # noqa: PLC0415 - only the fork has it
    except ImportError:
        return False
    return bool(check.check_whether_transformers_replace_is_installed_correctly())


def require_model_dependencies(kind: str, path: str) -> None:
    """A checkpoint whose model cannot be built with the installed packages -> one InputError
    saying what to install (before any weights are allocated)."""
    if kind in PI_POLICIES and not pi_transformers_installed():
        import transformers  # noqa: PLC0415

        raise InputError(f"checkpoint: {path} is a LeRobot {kind} policy, which needs huggingface's transformers "
                         f"fork for openpi (installed: stock transformers {transformers.__version__}); install it in "
                         f"an environment of its own, since SmolVLA needs transformers>=4.57.1: "
                         f"pip install '{PI_TRANSFORMERS}'")


def _require_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device: expected a device torch can use here, got {device!r} (torch "
                         f"{torch.__version__} sees no CUDA GPU); pass device=cpu or run on the GPU machine")


def _saved_steps(path: str) -> list[dict]:
    saved = os.path.join(path, "policy_preprocessor.json")
    if not os.path.exists(saved):
        return []
    with open(saved, encoding="utf-8") as fh:
        return json.load(fh).get("steps", [])


def _inside(path: str, name: str | None) -> str | None:
    """``name`` as a directory inside the checkpoint ``path`` (a relative name saved with it, such
    as a local VLM backbone or tokenizer), or None when it is not one (a hub id, an absolute path)."""
    if name and not os.path.isabs(name) and os.path.isdir(os.path.join(path, name)):
        return os.path.join(path, name)
    return None


def _preprocessor_overrides(path: str, device: str) -> dict:
    """Overrides for the saved pre-processor: inputs go where the model is, not where the
    checkpoint was trained (its saved device step says cuda after training on a GPU), and a
    tokenizer saved beside the checkpoint under a relative name is read from there."""
    over = {}
    for step in _saved_steps(path):
        name = step.get("registry_name")
        if name == "device_processor":
            over[name] = {"device": device}
        elif name == "tokenizer_processor":
            local = _inside(path, (step.get("config") or {}).get("tokenizer_name"))
            if local:
                over[name] = {"tokenizer_name": local}
    return over


class LeRobotPolicyAdapter(BasePolicy):
    """``infer(request) -> (H, m)`` for a saved LeRobot policy directory."""

    def __init__(self, path: str, device: str = "cpu", task: str = ""):
        from lerobot.configs.policies import PreTrainedConfig  # noqa: PLC0415 - heavy
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors  # noqa: PLC0415

        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"no LeRobot policy at {path} (missing config.json)")
        cfg = PreTrainedConfig.from_pretrained(path)
        local_vlm = _inside(path, getattr(cfg, "vlm_model_name", None))  # a backbone saved beside it
        if local_vlm:
            cfg.vlm_model_name = local_vlm
        require_model_dependencies(cfg.type, path)
        _require_device(device)
        cfg.device = device
        self.cfg = cfg
        self.policy = get_policy_class(cfg.type).from_pretrained(path, config=cfg)
        self.policy.eval()
        over = _preprocessor_overrides(path, device)
        self.pre, self.post = make_pre_post_processors(cfg, pretrained_path=path,
                                                       **({"preprocessor_overrides": over} if over else {}))
        self.task = task
        self.state_key = "observation.state"
        feats = cfg.input_features
        if self.state_key not in feats:
            raise ValueError(f"{path}: policy has no {self.state_key} input; inputs: {sorted(feats)}")
        self.state_dim = int(feats[self.state_key].shape[0])
        # camera name -> (feature key, (3, h, w)): ``observation.images.<name>`` (or the
        # single-camera ``observation.image``, named "image")
        self.cameras = {k.removeprefix("observation.images."): (k, tuple(feats[k].shape or ()))
                        for k in feats if k.startswith("observation.images.")}
        if "observation.image" in feats:
            self.cameras["image"] = ("observation.image", tuple(feats["observation.image"].shape or ()))
        self.env_state = "observation.environment_state" in feats
        self.env_dim = int(feats["observation.environment_state"].shape[0]) if self.env_state else 0
        self.action_dim = int(cfg.output_features["action"].shape[0])
        self.n_obs_steps = int(getattr(cfg, "n_obs_steps", 1) or 1)
        # actions per chunk the policy is meant to execute (LeRobot's n_action_steps)
        self.chunk_size = int(getattr(cfg, "n_action_steps", None) or getattr(cfg, "chunk_size"))
        # several robots' requests in one forward pass: not for policies that read a per-robot
        # observation history from their queues (Diffusion stacks its queues even at one step)
        self.batchable = self.n_obs_steps == 1 and cfg.type != "diffusion"
        # the runtime's action space is [-1, 1]; a checkpoint whose post-processor gives robot
        # units beyond it is clipped, and said so (a silent clip would hide a unit mismatch)
        self.clipped_chunks = 0
        self._log = RateLimitedLog(log, per_window=1, window_s=60.0)

    def reset(self, seed: int | None = None) -> None:
        self.policy.reset()  # clears the observation history of history-based policies
        if seed is not None:
            torch.manual_seed(seed)

    def _observations(self, obs: Observation, task: str) -> dict:
        processed = self.pre(self._batch(obs, task))
        # the processor pipeline adds transition keys (action, reward, ...): keep observations
        return {k: v for k, v in processed.items() if k.startswith("observation.") or k == "task"}

    def _batch(self, obs: Observation, task: str) -> dict:
        state = np.asarray(obs.state, np.float32)
        if self.env_state and state.shape == (self.state_dim + self.env_dim,):
            # trained on our datasets: proprioception in observation.state, the object and
            # task state in observation.environment_state; the runtime gives both, concatenated
            batch = {self.state_key: torch.as_tensor(state[: self.state_dim])[None],
                     "observation.environment_state": torch.as_tensor(state[self.state_dim:])[None]}
        elif state.shape == (self.state_dim,):
            batch = {self.state_key: torch.as_tensor(state)[None]}
            if self.env_state:  # a policy whose environment state is a copy of its state
                if self.env_dim != self.state_dim:
                    raise ValueError(f"policy wants observation.environment_state ({self.env_dim},) and the "
                                     f"observation has only a ({self.state_dim},) state")
                batch["observation.environment_state"] = batch[self.state_key]
        else:
            want = f"({self.state_dim},)" + (f" or ({self.state_dim + self.env_dim},) = state + environment "
                                              "state" if self.env_state else "")
            raise ValueError(f"observation.state must have shape {want}, got {state.shape}")
        batch["task"] = task
        batch.update(self._cameras(obs.images))
        return batch

    def camera_shapes(self) -> dict[str, tuple[int, int, int]]:
        return {name: (shape[1], shape[2], 3) if len(shape) == 3 else (0, 0, 3)
                for name, (_, shape) in self.cameras.items()}

    def _in_range(self, actions: np.ndarray, committed_prefix: np.ndarray | None) -> np.ndarray:
        """A chunk (H, m) in the runtime's [-1, 1] action space, the prefix in its first slots;
        actions beyond the range are counted and reported (at most once a minute), then clipped."""
        k = 0 if committed_prefix is None else min(len(committed_prefix), len(actions))
        peak = float(np.abs(actions[k:]).max()) if actions[k:].size else 0.0  # the prefix slots never run
        if peak > 1.0 + ACTION_RANGE_TOLERANCE:
            self.clipped_chunks += 1
            self._log.warn("the policy's actions reach |a| = %.3f, outside the runtime's [-1, 1] action space; "
                           "clipped (%d chunks so far). A checkpoint trained on robot units needs its actions "
                           "normalised to [-1, 1] (e.g. its dataset's action stats)", peak, self.clipped_chunks)
        return with_prefix(actions, committed_prefix)

    def _cameras(self, images: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Cameras by name -> the checkpoint's ``observation.images.<name>`` features, (1, 3, h, w)
        float in [0, 1]. A missing, unexpected or misshaped camera is one ValueError naming it."""
        given = {name.removeprefix("observation.images."): img for name, img in images.items()}
        wanted = dict(self.cameras)
        missing = sorted(set(wanted) - set(given))
        if missing:
            shapes = self.camera_shapes()
            raise ValueError(f"camera(s) {missing} missing: this policy needs "
                             f"{ {name: shapes[name] for name in sorted(wanted)} } (h, w, 3) uint8, the request "
                             f"has {sorted(given)}")
        extra = sorted(set(given) - set(wanted))
        if extra and wanted:
            raise ValueError(f"unexpected camera(s) {extra}: this policy takes {sorted(wanted)}")
        out = {}
        for name, (key, shape) in wanted.items():
            image = np.asarray(given[name])
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or \
                    (shape and tuple(image.shape[:2]) != tuple(shape[1:])):
                want = f"({shape[1]}, {shape[2]}, 3)" if shape else "(h, w, 3)"
                raise ValueError(f"camera {name!r} must be a {want} uint8 image, got {image.shape} {image.dtype}")
            out[key] = torch.as_tensor(image).permute(2, 0, 1)[None].float() / 255.0
        return out

    @torch.no_grad()
    def infer(self, request: PolicyRequest) -> np.ndarray:
        """request -> (H, m). The instruction is the task (default: ``task`` given at load);
        the committed prefix is written into the first slots (LeRobot policies have no prefix
        conditioning of their own)."""
        task = request.instruction or self.task
        batch = self._observations(request.observation, task)
        if hasattr(self.policy, "_queues"):
            # History-based policies (Diffusion) read the last n_obs_steps observations from
            # their queues: they are rebuilt from the runtime's per-step history, so the frames
            # are consecutive control steps whatever the request period (LeRobot's async
            # server does not do this, its issue #3445).
            from lerobot.policies.utils import populate_queues  # noqa: PLC0415

            if request.history is not None:  # empty at an episode's start: nothing of the last one stays
                self.policy.reset()
                for past in request.history:
                    self.policy._queues = populate_queues(self.policy._queues, self._observations(past, task),
                                                          exclude_keys=["action"])
            self.policy._queues = populate_queues(self.policy._queues, batch, exclude_keys=["action"])
        chunk = self.policy.predict_action_chunk(batch)  # (1, >= H, m), normalised
        actions = self.post(chunk)[0].float().cpu().numpy()  # bfloat16 checkpoints (pi0) too
        if actions.ndim != 2 or actions.shape[1] != self.action_dim or len(actions) < self.chunk_size:
            raise ValueError(f"policy returned actions of shape {actions.shape}, expected "
                             f"(>= {self.chunk_size}, {self.action_dim})")
        return self._in_range(actions[: self.chunk_size], request.committed_prefix)

    @torch.no_grad()
    def infer_batch(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        """B requests (several robots) -> B chunks (H, m): collated into one batch that goes
        through the checkpoint's processors and one ``predict_action_chunk``, each row with its
        own cameras, state and instruction. History-based policies answer one at a time."""
        if len(requests) == 1 or not self.batchable:
            return [self.infer(r) for r in requests]
        rows = []
        for b, r in enumerate(requests):
            try:
                rows.append(self._batch(r.observation, r.instruction or self.task))
            except ValueError as exc:
                raise BatchRequestError(b, str(exc)) from None
        collated = {k: torch.cat([row[k] for row in rows]) for k in rows[0] if k != "task"}
        collated["task"] = [row["task"] for row in rows]
        processed = self.pre(collated)
        batch = {k: v for k, v in processed.items() if k.startswith("observation.") or k == "task"}
        actions = self.post(self.policy.predict_action_chunk(batch)).float().cpu().numpy()
        if actions.ndim != 3 or actions.shape[0] != len(requests) or actions.shape[2] != self.action_dim \
                or actions.shape[1] < self.chunk_size:
            raise ValueError(f"policy returned actions of shape {actions.shape}, expected "
                             f"({len(requests)}, >= {self.chunk_size}, {self.action_dim})")
        return [self._in_range(actions[b, : self.chunk_size], r.committed_prefix) for b, r in enumerate(requests)]
