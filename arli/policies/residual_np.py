"""The residual on the robot side, in numpy: the actor's forward pass and acting with
exploration, ``a_t = clip(b_t + scale * r_t, -1, 1)``. No torch import, so ``arli actor``
runs without it. Shapes: D state dim, m action dim.
"""

from __future__ import annotations

import math

import numpy as np


# a weights message's critic arrays (value gating on the robot) are its state dict's keys with this prefix
CRITIC_PREFIX = "critic."
# what value gating chooses among, in the candidates' order: the actor's r(s), 0 (the base alone),
# a perturbation of r(s) (every candidate past the first two)
GATE_PICKS = ("pi", "base", "perturbed")


def gate_pick(index: int) -> int:
    """The GATE_PICKS slot of the gate's chosen candidate index (every perturbation counts as one)."""
    return min(index, len(GATE_PICKS) - 1)


def compose_numpy(base: np.ndarray, residual: np.ndarray, scale: float) -> np.ndarray:
    """a = clip(b + scale * r, -1, 1) for arrays (..., m), float32."""
    return np.clip(base + scale * residual, -1.0, 1.0).astype(np.float32)


def project_numpy(target: np.ndarray, base: np.ndarray, scale: float) -> np.ndarray:
    """The action (..., m) of the residual's reach nearest ``target`` (..., m) per entry:
    clip(b + scale * clip((target - b) / scale, -1, 1), -1, 1), i.e. what a residual with
    bound ``scale`` on the base action ``base`` (..., m) can execute."""
    base = np.asarray(base, np.float32)
    return compose_numpy(base, np.clip((np.asarray(target, np.float32) - base) / scale, -1.0, 1.0), scale)


class NumpyResidualActor:
    """``ResidualActor``'s forward pass in numpy, for the robot's control loop: one state
    (D,) -> r (m,) in a few microseconds, no torch dispatch, same numbers (tested).

    ``arrays``: the torch actor's state dict as numpy (keys ``net.{0,1,3,5}.*``).
    """

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.load(arrays)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        def get(key: str, transpose: bool = False) -> np.ndarray:
            a = np.asarray(arrays[key], np.float32)
            return np.ascontiguousarray(a.T if transpose else a)

        self.w1, self.b1 = get("net.0.weight", True), get("net.0.bias")
        self.g, self.beta = get("net.1.weight"), get("net.1.bias")
        self.w2, self.b2 = get("net.3.weight", True), get("net.3.bias")
        self.w3, self.b3 = get("net.5.weight", True), get("net.5.bias")
        self.hidden = self.b1.shape[0]

    def __call__(self, state: np.ndarray) -> np.ndarray:
        """state (D,) -> r (m,); float32, in-place where it saves allocations."""
        h = np.dot(np.asarray(state, np.float32), self.w1)
        h += self.b1
        h -= h.mean()
        h *= self.g * np.float32(1.0 / math.sqrt(float(np.dot(h, h)) / self.hidden + 1e-5))  # LayerNorm
        h += self.beta
        np.maximum(h, 0.0, out=h)
        h = np.dot(h, self.w2)
        h += self.b2
        np.maximum(h, 0.0, out=h)
        out = np.dot(h, self.w3)
        out += self.b3
        return np.tanh(out, out=out)


class NumpyEnsembleCritic:
    """``EnsembleCritic``'s Q of K candidate actions for one state, in numpy, for value gating on
    the robot: state (D,), actions (K, m) -> (E, K), same numbers (tested).

    ``arrays``: the torch critic's state dict as numpy (keys ``w1`` (D + m, E, h), ``b1`` (E, h),
    ``l2.weight`` (E, h, h), ``l2.bias`` (E, 1, h), ``w3`` (E, 1, h), ``b3`` (E, 1))."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.load(arrays)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        def get(key: str) -> np.ndarray:
            return np.ascontiguousarray(np.asarray(arrays[key], np.float32))

        w1 = get("w1")
        self.fan_in, self.heads, self.hidden = w1.shape
        self.w1 = w1.reshape(self.fan_in, -1)  # (D + m, E * h)
        self.b1 = get("b1").reshape(-1)
        self.w2, self.b2 = get("l2.weight"), get("l2.bias")  # (E, h, h), (E, 1, h)
        self.w3, self.b3 = np.ascontiguousarray(get("w3")[:, 0]), get("b3")[:, 0, None]  # (E, h), (E, 1)
        self._inv_h, self._eps = np.float32(1.0 / self.hidden), np.float32(1e-5)

    def _norm_relu(self, h: np.ndarray) -> np.ndarray:
        """In place: LayerNorm over the last axis without affine parameters (the critic's), ReLU."""
        mean = h.sum(-1, keepdims=True)
        mean *= self._inv_h
        h -= mean
        var = np.einsum("...i,...i->...", h, h)[..., None]
        var *= self._inv_h
        var += self._eps
        h /= np.sqrt(var, out=var)
        return np.maximum(h, 0.0, out=h)

    def candidates(self, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """state (D,), actions (K, m) -> Q (E, K); the state's part of the first layer once.
        Most of its ~0.1 ms on one CPU core is the second layer's (E, K, h) @ (E, h, h)."""
        K, m = actions.shape
        d = self.fan_in - m
        h = np.dot(np.asarray(state, np.float32), self.w1[:d])
        h += self.b1  # (E * h,)
        x = np.dot(np.asarray(actions, np.float32), self.w1[d:])
        x += h  # (K, E * h)
        x = self._norm_relu(x.reshape(K, self.heads, self.hidden)).transpose(1, 0, 2)  # (E, K, h)
        y = np.matmul(x, self.w2)
        y += self.b2
        q = np.einsum("ekh,eh->ek", self._norm_relu(y), self.w3)
        q += self.b3
        return q  # (E, K)


class NoiseProcess:
    """The exploration process on r within an episode, from white draws xi_t (m,) already
    scaled by the std: independent (``corr`` 0), AR(1) with correlation ``corr`` (stationary:
    marginal std unchanged), or ``differenced`` (xi_t - xi_{t-1}) / sqrt(2), xi_{-1} = 0, whose
    running sum stays bounded. ``begin_episode`` restarts it."""

    def __init__(self, corr: float = 0.0, differenced: bool = False):
        self.corr, self.differenced = np.float32(corr), differenced
        self._innovation = np.float32(math.sqrt(1 - corr * corr))
        self._last: np.ndarray | None = None  # the process's memory (m,): xi_{t-1}, or e_{t-1} for AR(1)

    def begin_episode(self) -> None:
        self._last = None

    def __call__(self, xi: np.ndarray) -> np.ndarray:
        """e_t (m,) for this step's draw xi (m,)."""
        if self.differenced:
            prev, self._last = self._last, xi
            return (xi if prev is None else xi - prev) * np.float32(math.sqrt(0.5))
        if self.corr > 0:
            if self._last is not None:
                xi = self.corr * self._last + self._innovation * xi
            self._last = xi
        return xi


class ResidualActing:
    """What the robot needs of the learner to act: ``act(state, base, explore)`` with the
    numpy actor, value gating where the learner gates (``cfg.gate_candidates`` > 1: the
    highest mean-head Q of {r, 0 (the base), gate_candidates - 2 perturbations of r (std
    ``cfg.gate_std``)}, as ``ResidualLearner.act``, once the critic is past its warm-up),
    Gaussian exploration on r (``NoiseProcess``: the learner's, from ``cfg.exploration_corr``
    and ``cfg.exploration_differenced``), a = clip(b + scale * r). ``cfg``: LearnerConfig;
    ``critic``: the critic's arrays (``NumpyEnsembleCritic``), needed where the learner gates.

    Exploration and candidate noise are drawn in blocks by ``prepare()``, which the runtime calls
    before the tick (``warm``), so a step's critical path holds no random-number generation;
    clipping uses ufuncs with ``out=`` (``np.clip``'s Python wrapper costs more than the clip)."""

    NOISE_BLOCK = 256  # steps of exploration noise drawn at once

    def __init__(self, cfg, arrays: dict[str, np.ndarray], action_dim: int, seed: int = 0,
                 critic: dict[str, np.ndarray] | None = None):
        self.cfg, self.action_dim = cfg, action_dim
        self.actor = NumpyResidualActor(arrays)
        self.gates = cfg.gate_candidates > 1
        if self.gates and critic is None:
            raise ValueError("value gating (learner.gate_candidates > 1) acts through the critic: pass its arrays "
                             "(the learner publishes them with the actor's where it gates)")
        self.critic = NumpyEnsembleCritic(critic) if self.gates else None
        self.rng = np.random.default_rng(seed)
        self.updates = 0  # the learner's, with the weights: gating starts after the critic's warm-up
        # the gate's choices (the learner's order, GATE_PICKS): r itself, the base, a perturbation of r
        self.gate_picks = np.zeros(len(GATE_PICKS), np.int64)
        self.scale = np.float32(cfg.residual_scale)
        self._noise = np.empty((0, action_dim), np.float32)
        self._gate_noise = np.empty((0, max(cfg.gate_candidates - 2, 0), action_dim), np.float32)
        self._next = 0
        self.process = NoiseProcess(cfg.exploration_corr, cfg.exploration_differenced)

    def load(self, arrays: dict[str, np.ndarray], critic: dict[str, np.ndarray] | None = None,
             updates: int | None = None) -> None:
        """New weights from the learner (between steps): the actor's, the critic's where it gates."""
        self.actor.load(arrays)
        if self.gates:
            if critic is None:
                raise ValueError("value gating: the learner's weights came without the critic's")
            self.critic.load(critic)
        if updates is not None:
            self.updates = int(updates)

    def begin_episode(self) -> None:
        """Restarts the exploration process (its correlation never spans two episodes)."""
        self.process.begin_episode()

    def prepare(self) -> None:
        """Draw the next block of exploration noise (NOISE_BLOCK, m) if this one is spent."""
        if self._next >= len(self._noise):
            self._noise = np.float32(self.cfg.exploration_std) * self.rng.standard_normal(
                (self.NOISE_BLOCK, self.action_dim), np.float32)
            if self.gates:
                self._gate_noise = np.float32(self.cfg.gate_std) * self.rng.standard_normal(
                    (self.NOISE_BLOCK, *self._gate_noise.shape[1:]), np.float32)
            self._next = 0

    def warm(self, state: np.ndarray) -> None:
        """A step's forward passes on ``state`` (D,) with nothing acted: the actor's and, where it
        gates, the critic's over K candidates, so code and weights are in the caches."""
        r = self.actor(state)
        if self.gates:
            self.critic.candidates(state, np.repeat(r[None], self.cfg.gate_candidates, 0))

    @property
    def gated_steps(self) -> int:
        """Steps the critic chose the residual on."""
        return int(self.gate_picks.sum())

    @property
    def overruled_steps(self) -> int:
        """Gated steps on which the critic chose other than r (the base or a perturbation)."""
        return int(self.gate_picks[1:].sum())

    def gate(self, state: np.ndarray, base: np.ndarray, r: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, int]:
        """The candidate residual (m,) of {r, 0, clip(r + noise_k)} (noise (K - 2, m)) whose
        action clip(b + scale * c) has the highest mean-head Q (with ``gate_confidence`` k > 0:
        the highest mean - k std over heads of its advantage over r, ``ResidualLearner.choose``),
        and its index among them."""
        cands = np.concatenate([r[None], np.zeros_like(r)[None], np.clip(r[None] + noise, -1.0, 1.0)])
        q = self.critic.candidates(state, compose_numpy(base, cands, float(self.scale)))  # (E, K)
        k = self.cfg.gate_confidence
        if k:
            advantage = q - q[:, :1]
            best = int(np.argmax(advantage.mean(0) - k * advantage.std(0, ddof=1)))
        else:
            best = int(np.argmax(q.mean(0)))
        return cands[best].copy(), best

    def act(self, state: np.ndarray, base: np.ndarray, explore: bool) -> np.ndarray:
        """state (D,), base (m,) -> executed action (m,) in [-1, 1]."""
        r = self.actor(state)
        # an untrained critic does not choose (the learner's rule): r acts until its warm-up is over
        if self.gates and self.updates >= max(1, self.cfg.critic_warmup_updates):
            self.prepare()
            r, best = self.gate(state, np.asarray(base, np.float32), r, self._gate_noise[self._next])
            self.gate_picks[gate_pick(best)] += 1
            if not explore:
                self._next += 1
        if explore:
            self.prepare()  # a no-op unless the runtime did not call it before the tick
            r += self.process(self._noise[self._next])
            self._next += 1
            _clip_unit(r)
        r *= self.scale
        r += base
        return _clip_unit(r)


def _clip_unit(x: np.ndarray) -> np.ndarray:
    """In-place clip of x to [-1, 1]."""
    np.minimum(x, 1.0, out=x)
    return np.maximum(x, -1.0, out=x)
