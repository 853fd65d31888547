"""ARLI finetuning in one process with sim-time latency: demonstrations as anchor data,
residual RL from reward (``rl``) or with an online intervener (``hil``), periodic evaluation
with Q-vs-return diagnostics, checkpoints that resume exactly."""

from __future__ import annotations

import copy

import os
import time
from dataclasses import replace

import numpy as np
import torch
from tqdm import tqdm

from arli.augment import StateBuilder
from arli.chunking import ChunkingConfig, delay_bounds, make_scheduler
from arli.errors import InputError
from arli.latency import LatencyModel
from arli.rl.config import InterventionSpec, RunSpec, q_floor, train_episode_seed, train_seed_ranges
from arli.policies.residual_np import GATE_PICKS
from arli.rl.learner import LearnerDiverged, ResidualLearner, gate_shares
from arli.rl.replay import ReplayBuffer
from arli.rl.trainer import Trainer
from arli.timing import TimeBudget
from arli.rl.transitions import TransitionBuilder
from arli.rollout import evaluate_policy, sim_episode
from arli.runtime.acting import ResidualController
from arli.runtime.intervention import Intervention
from arli.runtime.loop import Episode
from arli.types import DEMO

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


CHECKPOINT_FORMAT = 4  # 4: the trainer's state (learner, replays, step and update counts) in one entry


class Finetuner:
    """One run: the scheduler, the residual's state builder, the trainer (learner + replays),
    the acting controller and the RNG state; ``train`` is the per-step loop."""

    def __init__(self, spec: RunSpec, env, base_policy, expert, latency: LatencyModel,
                 obs_mean: np.ndarray | None = None, obs_std: np.ndarray | None = None,
                 chunking: ChunkingConfig | None = None):
        self.spec, self.env, self.base, self.expert, self.latency = spec, env, base_policy, expert, latency
        self.chunking = chunking or ChunkingConfig()
        if self.chunking.strategy == "sync":
            raise InputError("chunking.strategy: expected naive, blend or rtc for finetuning (the residual acts "
                             "inside asynchronous execution), got 'sync'")
        dt = float(env.unwrapped.dt)
        H, m = base_policy.chunk_size, env.action_space.shape[0]
        self.scheduler = make_scheduler(self.chunking, H, m,
                                        *delay_bounds(self.chunking, latency.max_latency(), latency.min_latency(), dt))
        self.max_delay = self.scheduler.max_delay_steps
        n = env.observation_space["state"].shape[0]
        episode_steps = int(getattr(env.unwrapped, "max_episode_steps", 1000))
        self.builder = StateBuilder(spec.variant, n, m, H, episode_steps, obs_mean=obs_mean, obs_std=obs_std)
        # the takeover penalty makes negative returns reachable: the TD targets' floor follows it
        learner_cfg = replace(spec.learner, q_min=q_floor(spec.learner, spec.intervention, spec.regime == "hil"))
        from arli.compute import resolve_device  # noqa: PLC0415

        self.learner = ResidualLearner(learner_cfg, self.builder.dim, m, seed=spec.seed,
                                       device=resolve_device(spec.device, "run.device"))
        cap = spec.learner.buffer_size
        self.online = ReplayBuffer(cap, self.builder.dim, m)
        self.anchor = ReplayBuffer(cap, self.builder.dim, m)
        self.trainer = Trainer(self.learner, self.online, self.anchor, spec.learn_after)
        self.rng = np.random.default_rng(spec.seed)  # latency draws
        online_intervener = Intervention(expert, spec.intervention) if spec.regime == "hil" else None
        penalty = spec.intervention.takeover_penalty if online_intervener is not None else 0.0
        self.controller = ResidualController(
            self.learner, self.builder, train=True, transitions=self._nstep(penalty),
            intervention=online_intervener, rng=np.random.default_rng(spec.seed + 1))
        # where the training time goes (counted only inside the training episodes' steps)
        self.time_budget = TimeBudget()
        self.time_budget.wrap(base_policy, "infer", "base_inference")
        self.time_budget.wrap(self.learner, "act", "residual_acting")
        self.episode = 0
        self.history: list[dict] = []
        self.successes: list[bool] = []  # every training episode (assisted or not)
        self.assisted: list[bool] = []  # whether the intervener acted in it
        self.episode_log: list[dict] = []  # per training episode: steps, intervened steps, success
        # what happened before the first online step (prepare's record: the start guard's decision;
        # the start's test outcomes when the command evaluates them), kept in every checkpoint
        # so that a resumed run still reports its start
        self.start_record: dict = {}

    @property
    def unstable_episodes(self) -> int | None:
        """Episodes of this run (resumes included: the count is checkpointed) that the
        simulator's reset of an unstable state ended early; None for an env that does not say."""
        return getattr(self.env.unwrapped, "unstable_episodes", None)

    @property
    def env_steps(self) -> int:
        """Online environment steps so far (demonstrations are not counted)."""
        return self.trainer.env_steps

    def _nstep(self, takeover_penalty: float = 0.0) -> TransitionBuilder:
        return TransitionBuilder(self.spec.learner.n_step, self.spec.learner.gamma, takeover_penalty)

    def _episode(self, controller: ResidualController) -> Episode:
        """The next training episode of the runtime loop (its own seed), not yet stepped."""
        episode = sim_episode(self.env, self.base, self.scheduler, self.latency, self.rng,
                              train_episode_seed(self.spec.seed, self.episode), controller)
        self.episode += 1
        return episode

    # -- data ----------------------------------------------------------------------------
    def collect_anchor(self) -> int:
        """Demonstrations into anchor replay: the expert acts for whole episodes inside the
        asynchronous loop (``run.demonstrations=bounded``: within the residual's reach of the
        running base), so every row's base action, committed block and timing are the
        scheduler's own (base actions relabelled). They are not online steps: no updates, no
        budget. Returns the anchor transitions collected."""
        if self.spec.anchor_episodes and self.expert is None:
            raise ValueError("anchor_episodes > 0 needs a scripted expert for this task; set run.anchor_episodes=0")
        # the demonstrator acts through the same acting path; the residual still proposes
        # (with exploration), so the run's random streams are those of acting
        demo = ResidualController(self.learner, self.builder, train=True, transitions=self._nstep(),
                                  intervention=Intervention(self.expert, InterventionSpec(prob=1.0, after=0,
                                                                                          mode="takeover"))
                                  if self.expert is not None else None,
                                  rng=self.controller.rng, source=DEMO,
                                  intervention_reach=self.learner.cfg.residual_scale
                                  if self.spec.demonstrations == "bounded" else None)
        for _ in range(self.spec.anchor_episodes):
            episode = self._episode(demo)
            while not episode.done:
                episode.step()
            episode.finish()
            self.trainer.ingest(demo.take_transitions(), env_steps=0)
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
        out = {"anchor_transitions": transitions, "pretrain_loss": loss}
        if self.spec.start_guard and self.spec.learner.pretrain_updates > 0:
            out["start_guard"] = self.guard_start()
        self.start_record.update(out)
        return out

    def guard_start(self) -> dict:
        """Do no harm before RL starts: the anchored start and the base alone on the guard's
        tune episodes (paired seeds); a start below the base is dropped, so RL starts from the
        zero residual (the base) instead of from a start that is already worse."""
        n = self.spec.guard_count()
        base = self._tune_successes(residual=False)
        start = self._tune_successes()
        reverted = start < base
        if reverted:
            self.learner.reset_actor()
        return {"split": "tune", "episodes": n, "base": base / n, "start": start / n, "reverted": reverted}

    def guard_end(self) -> dict:
        """Do no harm after RL: the finetuned residual against the one RL started from (the
        anchored start, or the zero residual where the start guard dropped it) on the guard's
        tune episodes, paired seeds, compared as counts (a tie keeps what RL trained). Reused
        where measured already on the same seeds: the start guard's start, the curve's first
        and last points (the first ``eval_episodes`` seeds). A finetuned residual below its
        start is dropped and the start deployed (its weights are ``learner.actor_start``)."""
        n, history = self.spec.guard_count(), self.history
        first = history[0] if history and history[0]["env_steps"] == 0 else None
        last = history[-1] if history and history[-1]["env_steps"] == self.env_steps else None
        trained = self._tune_successes(last)
        before = self.start_record.get("start_guard")
        if before and not before["reverted"] and before["episodes"] == n:  # the start as it acts now
            start = round(before["start"] * n)
        else:
            kept, gating = copy.deepcopy(self.learner.actor.state_dict()), self.learner.gating
            self.learner.actor.load_state_dict(self.learner.actor_start.state_dict())
            self.learner.gating = False  # the start acts alone, as it did when RL began
            try:
                start = self._tune_successes(first)
            finally:
                self.learner.actor.load_state_dict(kept)
                self.learner.gating = gating
        reverted = trained < start
        if reverted:
            self.learner.revert_to_start()
        return {"split": "tune", "episodes": n, "start": start / n, "trained": trained / n, "reverted": reverted}

    def _tune_successes(self, point: dict | None = None, residual: bool = True) -> int:
        """Successes of the acting residual (or the base alone) on the guard's tune episodes,
        evaluated as the curve evaluates them: its first ``eval_episodes`` seeds as one call,
        the rest as another, so a seed meets the same latency draws in every evaluation (the
        draws run on from each call's first seed). ``point``: a curve point of these weights,
        whose success on the first seeds is reused."""
        n, k = self.spec.guard_count(), self.spec.eval_episodes
        if point is not None and point.get("eval_episodes", k) != k:
            point = None  # measured on another count of seeds (a run resumed with another eval_episodes)
        if k >= n:
            if point is not None and k == n:
                return round(point["success"] * n)
            return round(self.evaluate(n, residual=residual)["success"] * n)
        head = point["success"] if point is not None else self.evaluate(k, residual=residual)["success"]
        rest = self.evaluate(n - k, seed=self.spec.tune_seed + k, residual=residual)["success"]
        return round(head * k) + round(rest * (n - k))

    # -- training ------------------------------------------------------------------------
    def train(self, env_steps: int | None = None, writer=None, progress: bool = True,
              checkpoint_dir: str | None = None) -> list[dict]:
        """Train until ``env_steps`` online steps in total, whole episodes at a time; evaluates
        every ``eval_every`` (and saves ``checkpoint_dir`` then: the last good checkpoint). A
        diverging learner stops the run with ``LearnerDiverged`` and leaves that checkpoint
        untouched."""
        target = env_steps if env_steps is not None else self.spec.env_steps
        ctl, trainer = self.controller, self.trainer
        next_eval = (trainer.env_steps // self.spec.eval_every + 1) * self.spec.eval_every
        bar = tqdm(total=target, initial=trainer.env_steps, desc=f"finetune {self.spec.variant}",
                   unit="step", disable=not progress, mininterval=1.0)
        start = time.time()
        clock = self.time_budget
        while trainer.env_steps < target:
            before, intervened_before = trainer.env_steps, ctl.intervened_steps
            episode = self._episode(ctl)
            clock.wrap(episode.driver, "act", "physics")  # this episode's robot: the env's step
            try:
                while not episode.done:
                    with clock.part("control_steps", on=True):
                        executed = episode.step()  # observe, schedule, act (residual or intervener), execute
                    with clock.part("learner_updates"):
                        trainer.ingest(ctl.take_transitions(), env_steps=int(executed))  # n-step ones complete
                        trainer.run_owed()  # learner.utd updates per step once learn_after rows are in
                result = episode.finish()
                trainer.ingest(ctl.take_transitions(), env_steps=0)  # the episode's last transitions
            except LearnerDiverged as exc:
                bar.close()
                kept = f"; the last good checkpoint is {checkpoint_dir}" if checkpoint_dir else ""
                raise LearnerDiverged(f"{exc}{kept}") from None
            self.successes.append(result.success)
            self.assisted.append(ctl.intervened_episode)
            self.episode_log.append({"env_steps": trainer.env_steps, "steps": trainer.env_steps - before,
                                     "intervened": ctl.intervened_steps - intervened_before,
                                     "success": bool(result.success)})
            bar.update(trainer.env_steps - before)
            self._log_episode(bar, writer)
            if trainer.env_steps >= next_eval or trainer.env_steps >= target:
                with clock.part("evaluation"):
                    self._evaluate_and_log(writer, start)
                if checkpoint_dir:
                    with clock.part("checkpoints"):
                        self.save(checkpoint_dir)
                next_eval += self.spec.eval_every
        bar.close()
        return self.history

    def learner_diagnostics(self) -> dict[str, float]:
        """The learner's latest measured statistics (critic loss, TD error per source, AWR's
        advantage spread and weight ESS, ...), rounded for the run's JSON."""
        return {k: round(float(v), 6) for k, v in sorted(self.trainer.last_stats.items())}

    def time_breakdown(self) -> dict[str, float]:
        """Seconds of ``train`` so far: inside the training episodes' control steps, physics
        (the driver's act: the env's step), base inference (the policy's chunks), residual acting and the rest
        of the loop (scheduler, ARLI state, bookkeeping); then learner updates, the learning
        curve's evaluations and checkpoints."""
        return self.time_budget.report(("physics", "base_inference", "residual_acting"), "control_steps",
                                       "loop_other")

    def _log_episode(self, bar, writer) -> None:
        stats, steps = self.trainer.last_stats, self.trainer.env_steps
        recent = float(np.mean(self.successes[-20:]))
        postfix = {"success": f"{recent:.2f}", "q": f"{stats.get('q_mean', 0):.2f}"}
        if self.spec.regime == "hil":
            postfix["assisted"] = f"{np.mean(self.assisted[-20:]):.2f}"
        bar.set_postfix(postfix, refresh=False)
        if writer is not None:
            writer.add_scalar("train/success_20ep", recent, steps)
            writer.add_scalar("train/intervened_steps", self.controller.intervened_steps, steps)
            for key, value in stats.items():
                writer.add_scalar(f"learner/{key}", value, steps)

    def _evaluate_and_log(self, writer, start: float) -> None:
        ctl, steps = self.controller, self.trainer.env_steps
        result = self.evaluate(self.spec.eval_episodes, diagnostics=True)
        entry = {"env_steps": steps, "success": result["success"], "eval_episodes": self.spec.eval_episodes,
                 "episodes": self.episode,
                 "updates": self.learner.updates, "wall_s": round(time.time() - start, 1),
                 "q_eval": result["q_mean"], "return_eval": result["return_mean"],
                 "intervened_steps": ctl.intervened_steps, "learner": self.learner_diagnostics()}
        picks = result["gate_picks"]
        if sum(picks.values()):
            entry["gate_picks"] = picks
        self.history.append(entry)
        if writer is not None:
            writer.add_scalar("eval/success", result["success"], steps)
            writer.add_scalar("eval/q_vs_return/q", result["q_mean"], steps)
            writer.add_scalar("eval/q_vs_return/mc_return", result["return_mean"], steps)
            writer.add_scalar("eval/q_vs_return/bias", result["q_mean"] - result["return_mean"], steps)
        tqdm.write(f"  env step {steps}: eval success {result['success']:.2f}  "
                   f"Q {result['q_mean']:.3f} vs return {result['return_mean']:.3f}"
                   + (f"  gate {gate_shares(picks)}" if sum(picks.values()) else ""))

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, episodes: int, seed: int | None = None, residual: bool = True,
                 diagnostics: bool = False) -> dict:
        """Deterministic residual (or the base alone) on episode seeds ``seed ..`` (default: the
        tune seeds), same latency; ``outcomes``: success per episode. With the residual,
        ``gate_picks``: how often value gating chose pi(s), the base or a perturbation (all 0
        where it did not gate). ``diagnostics``: also the critic's mean Q(s_t, a_t) over the
        evaluated steps against the discounted Monte-Carlo return from each step (``q_mean``,
        ``return_mean``)."""
        seed = self.spec.tune_seed if seed is None else seed
        controller = self.evaluation_controller(trace=diagnostics) if residual else None
        picked = self.learner.gate_picks.copy()
        out = evaluate_policy(self.env, self.base, self.chunking, self.latency, episodes, seed, controller)
        if residual:
            out["gate_picks"] = dict(zip(GATE_PICKS, (self.learner.gate_picks - picked).tolist()))
        if diagnostics and controller is not None:
            out.update(q_vs_return(self.learner, controller.trace, self.spec.learner.gamma))
        return out

    def evaluation_controller(self, trace: bool = False) -> ResidualController:
        """The deterministic residual as evaluations and videos run it."""
        return ResidualController(self.learner, self.builder, trace=trace)

    def train_ranges(self) -> list[range]:
        """Episode seeds this run trained on (demonstrations and online episodes so far)."""
        return train_seed_ranges(self.spec.seed, self.episode)

    def evaluate_test(self, residual: bool = True) -> dict:
        """The final numbers: ``spec.test_episodes`` episodes on the test seeds."""
        return self.evaluate(self.spec.test_episodes, self.spec.test_seed, residual)

    def residual_definition(self) -> tuple[dict, dict[str, np.ndarray]]:
        """What an actor needs to rebuild this run's residual from its weights: (meta: variant,
        state dim, chunk size, episode steps, learner config; state normalisation arrays)."""
        meta = {"variant": self.spec.variant, "state_dim": self.builder.dim, "chunk_size": self.builder.H,
                "episode_steps": self.builder.T, "learner": dict(vars(self.learner.cfg))}
        norm = {"obs_mean": self.builder.mean.astype(np.float32), "obs_std": self.builder.std.astype(np.float32)}
        return meta, norm

    # -- checkpoints ---------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Everything needed to resume identically (+ the actor alone as safetensors)."""
        os.makedirs(path, exist_ok=True)
        ctl = self.controller
        state_path = os.path.join(path, "trainer_state.pt")
        torch.save({
            "trainer": self.trainer.state_dict(),
            "rng": self.rng.bit_generator.state, "ctl_rng": ctl.rng.bit_generator.state,
            "episode": self.episode, "history": self.history,
            "successes": self.successes, "assisted": self.assisted, "intervened_steps": ctl.intervened_steps,
            "episode_log": self.episode_log,
            "takeovers": ctl.takeovers, "format": CHECKPOINT_FORMAT,
            "max_delay": self.max_delay,  # the residual's state and chunks are those of this delay
            "demonstrations": self.spec.demonstrations,  # how its anchor data were collected
            "start_record": self.start_record,
            "unstable_episodes": self.unstable_episodes,
        }, state_path + ".tmp")
        # atomic: a crash mid-save leaves the previous checkpoint whole
        os.replace(state_path + ".tmp", state_path)
        self.save_actor(path)

    def save_actor(self, path: str) -> None:
        """The acting residual alone, ``<path>/residual_actor.safetensors`` (atomic): the trained
        actor, or after the end guard dropped it, the deployed start (``trainer_state.pt`` keeps
        the training state either way)."""
        from safetensors.torch import save_file  # noqa: PLC0415

        tmp = os.path.join(path, "residual_actor.safetensors.tmp")
        save_file({k: v.detach().cpu().contiguous() for k, v in self.learner.actor.state_dict().items()}, tmp)
        os.replace(tmp, os.path.join(path, "residual_actor.safetensors"))

    def load(self, path: str) -> None:
        state_path = os.path.join(path, "trainer_state.pt")
        if not os.path.exists(state_path):
            raise FileNotFoundError(f"no finetuning checkpoint at {path} (missing trainer_state.pt)")
        state = torch.load(state_path, weights_only=False, map_location="cpu")  # resumable on any device
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{state_path} was written by an older ARLI (checkpoint format "
                             f"{state.get('format', 1)}, this one reads {CHECKPOINT_FORMAT}: different state "
                             "layout and replay fields); start a new run instead of resuming it")
        trained = state["max_delay"]
        if trained != self.max_delay:
            # checked before anything is loaded: a refused checkpoint leaves this run untouched
            raise InputError(f"{path} was trained with the scheduler planning d = {trained} control steps; "
                             f"this run plans d = {self.max_delay}: pass delay_steps={trained} to use it")
        # its anchor replay is not collected again: the config must say how it was
        demos = state.get("demonstrations", "expert")  # checkpoints from before the setting: the expert's own
        if demos != self.spec.demonstrations:
            raise InputError(f"{path} holds anchor data collected with run.demonstrations={demos}; this run says "
                             f"{self.spec.demonstrations}: pass run.demonstrations={demos} to resume it")
        self.trainer.load_state_dict(state["trainer"])
        self.rng.bit_generator.state = state["rng"]
        ctl = self.controller
        ctl.rng.bit_generator.state = state["ctl_rng"]
        ctl.intervened_steps = state["intervened_steps"]
        ctl.nstep.takeovers = state["takeovers"]
        self.episode, self.history = state["episode"], state["history"]
        self.successes, self.assisted = state["successes"], state["assisted"]
        self.episode_log = state.get("episode_log", [])
        self.start_record = state.get("start_record", {})  # {} in checkpoints from before it was kept
        if state.get("unstable_episodes") is not None and self.unstable_episodes is not None:
            self.env.unwrapped.unstable_episodes = state["unstable_episodes"]
        ctl.nstep.begin_episode()  # saved at an episode boundary: nothing pending
