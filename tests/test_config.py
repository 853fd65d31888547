import json
import subprocess
import sys

import pytest

from arli.cli import compose, main
from arli.config import ConfigError


def test_defaults_and_overrides():
    cfg = compose("rollout", ["env=pick_cube", "chunking.chunk_size=12", "latency=uniform"])
    assert cfg.env.name == "pick_cube"
    assert cfg.chunking.chunk_size == 12
    assert cfg.latency.kind == "uniform" and cfg.latency.high == 0.3


@pytest.mark.parametrize("command,override,field", [
    ("rollout", "chunking.mode=sideways", "chunking.mode"),
    ("rollout", "chunking.strategy=magic", "chunking.strategy"),
    ("rollout", "env.name=moon_base", "env.name"),
    ("rollout", "env.dt=0.0123", "env.dt"),
    ("rollout", "chunking.execute_horizon=40", "chunking.execute_horizon"),
    ("rollout", "latency.sigma=-1", "latency.sigma"),
    ("finetune", "intervention.mode=sometimes", "intervention.mode"),
    ("finetune", "intervention.prob=1.5", "intervention.prob"),
    ("finetune", "intervention.patience=0", "intervention.patience"),
    ("finetune", "learner.q_weight=-1", "learner.q_weight"),
    ("finetune", "learner.pretrain_updates=-5", "learner.pretrain_updates"),
    ("finetune", "variant=delayed", "variant"),
    ("finetune", "regime=online", "regime"),
    ("finetune", "learner.actor_update=sac", "learner.actor_update"),
    ("finetune", "intervention.max_steps=-1", "intervention.max_steps"),
    ("bench_latency_sweep", "variants=[arli,magic]", "variants"),
    ("bench_learner", "threads=0", "threads"),
    ("bench_anchor_start", "pretrain_lrs=[0.001,0]", "pretrain_lrs"),
    ("bench_anchor_start", "updates=[]", "updates"),
    ("actor", "robot=ur5", "robot"),
    ("actor", "device=joystick", "device"),
    ("actor", "franka.max_step_pos=0.2", "franka.max_step_pos"),
    ("actor", "franka.workspace_low=[0.8,0,0]", "franka.workspace_low"),
    ("actor", "franka.relative_dynamics_factor=1.5", "franka.relative_dynamics_factor"),
    ("learner", "robot=franka", "anchor_episodes"),
    ("record", "device=joystick", "device"),
    ("record", "episodes=0", "episodes"),
    ("finetune", "intervention.judged_dims=-1", "intervention.judged_dims"),
    ("finetune", "learner.exploration_corr=1.0", "learner.exploration_corr"),  # rho 1: a constant, not noise
])
def test_bad_values_name_the_field(command, override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        compose(command, [override])


def test_an_actor_loss_with_no_term_is_rejected():
    """q_weight = 0 and anchor_weight = 0: nothing would move the actor; refused at start-up."""
    with pytest.raises(ConfigError, match=r"learner\.anchor_weight: expected > 0 when learner\.q_weight is 0"):
        compose("finetune", ["learner.q_weight=0", "learner.anchor_weight=0"])
    compose("finetune", ["learner.q_weight=0"])  # the BC control stays valid


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match="episodez"):
        compose("rollout", ["episodez=3"])


def test_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match="episodes"):
        compose("rollout", ["episodes=many"])


def test_cli_exit_code_and_message(capsys):
    assert main(["rollout", "chunking.mode=sideways"]) == 2
    err = capsys.readouterr().err
    assert "chunking.mode" in err and "async" in err
    assert main(["frobnicate"]) == 2


def test_rollout_entry_point_end_to_end(tmp_path):
    """The real console script, tiny budget: the scripted expert's open-loop chunks (planned
    on a kinematic prediction) succeed at delay 4, synchronous and with RTC's committed prefix."""
    out = tmp_path / "r"
    proc = subprocess.run(
        [sys.executable, "-m", "arli.cli", "rollout", "env=peg_insert", "episodes=4",
         "delay_steps=[4]", "strategies=[sync,naive,rtc]", f"output_dir={out}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cells = {c["strategy"] if c["mode"] == "async" else "sync": c
             for c in json.loads((out / "rollout.json").read_text())["cells"]}
    assert cells["sync"]["success"] >= 0.75
    assert cells["rtc"]["success"] >= 0.75
    assert cells["naive"]["delay_steps"] == 4 and cells["naive"]["mean_delay_steps"] == 4



def test_every_task_has_an_env_config_group():
    from sim_envs import TASKS

    for name in TASKS:
        assert compose("finetune", [f"env={name}"]).env.name == name


def test_every_command_help_prints_its_composed_config(capsys):
    from omegaconf import OmegaConf  # noqa: PLC0415

    from arli.cli import COMMANDS  # noqa: PLC0415

    for words, (name, _, _) in COMMANDS.items():
        assert main([*words.split(), "--help"]) == 0, words
        out = capsys.readouterr().out
        assert out.startswith(f"arli {words}:") and "overrides:" in out, words
        body = out.split("):\n", 1)[1].rsplit("\noverrides:", 1)[0]
        composed = OmegaConf.create(body)  # valid YAML, the values a run would use
        if "env" in composed:
            assert composed.env.name == "peg_insert" and composed.env.dt == 0.05, words
    assert main(["finetune", "env=pick_cube", "--help"]) == 0
    assert "name: pick_cube" in capsys.readouterr().out
    assert main(["finetune", "variant=nope", "--help"]) == 2


def test_a_standalone_learner_plans_the_delay_its_actors_plan():
    """`arli learner` alone keeps the delay and control period its actors plan for, not the
    main job's: the residual's state is built for the same timing on both sides."""
    assert compose("learner", []).delay_steps == compose("actor", []).planned_delay_steps
    assert compose("learner", []).env.dt == compose("actor", []).env.dt
