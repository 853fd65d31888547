"""Recording intervention episodes from inside the runtime loop.

``RecordingController`` wraps the step controller that acts (the residual with its
intervener, or anything else) and writes every step to a crash-safe LeRobotDataset
(``arli.record.EpisodeRecorder``): what the robot saw, what the base policy scheduled,
what the residual proposed, what was executed, whether a person (or the scripted
operator) was in control, and the scheduler's timing. Operator events from the device
end the episode (success / failure) or throw it away (re-record).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from arli.interfaces import StepController
from arli.record import EpisodeRecorder
from arli.types import Observation, StepInfo
from robot_drivers.base import RobotDriver
from robot_drivers.teleop.base import Event

log = logging.getLogger("arli.recording")

# Per-step features beyond state/action/reward/done (LeRobot names use dots, not slashes).
TIMING_FEATURES = ("delay_steps", "chunk_id", "chunk_slot")


def intervention_features(state_names: Sequence[str], env_state_names: Sequence[str],
                          action_names: Sequence[str], arli_state_dim: int,
                          cameras: dict[str, tuple[int, int]] | None = None,
                          use_videos: bool = True) -> dict:
    """LeRobot feature spec of an intervention dataset.

    ``observation.state`` is proprioception, ``observation.environment_state`` the object /
    task state when there is one (sim), cameras ``observation.images.<name>`` as video
    (``cameras``: name -> (height, width)). ``arli.state`` (D,) is the ARLI state the
    residual acted on, so the learner can replay the rows exactly.
    """
    m = len(action_names)
    vec = lambda n, names=None: {"dtype": "float32", "shape": (n,), "names": names}  # noqa: E731
    features = {
        "observation.state": vec(len(state_names), list(state_names)),
        "action": vec(m, list(action_names)),
        "base_action": vec(m, list(action_names)),
        "residual_action": vec(m, list(action_names)),
        "intervention": {"dtype": "bool", "shape": (1,), "names": None},
        "next.reward": vec(1),
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
        "arli.state": vec(arli_state_dim),
        **{k: {"dtype": "int64", "shape": (1,), "names": None} for k in TIMING_FEATURES},
    }
    if env_state_names:
        features["observation.environment_state"] = vec(len(env_state_names), list(env_state_names))
    for name, (h, w) in (cameras or {}).items():
        features[f"observation.images.{name}"] = {
            "dtype": "video" if use_videos else "image", "shape": (h, w, 3),
            "names": ["height", "width", "channels"]}
    return features


@dataclass
class EpisodeSummary:
    index: int  # episode index in the dataset (-1: not saved)
    frames: int
    success: bool
    intervened_steps: int
    saved: bool
    reason: str = ""  # why it was not saved, or how it ended (robot fault, operator verdict)


@dataclass
class RecordingController(StepController):
    """Wraps ``inner``; one dataset frame per executed step, one episode per loop episode.

    ``proprio_dim``: how many leading state entries are proprioception (the rest go to
    ``observation.environment_state``). ``driver``: told the operator's verdict
    (``end_episode``) when the device sends success / failure. ``save_failed``: keep
    episodes that did not succeed (intervention data is useful either way).
    """

    inner: StepController
    recorder: EpisodeRecorder
    task: str
    proprio_dim: int
    driver: RobotDriver | None = None
    save_failed: bool = True
    summaries: list[EpisodeSummary] = field(default_factory=list)

    def __post_init__(self) -> None:
        feats = self.recorder.features
        self._arli_dim = int(feats["arli.state"]["shape"][0]) if "arli.state" in feats else 0
        # camera name -> (h, w) of the image features this dataset stores
        self._cameras = {k.rsplit(".", 1)[1]: tuple(v["shape"][:2]) for k, v in feats.items()
                         if k.startswith("observation.images.")}
        self._last_images: dict[str, np.ndarray] = {}
        self._frames: list[dict] = []
        self._open: dict | None = None
        self._rerecord = False
        self._verdict: str = ""

    def begin_episode(self) -> None:
        self.inner.begin_episode()
        self._frames, self._open, self._rerecord, self._verdict = [], None, False, ""

    def act(self, t: int, obs: Observation, info: StepInfo) -> np.ndarray:
        action = np.asarray(self.inner.act(t, obs, info), np.float32)
        decision = self.inner.last_decision
        self._handle_events(decision.events if decision is not None else ())
        base = np.asarray(info.base_action, np.float32)
        proposed = np.asarray(decision.proposed if decision is not None else action, np.float32)
        state = np.asarray(obs.state, np.float32)
        frame = {
            "observation.state": state[: self.proprio_dim],
            "action": action,
            "base_action": base,
            "residual_action": proposed - base,
            "intervention": np.array([decision is not None and decision.intervened]),
            # a controller without an ARLI state (plain base policy) records zeros
            "arli.state": np.asarray(decision.state if decision is not None else np.zeros(self._arli_dim),
                                     np.float32),
            "delay_steps": np.array([info.delay_steps], np.int64),
            "chunk_id": np.array([info.chunk_id], np.int64),
            "chunk_slot": np.array([info.index_in_chunk], np.int64),
            "images": self._images(obs),
        }
        if state.shape[0] > self.proprio_dim:
            frame["observation.environment_state"] = state[self.proprio_dim:]
        self._open = frame
        return action

    def after_step(self, t: int, reward: float, terminated: bool, truncated: bool) -> None:
        self.inner.after_step(t, reward, terminated, truncated)
        frame, self._open = self._open, None
        if frame is not None:  # outcome of the frame's action
            frame["next.reward"] = np.array([reward], np.float32)
            frame["next.done"] = np.array([terminated or truncated])
            frame["next.success"] = np.array([bool(terminated and reward > 0)])
            self._frames.append(frame)

    def end(self, obs: Observation, info: StepInfo, terminated: bool, truncated: bool) -> None:
        self.inner.end(obs, info, terminated, truncated)
        frames, self._frames = self._frames, []
        success = bool(frames and frames[-1]["next.success"][0])
        intervened = int(sum(bool(f["intervention"][0]) for f in frames))
        reason = self._verdict
        if self._open is not None:  # the robot failed mid-step: that step has no outcome
            reason = reason or "robot fault"
            self._open = None
        if frames:
            frames[-1]["next.done"] = np.array([True])  # however it ended, it ended here
        keep = bool(frames) and not self._rerecord and (success or self.save_failed)
        if keep:
            for f in frames:
                images = f.pop("images")
                extra = {k: v for k, v in f.items() if k not in (
                    "observation.state", "action", "next.reward", "next.done", "next.success")}
                self.recorder.add_frame(f["observation.state"], f["action"], float(f["next.reward"][0]),
                                        bool(f["next.done"][0]), bool(f["next.success"][0]), self.task,
                                        images, extra)
            self.recorder.save_episode()
        why = "re-record" if self._rerecord else ("empty" if not frames else
                                                  ("failed (save_failed=false)" if not keep else reason))
        self.summaries.append(EpisodeSummary(self.recorder.total_episodes - 1 if keep else -1,
                                             len(frames), success, intervened, keep, why))

    def warm(self) -> None:
        """Before the tick (real clock): let the wrapped controller prepare."""
        self.inner.warm()

    def _images(self, obs: Observation) -> dict[str, np.ndarray]:
        """One frame per camera of the dataset; a camera with no fresh frame this step
        repeats its last one (black before the first), so every row stays complete."""
        out = {}
        for name, (h, w) in self._cameras.items():
            img = obs.images.get(name)
            if img is None:
                img = self._last_images.get(name, np.zeros((h, w, 3), np.uint8))
            self._last_images[name] = img
            out[name] = img
        return out

    def _handle_events(self, events) -> None:
        for event in events:
            if event is Event.RERECORD:
                self._rerecord = True
                self._end_now(False, "re-record")
            elif event in (Event.SUCCESS, Event.FAILURE):
                self._end_now(event is Event.SUCCESS, event.value)

    def _end_now(self, success: bool, why: str) -> None:
        self._verdict = why
        if self.driver is None or not self.driver.end_episode(success):
            log.warning("operator said %s, but this driver cannot end an episode early", why)
