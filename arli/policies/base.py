"""The one base-policy interface: the built-in flow policy, the LeRobot adapter, the scripted
expert's chunker and the inference server's remote client all implement it; the runtime,
the benchmarks and the inference server only ever see ``BasePolicy``."""

from __future__ import annotations

import abc
import time

import numpy as np

from arli.types import ActionChunk, Observation


class BasePolicy(abc.ABC):
    """Predicts chunks of ``chunk_size`` actions of dimension ``action_dim``."""

    chunk_size: int
    action_dim: int
    n_obs_steps: int = 1  # observations per request (history-based policies: > 1)

    @abc.abstractmethod
    def predict_actions(self, state: np.ndarray, committed_prefix: np.ndarray | None = None,
                        delay_steps: int | None = None, image: np.ndarray | None = None,
                        guidance: np.ndarray | None = None) -> np.ndarray:
        """state (n,) -> actions (H, m) in [-1, 1].

        committed_prefix (d, m): actions that execute during inference; they fill slots 0..d-1.
        guidance (L, m): the previous chunk over the overlap (RTC-capable policies only).
        """

    def reset(self, seed: int | None = None) -> None:
        """Start of an episode (clears histories; seeds sampling)."""

    def set_history(self, frames: list[tuple[np.ndarray, np.ndarray | None]]) -> None:
        """The ``n_obs_steps - 1`` control steps before the request, oldest first, as
        (state (n,), image (h, w, 3) | None). The runtime keeps them per control step, so a
        history-based policy sees consecutive steps, not consecutive requests. Default: unused."""

    def predict_chunk(self, observation: Observation, committed_prefix: np.ndarray | None = None,
                      delay_steps: int | None = None) -> ActionChunk:
        """Timestamped chunk for ``observation``; slot i is meant for step observation.step + i."""
        start = time.perf_counter()
        image = next(iter(observation.images.values()), None) if observation.images else None
        actions = self.predict_actions(observation.state, committed_prefix, delay_steps, image)
        return ActionChunk(actions, request_id=-1, t0=observation.step, start_step=observation.step,
                           meta={"inference_s": time.perf_counter() - start,
                                 "policy": type(self).__name__})
