"""The declared mapping between ARLI's records and an openpi policy server's dicts (the
``openpi`` config group): ARLI's flat state (n,) and cameras onto openpi's observation keys, the
reply's actions (H, M) onto the robot's m action dims. ``arli.transport.openpi_endpoint`` sends
and receives what this module builds and checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from openpi_client import image_tools

from arli.errors import InputError, require
from arli.types import Observation


class OpenPIError(InputError):
    """The openpi server is unreachable, or answers what this mapping cannot use."""


@dataclass
class OpenPIConfig:
    """The ``openpi`` group: where the server is and how ARLI's observation and actions map onto
    its keys (openpi's example clients use ``observation/state`` or ``observation/joint_position``
    + ``observation/gripper_position``, ``observation/image`` / ``observation/wrist_image`` or
    ``observation/exterior_image_1_left`` / ``observation/wrist_image_left``, and ``prompt``)."""

    uri: str = "ws://127.0.0.1:8000"
    api_key: str = ""  # sent as "Authorization: Api-Key <key>" when set, as openpi_client does
    # openpi key -> [start, end): that slice of ARLI's flat state (n,) as float32. Required, and
    # empty here because Hydra merges a dict override into the default: +openpi.state={k:[0,9]}
    state: dict[str, list[int]] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)  # ARLI camera name -> openpi key: +openpi.images={...}
    prompt_key: str = "prompt"  # the instruction goes here; "" = no prompt sent
    actions_key: str = "actions"
    action_slice: list[int] = field(default_factory=list)  # [start, end) of the reply's M columns; [] = all
    image_size: int = 224  # resize_with_pad to S x S uint8 (openpi's clients use 224); 0 = as captured
    connect_timeout_s: float = 300.0  # connect + the warm-up request (openpi compiles on its first call)

    def validate(self) -> None:
        require(self.uri.startswith(("ws://", "wss://")), "openpi.uri", "a WebSocket address like ws://host:8000",
                self.uri)
        require(bool(self.state), "openpi.state", "the openpi keys its policy reads, each a [start, end) slice "
                "of the robot's state, e.g. +openpi.state={observation/state:[0,9]}", self.state)
        for key, span in self.state.items():
            require(len(span) == 2 and 0 <= span[0] < span[1], f"openpi.state[{key}]",
                    "[start, end) with 0 <= start < end", list(span))
        require(self.action_slice == [] or (len(self.action_slice) == 2 and 0 <= self.action_slice[0]
                                           < self.action_slice[1]),
                "openpi.action_slice", "[] (all columns) or [start, end) with 0 <= start < end", self.action_slice)
        keys = self.keys()
        require(len(keys) == len(set(keys)), "openpi", "each openpi key used once across state, images and "
                "prompt_key", keys)
        require(bool(self.actions_key), "openpi.actions_key", "the key of the actions in the reply", self.actions_key)
        require(self.image_size >= 0, "openpi.image_size", "an integer >= 0 (0 = as captured)", self.image_size)
        require(self.connect_timeout_s > 0, "openpi.connect_timeout_s", "> 0", self.connect_timeout_s)

    def keys(self) -> list[str]:
        """Every openpi key a request carries."""
        return [*self.state, *self.images.values(), *([self.prompt_key] if self.prompt_key else [])]


class OpenPIMapping:
    """``cfg`` checked against a robot of ``state_dim`` n and ``action_dim`` m; ``instruction``:
    the prompt of an observation that has none."""

    def __init__(self, cfg: OpenPIConfig, state_dim: int, action_dim: int, instruction: str = ""):
        cfg.validate()
        for key, (start, end) in cfg.state.items():
            require(end <= state_dim, f"openpi.state[{key}]", f"a slice within the robot's state of {state_dim} dims",
                    [start, end])
        if cfg.action_slice:
            width = cfg.action_slice[1] - cfg.action_slice[0]
            require(width == action_dim, "openpi.action_slice", f"{action_dim} columns (the robot's action dim)",
                    cfg.action_slice)
        self.cfg, self.state_dim, self.action_dim, self.instruction = cfg, state_dim, action_dim, instruction

    def check_cameras(self, obs: Observation) -> None:
        """Every mapped camera is in ``obs``, or an OpenPIError naming the ones that are not."""
        missing = sorted(set(self.cfg.images) - set(obs.images))
        if missing:
            raise OpenPIError(f"openpi.images: camera(s) {missing} not in the robot's observation (it has "
                              f"{sorted(obs.images)}); map the cameras it has")

    def probe(self) -> Observation:
        """The warm-up observation: a zero state, black (S, S, 3) images (S = 224 when sent as captured)."""
        size = self.cfg.image_size or 224
        return Observation(np.zeros(self.state_dim, np.float32), 0,
                           images={name: np.zeros((size, size, 3), np.uint8) for name in self.cfg.images})

    def observation(self, obs: Observation) -> dict:
        """ARLI's observation as openpi's dict: state slices (float32), images (S, S, 3) uint8
        (``resize_with_pad``, as openpi's clients), the instruction under ``prompt_key``."""
        state = np.asarray(obs.state, np.float32)
        out: dict = {key: state[start:end].copy() for key, (start, end) in self.cfg.state.items()}
        for name, key in self.cfg.images.items():
            image = np.asarray(obs.images[name])
            if self.cfg.image_size:
                image = image_tools.resize_with_pad(image, self.cfg.image_size, self.cfg.image_size)
            out[key] = np.ascontiguousarray(image_tools.convert_to_uint8(image))
        if self.cfg.prompt_key:
            out[self.cfg.prompt_key] = obs.instruction or self.instruction
        return out

    def actions(self, reply: object, chunk_size: int = 0) -> np.ndarray:
        """The reply's actions as (H, m) float32 (H = ``chunk_size`` when given), or an
        OpenPIError naming the key and the shapes."""
        key = self.cfg.actions_key
        if isinstance(reply, OpenPIError):
            raise reply
        if not isinstance(reply, dict) or key not in reply:
            got = sorted(map(str, reply)) if isinstance(reply, dict) else type(reply).__name__
            raise OpenPIError(f"openpi reply: expected a dict with {key!r} (H, M) actions, got {got}; set "
                              "openpi.actions_key to the key the server's policy returns")
        actions = np.asarray(reply[key])
        if actions.ndim != 2 or actions.dtype.kind not in "fiu":
            raise OpenPIError(f"openpi reply {key!r}: expected an (H, M) array of numbers, got shape "
                              f"{actions.shape} of {actions.dtype}")
        if self.cfg.action_slice:
            start, end = self.cfg.action_slice
            if actions.shape[1] < end:
                raise OpenPIError(f"openpi.action_slice: expected columns within the reply's {key!r} of shape "
                                  f"{actions.shape}, got {self.cfg.action_slice}")
            actions = actions[:, start:end]
        if actions.shape[1] != self.action_dim:
            raise OpenPIError(f"openpi reply {key!r}: expected (H, {self.action_dim}) actions for this robot, got "
                              f"{actions.shape}; set openpi.action_slice=[start,end] to the {self.action_dim} "
                              "columns it takes")
        if chunk_size and actions.shape[0] != chunk_size:
            raise OpenPIError(f"openpi reply {key!r}: expected ({chunk_size}, {self.action_dim}) as in the "
                              f"warm-up reply, got {actions.shape}: the server changed its chunk size")
        if not np.all(np.isfinite(actions)):
            raise OpenPIError(f"openpi reply {key!r}: non-finite actions (NaN or inf), refused")
        return actions.astype(np.float32)


def timing(reply: dict) -> dict[str, float]:
    """openpi's ``server_timing`` / ``policy_timing`` (ms) as flat numbers: ``server_infer_ms``, ..."""
    out = {}
    for group in ("server_timing", "policy_timing"):
        values = reply.get(group)
        if isinstance(values, dict):
            out.update({f"{group.split('_')[0]}_{k}": float(v) for k, v in values.items()
                        if isinstance(v, (int, float, np.number))})
    return out


def last_line(text: str) -> str:
    """The last non-empty line of a traceback (what was raised)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text
