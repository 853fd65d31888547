"""ARLI finetuning in one process with sim-time latency: anchor data from the intervener,
residual RL on ARLI states, periodic evaluation, checkpoints that resume exactly."""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from tqdm import tqdm

from arli.augment import StateBuilder
from arli.chunking import ChunkScheduler
from arli.latency import LatencyModel, to_delay_steps
from arli.rl.collect import Intervention, ResidualController
from arli.rl.config import InterventionSpec, RunSpec
from arli.rl.learner import ResidualLearner
from arli.rl.replay import ReplayBuffer
from arli.rollout import async_horizon, evaluate_policy, gripper_hold, run_episode

TRAIN_SEED_BASE = 100_000  # training episodes never reuse demo (0..) or evaluation (10_000..) seeds


class Finetuner:
    """Owns the learner, replay, scheduler and RNG state of one run."""

    def __init__(self, spec: RunSpec, env, base_policy, expert, latency: LatencyModel,
                 obs_mean: np.ndarray | None = None, obs_std: np.ndarray | None = None):
        self.spec, self.env, self.base, self.expert, self.latency = spec, env, base_policy, expert, latency
        dt = float(env.unwrapped.dt)
        self.max_delay = to_delay_steps(latency.max_latency(), dt)
        H, m = base_policy.chunk_size, env.action_space.shape[0]
        self.horizon = async_horizon(spec.execute_horizon, H, self.max_delay)
        self.scheduler = ChunkScheduler(H, self.horizon, m, "async", spec.strategy, self.max_delay,
                                        hold=gripper_hold(m))
        n = env.observation_space["state"].shape[0]
        self.builder = StateBuilder(spec.variant, n, m, H, obs_mean=obs_mean, obs_std=obs_std)
        self.learner = ResidualLearner(spec.learner, self.builder.dim, m, seed=spec.seed)
        cap = spec.learner.buffer_size
        self.online = ReplayBuffer(cap, self.builder.dim, m)
        self.anchor = ReplayBuffer(cap, self.builder.dim, m)
        self.rng = np.random.default_rng(spec.seed)  # latency draws
        self.controller = ResidualController(
            self.learner, self.builder, self.online, self.anchor, train=True,
            intervention=Intervention(expert, spec.intervention),
            rng=np.random.default_rng(spec.seed + 1), learn_after=spec.learn_after)
        self.episode = 0
        self.history: list[dict] = []
        self.successes: list[bool] = []  # every training episode (assisted or not)
        self.assisted: list[bool] = []  # whether the intervener acted in it

    # -- data ----------------------------------------------------------------------------
    def _run(self, controller: ResidualController) -> bool:
        controller.begin_episode()
        result = run_episode(self.env, self.base, self.scheduler, self.latency, self.rng,
                             TRAIN_SEED_BASE + 1000 * self.spec.seed + self.episode, controller)
        self.episode += 1
        return result.success

    def collect_anchor(self) -> int:
        """Intervener-only episodes into anchor replay (base actions relabelled by the
        scheduler at every step). Returns the anchor transitions collected."""
        ctl = self.controller
        saved = ctl.intervention
        ctl.intervention = Intervention(self.expert, InterventionSpec(prob=1.0, after=0, mode="takeover"))
        learn_after, ctl.learn_after = ctl.learn_after, 10**12  # no updates while collecting
        # demonstrations are neither part of the online budget nor online interventions
        steps, intervened = ctl.env_steps, ctl.intervened_steps
        for _ in range(self.spec.anchor_episodes):
            self._run(ctl)
        ctl.intervention, ctl.learn_after = saved, learn_after
        ctl.env_steps, ctl.intervened_steps = steps, intervened
        return len(self.anchor)

    def prepare(self, progress: bool = False) -> dict[str, float]:
        """Before online learning: anchor episodes by the intervener, then anchor pretraining
        of the residual actor (``learner.pretrain_updates`` BC steps on anchor replay)."""
        transitions = self.collect_anchor()
        loss = self.learner.pretrain_actor(self.anchor, self.spec.learner.pretrain_updates, progress)
        return {"anchor_transitions": transitions, "pretrain_loss": loss}

    # -- training ------------------------------------------------------------------------
    def train(self, env_steps: int | None = None, writer=None, progress: bool = True) -> list[dict]:
        """Train until ``env_steps`` online steps in total; evaluates every ``eval_every``."""
        target = env_steps if env_steps is not None else self.spec.env_steps
        ctl = self.controller
        next_eval = (ctl.env_steps // self.spec.eval_every + 1) * self.spec.eval_every
        bar = tqdm(total=target, initial=ctl.env_steps, desc=f"finetune {self.spec.variant}",
                   unit="step", disable=not progress, mininterval=1.0)
        start = time.time()
        while ctl.env_steps < target:
            before = ctl.env_steps
            success = self._run(ctl)
            self.successes.append(success)
            self.assisted.append(ctl.intervened_episode)
            bar.update(ctl.env_steps - before)
            recent = float(np.mean(self.successes[-20:]))
            assisted = float(np.mean(self.assisted[-20:]))
            bar.set_postfix(success=f"{recent:.2f}", assisted=f"{assisted:.2f}", anchor=len(self.anchor),
                            q=f"{ctl.last_stats.get('q_mean', 0):.2f}", refresh=False)
            if writer is not None:
                writer.add_scalar("train/success_20ep", recent, ctl.env_steps)
                writer.add_scalar("train/assisted_20ep", assisted, ctl.env_steps)
                writer.add_scalar("train/intervened_steps", ctl.intervened_steps, ctl.env_steps)
                for key, value in ctl.last_stats.items():
                    writer.add_scalar(f"learner/{key}", value, ctl.env_steps)
            if ctl.env_steps >= next_eval or ctl.env_steps >= target:
                success = self.evaluate(self.spec.eval_episodes)["success"]
                entry = {"env_steps": ctl.env_steps, "success": success, "episodes": self.episode,
                         "updates": self.learner.updates, "wall_s": round(time.time() - start, 1)}
                self.history.append(entry)
                if writer is not None:
                    writer.add_scalar("eval/success", success, ctl.env_steps)
                tqdm.write(f"  env step {ctl.env_steps}: eval success {success:.2f}")
                next_eval += self.spec.eval_every
        bar.close()
        return self.history

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, episodes: int, seed: int = 10_000, residual: bool = True) -> dict:
        """Deterministic residual (or the base alone) on fixed seeds, same latency."""
        controller = ResidualController(self.learner, self.builder) if residual else None
        return evaluate_policy(self.env, self.base, self.spec.strategy, self.latency, episodes, seed,
                               self.spec.execute_horizon, controller=controller)

    # -- checkpoints ---------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Everything needed to resume identically (+ the actor alone as safetensors)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        os.makedirs(path, exist_ok=True)
        ctl = self.controller
        torch.save({
            "learner": self.learner.state_dict(),
            "online": self.online.state_dict(), "anchor": self.anchor.state_dict(),
            "rng": self.rng.bit_generator.state, "ctl_rng": ctl.rng.bit_generator.state,
            "env_steps": ctl.env_steps, "episode": self.episode, "history": self.history,
            "successes": self.successes, "assisted": self.assisted, "intervened_steps": ctl.intervened_steps,
        }, os.path.join(path, "trainer_state.pt"))
        save_file({k: v.contiguous() for k, v in self.learner.actor.state_dict().items()},
                  os.path.join(path, "residual_actor.safetensors"))

    def load(self, path: str) -> None:
        state_path = os.path.join(path, "trainer_state.pt")
        if not os.path.exists(state_path):
            raise FileNotFoundError(f"no finetuning checkpoint at {path} (missing trainer_state.pt)")
        state = torch.load(state_path, weights_only=False)
        if "assisted" not in state:
            raise ValueError(f"{state_path} was written by an older ARLI (no per-episode 'assisted' record, "
                             "different learner defaults); start a new run instead of resuming it")
        self.learner.load_state_dict(state["learner"])
        self.online.load_state_dict(state["online"])
        self.anchor.load_state_dict(state["anchor"])
        self.rng.bit_generator.state = state["rng"]
        ctl = self.controller
        ctl.rng.bit_generator.state = state["ctl_rng"]
        ctl.env_steps, ctl.intervened_steps = state["env_steps"], state["intervened_steps"]
        self.episode, self.history = state["episode"], state["history"]
        self.successes, self.assisted = state["successes"], state["assisted"]
        ctl.acc.reset()  # saved at an episode boundary: nothing pending
        ctl._pending = None
