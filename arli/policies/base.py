"""The one base-policy interface: the built-in flow policy, the LeRobot adapter and the
scripted expert's chunker implement it; the runtime's ``SimInference``, the inference server
and the benchmarks call it with one typed ``PolicyRequest``, as openpi's ``infer``."""

from __future__ import annotations

import abc

import numpy as np

from arli.types import PolicyRequest


class BatchRequestError(ValueError):
    """Request ``index`` of a batch does not fit the policy (the message names it): the server
    answers that one with the error and the rest of the batch as usual."""

    def __init__(self, index: int, message: str):
        super().__init__(f"request {index} of the batch: {message}")
        self.index, self.detail = index, message


class BasePolicy(abc.ABC):
    """Predicts chunks of ``chunk_size`` actions of dimension ``action_dim``.

    ``n_obs_steps``: observations per request (history-based policies such as Diffusion: > 1);
    the runtime sends the ``n_obs_steps - 1`` control steps before the request as
    ``PolicyRequest.history``.
    """

    chunk_size: int
    action_dim: int
    n_obs_steps: int = 1
    batchable: bool = False  # infer_batch answers B requests with one forward pass

    @abc.abstractmethod
    def infer(self, request: PolicyRequest) -> np.ndarray:
        """request -> actions (H, m) in [-1, 1]; slots 0..d-1 hold the committed prefix.

        Raises ValueError naming the camera, state or shape when the request does not fit
        the policy (the server turns it into an error reply and keeps serving)."""

    def infer_batch(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        """B requests (several robots) -> B chunks (H, m); one at a time unless the policy
        batches (``batchable``). A request that does not fit raises BatchRequestError naming it."""
        return [self.infer(r) for r in requests]

    def reset(self, seed: int | None = None) -> None:
        """Start of an episode (clears histories; seeds sampling)."""

    def camera_shapes(self) -> dict[str, tuple[int, int, int]]:
        """The cameras a request must carry: name -> (h, w, 3) uint8 image (0 for a size the
        policy does not fix); empty for a state-only policy."""
        return {}


def with_prefix(actions: np.ndarray, committed_prefix: np.ndarray | None) -> np.ndarray:
    """actions (H, m) with the committed slots overwritten by what runs, clipped to [-1, 1]."""
    actions = np.array(actions, np.float32)
    if committed_prefix is not None and len(committed_prefix):
        k = min(len(committed_prefix), len(actions))
        actions[:k] = committed_prefix[:k]
    return np.clip(actions, -1.0, 1.0)
