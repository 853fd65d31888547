"""ARLI finetuning in one process with sim-time latency: demonstrations as anchor data,
residual RL from reward (``rl``) or with an online intervener (``hil``), periodic evaluation
with Q-vs-return diagnostics, checkpoints that resume exactly."""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from tqdm import tqdm

from arli.augment import StateBuilder
from arli.chunking import ChunkScheduler
from arli.errors import InputError
from arli.latency import LatencyModel, to_delay_steps
from arli.rl.collect import Intervention, ResidualController
from arli.rl.config import InterventionSpec, RunSpec
from arli.rl.learner import LearnerDiverged, ResidualLearner
from arli.rl.replay import DEMO, ReplayBuffer
from arli.rollout import async_horizon, evaluate_policy, gripper_hold, planning_delay, run_episode

def q_vs_return(learner: ResidualLearner, trace: list[list[tuple]], gamma: float) -> dict[str, float]:
    """Mean critic value Q(s_t, a_t) and mean discounted Monte-Carlo return G_t over every
    step of the traced episodes (lists of (state (D,), action (m,), reward))."""
    states, actions, returns = [], [], []
    for episode in trace:
        g = 0.0
        for state, action, reward in reversed(episode):
            g = reward + gamma * g
            states.append(state)
            actions.append(action)
            returns.append(g)
    if not states:
        return {"q_mean": float("nan"), "return_mean": float("nan")}
    q = learner.q_value(np.stack(states), np.stack(actions))
    return {"q_mean": float(q.mean()), "return_mean": float(np.mean(returns))}


CHECKPOINT_FORMAT = 3  # 2: states with episode progress, replay rows with a source; 3: the learner's start actor
TRAIN_SEED_BASE = 100_000  # training episodes never reuse demo (0..) or evaluation (10_000..) seeds


class Finetuner:
    """Owns the learner, replay, scheduler and RNG state of one run."""

    def __init__(self, spec: RunSpec, env, base_policy, expert, latency: LatencyModel,
                 obs_mean: np.ndarray | None = None, obs_std: np.ndarray | None = None):
        self.spec, self.env, self.base, self.expert, self.latency = spec, env, base_policy, expert, latency
        dt = float(env.unwrapped.dt)
        H, m = base_policy.chunk_size, env.action_space.shape[0]
        self.max_delay = planning_delay(latency, dt, H)
        self.horizon = async_horizon(spec.execute_horizon, H, self.max_delay)
        self.scheduler = ChunkScheduler(H, self.horizon, m, "async", spec.strategy, self.max_delay,
                                        hold=gripper_hold(m),
                                        min_delay_steps=min(to_delay_steps(latency.min_latency(), dt),
                                                            self.max_delay))
        n = env.observation_space["state"].shape[0]
        episode_steps = int(getattr(env.unwrapped, "max_episode_steps", 1000))
        self.builder = StateBuilder(spec.variant, n, m, H, episode_steps, obs_mean=obs_mean, obs_std=obs_std)
        self.learner = ResidualLearner(spec.learner, self.builder.dim, m, seed=spec.seed)
        cap = spec.learner.buffer_size
        self.online = ReplayBuffer(cap, self.builder.dim, m)
        self.anchor = ReplayBuffer(cap, self.builder.dim, m)
        self.rng = np.random.default_rng(spec.seed)  # latency draws
        online_intervener = Intervention(expert, spec.intervention) if spec.regime == "hil" else None
        self.controller = ResidualController(
            self.learner, self.builder, self.online, self.anchor, train=True,
            intervention=online_intervener, rng=np.random.default_rng(spec.seed + 1),
            learn_after=spec.learn_after)
        self.episode = 0
        self.history: list[dict] = []
        self.successes: list[bool] = []  # every training episode (assisted or not)
        self.assisted: list[bool] = []  # whether the intervener acted in it
        self.episode_log: list[dict] = []  # per training episode: steps, intervened steps, success

    # -- data ----------------------------------------------------------------------------
    def _run(self, controller: ResidualController) -> bool:
        result = run_episode(self.env, self.base, self.scheduler, self.latency, self.rng,
                             TRAIN_SEED_BASE + 1000 * self.spec.seed + self.episode, controller)
        self.episode += 1
        return result.success

    def collect_anchor(self) -> int:
        """Demonstrations into anchor replay: the expert acts for whole episodes inside the
        asynchronous loop, so every row's base action, committed block and timing are the
        scheduler's own (base actions relabelled). Returns the anchor transitions collected."""
        if self.spec.anchor_episodes and self.expert is None:
            raise ValueError("anchor_episodes > 0 needs a scripted expert for this task; set anchor_episodes=0")
        if not self.spec.anchor_episodes:
            return len(self.anchor)
        ctl = self.controller
        saved = ctl.intervention, ctl.source, ctl.learn_after
        ctl.intervention = Intervention(self.expert, InterventionSpec(prob=1.0, after=0, mode="takeover"))
        ctl.source, ctl.learn_after = DEMO, 10**12  # no updates while collecting
        # demonstrations are neither part of the online budget nor online interventions
        steps, intervened, takeovers = ctl.env_steps, ctl.intervened_steps, ctl.takeovers
        for _ in range(self.spec.anchor_episodes):
            self._run(ctl)
        ctl.intervention, ctl.source, ctl.learn_after = saved
        ctl.env_steps, ctl.intervened_steps, ctl.takeovers = steps, intervened, takeovers
        return len(self.anchor)

    def load_datasets(self) -> dict[str, int]:
        """The recorded intervention datasets of ``spec.datasets`` into replay."""
        from arli.rl.recorded import load_recorded  # noqa: PLC0415

        total = {"online": 0, "anchor": 0, "episodes": 0}
        for root in self.spec.datasets:
            got = load_recorded(root, self.builder.dim, self.learner.action_dim, self.spec.learner.n_step,
                                self.spec.learner.gamma, self.online, self.anchor)
            total = {k: total[k] + got[k] for k in total}
        return total

    def prepare(self, progress: bool = False) -> dict[str, float]:
        """Before online learning: demonstration episodes and recorded datasets into replay,
        then anchor pretraining of the residual actor (``learner.pretrain_updates`` BC steps)."""
        recorded = self.load_datasets() if self.spec.datasets else {}
        transitions = self.collect_anchor()
        if recorded:
            print(f"recorded datasets: {recorded['episodes']} episodes, {recorded['anchor']} intervention "
                  f"transitions -> anchor, {recorded['online']} robot transitions -> online replay", flush=True)
        loss = self.learner.pretrain_actor(self.anchor, self.spec.learner.pretrain_updates, progress)
        return {"anchor_transitions": transitions, "pretrain_loss": loss}

    # -- training ------------------------------------------------------------------------
    def train(self, env_steps: int | None = None, writer=None, progress: bool = True,
              checkpoint_dir: str | None = None) -> list[dict]:
        """Train until ``env_steps`` online steps in total; evaluates every ``eval_every``
        (and saves ``checkpoint_dir`` then: the last good checkpoint). A diverging learner
        stops the run with ``LearnerDiverged`` and leaves that checkpoint untouched."""
        target = env_steps if env_steps is not None else self.spec.env_steps
        ctl = self.controller
        next_eval = (ctl.env_steps // self.spec.eval_every + 1) * self.spec.eval_every
        bar = tqdm(total=target, initial=ctl.env_steps, desc=f"finetune {self.spec.variant}",
                   unit="step", disable=not progress, mininterval=1.0)
        start = time.time()
        while ctl.env_steps < target:
            before, intervened_before = ctl.env_steps, ctl.intervened_steps
            try:
                success = self._run(ctl)
            except LearnerDiverged as exc:
                bar.close()
                kept = f"; the last good checkpoint is {checkpoint_dir}" if checkpoint_dir else ""
                raise LearnerDiverged(f"{exc}{kept}") from None
            self.successes.append(success)
            self.assisted.append(ctl.intervened_episode)
            self.episode_log.append({"env_steps": ctl.env_steps, "steps": ctl.env_steps - before,
                                     "intervened": ctl.intervened_steps - intervened_before,
                                     "success": bool(success)})
            bar.update(ctl.env_steps - before)
            recent = float(np.mean(self.successes[-20:]))
            postfix = {"success": f"{recent:.2f}", "q": f"{ctl.last_stats.get('q_mean', 0):.2f}"}
            if self.spec.regime == "hil":
                postfix["assisted"] = f"{np.mean(self.assisted[-20:]):.2f}"
            bar.set_postfix(postfix, refresh=False)
            if writer is not None:
                writer.add_scalar("train/success_20ep", recent, ctl.env_steps)
                writer.add_scalar("train/intervened_steps", ctl.intervened_steps, ctl.env_steps)
                for key, value in ctl.last_stats.items():
                    writer.add_scalar(f"learner/{key}", value, ctl.env_steps)
            if ctl.env_steps >= next_eval or ctl.env_steps >= target:
                self._evaluate_and_log(writer, start)
                if checkpoint_dir:
                    self.save(checkpoint_dir)
                next_eval += self.spec.eval_every
        bar.close()
        return self.history

    def _evaluate_and_log(self, writer, start: float) -> None:
        ctl = self.controller
        result = self.evaluate(self.spec.eval_episodes, diagnostics=True)
        entry = {"env_steps": ctl.env_steps, "success": result["success"], "episodes": self.episode,
                 "updates": self.learner.updates, "wall_s": round(time.time() - start, 1),
                 "q_eval": result["q_mean"], "return_eval": result["return_mean"],
                 "intervened_steps": ctl.intervened_steps}
        self.history.append(entry)
        if writer is not None:
            writer.add_scalar("eval/success", result["success"], ctl.env_steps)
            writer.add_scalar("eval/q_vs_return/q", result["q_mean"], ctl.env_steps)
            writer.add_scalar("eval/q_vs_return/mc_return", result["return_mean"], ctl.env_steps)
            writer.add_scalar("eval/q_vs_return/bias", result["q_mean"] - result["return_mean"], ctl.env_steps)
        tqdm.write(f"  env step {ctl.env_steps}: eval success {result['success']:.2f}  "
                   f"Q {result['q_mean']:.3f} vs return {result['return_mean']:.3f}")

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, episodes: int, seed: int = 10_000, residual: bool = True,
                 diagnostics: bool = False) -> dict:
        """Deterministic residual (or the base alone) on fixed seeds, same latency.
        ``diagnostics``: also the critic's mean Q(s_t, a_t) over the evaluated steps against
        the discounted Monte-Carlo return from each step (``q_mean``, ``return_mean``)."""
        controller = ResidualController(self.learner, self.builder, trace=diagnostics) if residual else None
        out = evaluate_policy(self.env, self.base, self.spec.strategy, self.latency, episodes, seed,
                              self.spec.execute_horizon, controller=controller,
                              min_delay_steps=self.scheduler.min_delay_steps)
        if diagnostics and controller is not None:
            out.update(q_vs_return(self.learner, controller.trace, self.spec.learner.gamma))
        return out

    # -- checkpoints ---------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Everything needed to resume identically (+ the actor alone as safetensors)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        os.makedirs(path, exist_ok=True)
        ctl = self.controller
        state_path = os.path.join(path, "trainer_state.pt")
        torch.save({
            "learner": self.learner.state_dict(),
            "online": self.online.state_dict(), "anchor": self.anchor.state_dict(),
            "rng": self.rng.bit_generator.state, "ctl_rng": ctl.rng.bit_generator.state,
            "env_steps": ctl.env_steps, "episode": self.episode, "history": self.history,
            "successes": self.successes, "assisted": self.assisted, "intervened_steps": ctl.intervened_steps,
            "episode_log": self.episode_log,
            "takeovers": ctl.takeovers, "format": CHECKPOINT_FORMAT,
            "max_delay": self.max_delay,  # the residual's state and chunks are those of this delay
        }, state_path + ".tmp")
        save_file({k: v.contiguous() for k, v in self.learner.actor.state_dict().items()},
                  os.path.join(path, "residual_actor.safetensors.tmp"))
        # atomic: a crash mid-save leaves the previous checkpoint whole
        os.replace(state_path + ".tmp", state_path)
        os.replace(os.path.join(path, "residual_actor.safetensors.tmp"),
                   os.path.join(path, "residual_actor.safetensors"))

    def load(self, path: str) -> None:
        state_path = os.path.join(path, "trainer_state.pt")
        if not os.path.exists(state_path):
            raise FileNotFoundError(f"no finetuning checkpoint at {path} (missing trainer_state.pt)")
        state = torch.load(state_path, weights_only=False)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{state_path} was written by an older ARLI (checkpoint format "
                             f"{state.get('format', 1)}, this one reads {CHECKPOINT_FORMAT}: different state "
                             "layout and replay fields); start a new run instead of resuming it")
        trained = state.get("max_delay", self.max_delay)  # checkpoints before 2026-12-01 did not say
        if trained != self.max_delay:
            # checked before anything is loaded: a refused checkpoint leaves this run untouched
            raise InputError(f"{path} was trained with the scheduler planning d = {trained} control steps; "
                             f"this run plans d = {self.max_delay}: pass delay_steps={trained} (arli finetune's "
                             "default is 8 since 2026-12-01, 4 before)")
        self.learner.load_state_dict(state["learner"])
        self.online.load_state_dict(state["online"])
        self.anchor.load_state_dict(state["anchor"])
        self.rng.bit_generator.state = state["rng"]
        ctl = self.controller
        ctl.rng.bit_generator.state = state["ctl_rng"]
        ctl.env_steps, ctl.intervened_steps = state["env_steps"], state["intervened_steps"]
        ctl.takeovers = state["takeovers"]
        self.episode, self.history = state["episode"], state["history"]
        self.successes, self.assisted = state["successes"], state["assisted"]
        self.episode_log = state.get("episode_log", [])
        ctl.acc.reset()  # saved at an episode boundary: nothing pending
        ctl._pending = None
