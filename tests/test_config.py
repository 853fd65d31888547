import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from arli.cli import compose, main
from arli.config import ConfigError


def test_defaults_and_overrides():
    cfg = compose("rollout", ["env=pick_cube", "chunk_size=12", "chunking.strategy=rtc", "latency=uniform"])
    assert cfg.env.name == "pick_cube"
    assert cfg.chunk_size == 12 and cfg.chunking.strategy == "rtc"
    assert cfg.latency.kind == "uniform" and cfg.latency.high == 0.3


@pytest.mark.parametrize("command,override,field", [
    ("rollout", "chunking.strategy=magic", "chunking.strategy"),
    ("rollout", "env.name=moon_base", "env.name"),
    ("rollout", "env.dt=0.0123", "env.dt"),
    ("rollout", "chunking.execute_horizon=40", "chunking.execute_horizon"),
    ("rollout", "chunking.planned_delay_steps=-1", "chunking.planned_delay_steps"),
    ("finetune", "chunking.strategy=sync", "chunking.strategy"),  # the residual acts inside async execution
    ("actor", "chunking.planned_delay_steps=null", "chunking.planned_delay_steps"),
    ("actor", "chunking.min_delay_steps=9", "chunking.min_delay_steps"),
    ("rollout", "latency.sigma=-1", "latency.sigma"),
    ("finetune", "run.intervention.mode=sometimes", "run.intervention.mode"),
    ("finetune", "run.intervention.prob=1.5", "run.intervention.prob"),
    ("finetune", "run.intervention.patience=0", "run.intervention.patience"),
    ("finetune", "run.learner.q_weight=-1", "run.learner.q_weight"),
    ("finetune", "run.learner.pretrain_updates=-5", "run.learner.pretrain_updates"),
    ("finetune", "run.variant=delayed", "run.variant"),
    ("finetune", "run.regime=online", "run.regime"),
    ("finetune", "run.learner.actor_update=sac", "run.learner.actor_update"),
    ("finetune", "run.learner.q_filter=true", "run.learner.q_filter"),  # acts under actor_update=dpg only
    ("finetune", "run.learner.gate_candidates=-1", "run.learner.gate_candidates"),
    ("finetune", "run.seed=1000", "run.seed"),  # each training seed has its own block of episode seeds
    ("finetune", "run.intervention.max_steps=-1", "run.intervention.max_steps"),
    ("record", "run.learner.tau=0", "run.learner.tau"),
    ("learner", "run.env_steps=0", "run.env_steps"),
    ("finetune", "run.test_seed=10010", "run.test_seed"),  # overlaps the tune seeds 10000..10029
    ("finetune", "run.test_seed=10100", "run.test_seed"),  # inside the guards' 200 tune seeds
    ("finetune", "run.guard_episodes=-1", "run.guard_episodes"),
    ("bench_latency_sweep", "run.tune_seed=4999990", "run.test_seed"),
    ("bench_latency_sweep", "run.tune_seed=5000050", "run.test_seed"),  # inside the sweep's 100 test seeds
    ("bench_anchor_start", "run.test_seed=10050", "run.test_seed"),  # inside anchor-start's 100 tune seeds
    ("finetune", "run.test_seed=100000", "run.test_seed"),  # the training episodes' seeds
    ("bench_base", "chunking.execute_horizon=20", "chunking.execute_horizon"),
    ("bench_runtime", "chunking.planned_delay_steps=null", "chunking.planned_delay_steps"),
    ("eval", "episodes=0", "episodes"),
    ("bench_latency_sweep", "variants=[arli,magic]", "variants"),
    ("bench_learner", "threads=0", "threads"),
    ("bench_anchor_start", "pretrain_lrs=[0.001,0]", "pretrain_lrs"),
    ("bench_anchor_start", "updates=[]", "updates"),
    ("bench_anchor_start", "workers=0", "workers"),
    ("bench_anchor_start", "demonstrations=[teleop]", "demonstrations"),
    ("bench_anchor_start", "demonstrations=[bounded,bounded]", "demonstrations"),
    ("finetune", "run.demonstrations=teleop", "run.demonstrations"),
    ("actor", "robot=ur5", "robot"),
    ("actor", "device=joystick", "device"),
    ("actor", "franka.max_step_pos=0.2", "franka.max_step_pos"),
    ("actor", "franka.workspace_low=[0.8,0,0]", "franka.workspace_low"),
    ("actor", "franka.relative_dynamics_factor=1.5", "franka.relative_dynamics_factor"),
    ("learner", "robot=franka", "run.anchor_episodes"),
    ("record", "device=joystick", "device"),
    ("record", "episodes=0", "episodes"),
    ("finetune", "run.intervention.judged_dims=-1", "run.intervention.judged_dims"),
    ("finetune", "run.learner.exploration_corr=1.0", "run.learner.exploration_corr"),  # rho 1: a constant
    ("bench_ceiling", "noise_std=[-0.1]", "noise_std"),
    ("bench_ceiling", "noise=[pink]", "noise"),
])
def test_bad_values_name_the_field(command, override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        compose(command, [override])


def test_the_select_update_needs_value_gatings_candidates():
    """select regresses onto the best of gate_candidates candidates: with fewer than 2 it would be
    plain regression onto the data, refused naming the field."""
    compose("finetune", ["run.learner.actor_update=select"])  # the default's 8 candidates
    with pytest.raises(ConfigError, match=r"run\.learner\.gate_candidates: .*>= 2 with run\.learner\.actor_update=select"):
        compose("finetune", ["run.learner.actor_update=select", "run.learner.gate_candidates=1"])


def test_an_actor_loss_with_no_term_is_rejected():
    """q_weight = 0 and anchor_weight = 0: nothing would move the actor; refused at start-up."""
    with pytest.raises(ConfigError, match=r"run\.learner\.anchor_weight: expected > 0 when run\.learner\.q_weight is 0"):
        compose("finetune", ["run.learner.q_weight=0", "run.learner.anchor_weight=0"])
    compose("finetune", ["run.learner.q_weight=0"])  # the BC control stays valid


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match="episodez"):
        compose("rollout", ["episodez=3"])


def test_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match="episodes"):
        compose("rollout", ["episodes=many"])


@pytest.mark.parametrize("command, override, expected", [
    # a typo of a nested key: its full name, the nearest key and the keys of its section
    ("finetune", "run.env_stpes=100", r"^run\.env_stpes: unknown key; did you mean run\.env_steps\?\n"
                                      r"  valid keys of run: .*\benv_steps\b"),
    ("finetune", "run.learner.utdd=2", r"^run\.learner\.utdd: unknown key; did you mean run\.learner\.utd\?"),
    ("rollout", "episode=5", r"^episode: unknown key; did you mean episodes\?\n  valid top-level keys: "),
    # '+' on a dataclass section adds a key nothing reads: refused like a typo, not ignored
    ("finetune", "+run.env_stpes=100", r"^\+run\.env_stpes=100: unknown key; did you mean run\.env_steps\? "
                                       r"\('\+' adds keys only to mappings\)\n  valid keys of run: "),
    ("rollout", "+episode=5", r"^\+episode=5: unknown key; did you mean episodes\?"),
    # a wrong type names the field, list items included
    ("finetune", "run.env_steps=abc", r"^run\.env_steps: Value 'abc' of type 'str' could not be converted"),
    ("rollout", "delay_steps=[0,x]", r"^delay_steps\[1\]: Value 'x'"),
    # an unknown option of a config group lists the options (not the schema, not Hydra's search path)
    ("rollout", "env=pick_cub", r"^env=pick_cub: unknown option for 'env'; choose from peg_insert, "
                                r"peg_insert_dynamic, pick_cube, robosuite_lift$"),
    # an override Hydra cannot parse is named
    ("rollout", "delay_steps=[0,4", r"^cannot parse the override 'delay_steps=\[0,4' \(.*\): check its brackets"),
    # a new key of a mapping, a group that needs +, a list index, an override Hydra refuses: each says the fix
    ("actor", "cameras.wrist=0", r"^cameras\.wrist: not a key of the mapping cameras yet; add it with "
                                 r"'\+cameras\.wrist=<value>'$"),
    # a whole mapping in one override merges too: the message gives that override with '+'
    ("actor", "cameras={front: '0'}", r"^cameras\.front: not a key of the mapping cameras yet; add it with "
                                      r"'\+cameras\.front=<value>'; or add its keys with "
                                      r"'\+cameras=\{front: '0'\}'$"),
    # '++' adds like '+', and a mapping given above the unknown key is the override named
    ("finetune", "++run.env_stpes=1", r"^\+\+run\.env_stpes=1: unknown key; did you mean run\.env_steps\? "
                                      r"\('\+' adds keys only to mappings\)"),
    ("finetune", "+run={env_stpes: 1}", r"^\+run=\{env_stpes: 1\}: unknown key; did you mean run\.env_steps\? "
                                        r"\('\+' adds keys only to mappings\)"),
    ("finetune", "recipe=expo", r"No match in the defaults list\. \(To append to your default list use \+recipe=expo\)"),
    ("rollout", "delay_steps.5=1", r"^delay_steps\[5\]: list index out of range$"),
    ("rollout", "env=null", r"Config group override must be a string or a list.*; overrides: env=null$"),
])
def test_config_errors_name_the_field_and_what_it_takes(command, override, expected):
    with pytest.raises(ConfigError) as err:
        compose(command, [override])
    assert re.search(expected, str(err.value), re.S), str(err.value)


def test_the_fixes_the_mapping_errors_name_compose():
    """What the messages above tell the user to type sets the mapping."""
    assert compose("actor", ["+cameras.wrist=0"]).cameras == {"wrist": "0"}
    assert compose("actor", ["+cameras={front: '0', wrist: '1'}"]).cameras == {"front": "0", "wrist": "1"}


def test_a_config_file_with_an_unknown_key_names_the_key_its_section_and_the_file(tmp_path, monkeypatch):
    """A recipe with a typo: the key, the fix and the section's keys, and the file it is in
    (Hydra's own error names only the file and buries the key in later lines)."""
    import shutil

    from arli.cli import config_dir

    root = tmp_path / "configs"
    shutil.copytree(config_dir(), root)
    (root / "recipe" / "typo.yaml").write_text("# @package run.learner\ngate_candidats: 8\n")
    monkeypatch.setenv("ARLI_CONFIG_DIR", str(root))
    with pytest.raises(ConfigError) as err:
        compose("finetune", ["+recipe=typo"])
    first, keys = str(err.value).split("\n", 1)
    assert first == ("run.learner.gate_candidats: unknown key; did you mean run.learner.gate_candidates? (set in the "
                     "config file recipe/typo.yaml)")  # no '+' hint: no override added it
    assert keys.startswith("  valid keys of run.learner: ") and "gate_std" in keys


def test_commands_missing_their_inputs_say_how_to_pass_them(tmp_path, capsys):
    """`arli eval` without run=, `arli bench runs` with no runs or a missing one, `arli finetune`
    resuming a missing checkpoint: one line naming the field, before anything is written."""
    assert main(["eval"]) == 2
    assert "run: required; pass run=" in capsys.readouterr().err
    assert main(["bench", "runs", "name=x"]) == 2
    assert "runs: expected at least one `arli finetune` run directory" in capsys.readouterr().err
    assert main(["bench", "runs", f"runs=[{tmp_path / 'gone'}]", f"report_dir={tmp_path}"]) == 2
    assert f"runs: {tmp_path / 'gone'} does not exist" in capsys.readouterr().err
    for bench in (["bench", "tune", f"runs=[{tmp_path / 'a'},{tmp_path / 'gone'}]"],
                  ["bench", "critic", f"runs=[{tmp_path / 'gone'}]"]):
        assert main([*bench, f"report_dir={tmp_path}"]) == 2
        err = capsys.readouterr().err
        assert "runs: no finetune run at" in err and "run: no" not in err.replace("runs: no", ""), err
    good = tmp_path / "good"  # a finished run's saved config, then a missing run: named before any is judged
    good.mkdir()
    saved = Path(__file__).parents[1] / "reports/peg_insert_280b12/arli_d8_200k_s10/config.yaml"
    (good / "config.yaml").write_text(saved.read_text())
    assert main(["bench", "critic", f"runs=[{good},{tmp_path / 'gone'}]", f"report_dir={tmp_path}"]) == 2
    assert f"runs: no finetune run at {tmp_path / 'gone'}" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("kept: true\n")
    assert main(["finetune", f"output_dir={run}", f"resume={tmp_path / 'nowhere'}"]) == 2
    assert "resume: no finetuning checkpoint at" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == "kept: true\n"  # the run it named is untouched


def test_cli_exit_code_and_message(capsys):
    assert main(["rollout", "chunking.strategy=sideways"]) == 2
    err = capsys.readouterr().err
    assert "chunking.strategy" in err and "'sync', 'naive', 'blend', 'rtc'" in err
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
    assert main(["finetune", "run.variant=nope", "--help"]) == 2


def test_a_standalone_learner_plans_the_delay_its_actors_plan():
    """`arli learner` alone keeps the delay and control period its actors plan for, not the
    main job's: the residual's state is built for the same timing on both sides."""
    assert compose("learner", []).delay_steps == compose("actor", []).chunking.planned_delay_steps
    assert compose("learner", []).env.dt == compose("actor", []).env.dt


@pytest.mark.parametrize("command,extra", [("finetune", []), ("learner", []),
                                           ("bench_latency_sweep", ["variants=[arli,standard]"])])
def test_learner_recipes_set_their_settings_and_yield_to_later_overrides(command, extra):
    """``+recipe=resfit`` / ``+recipe=expo`` place their settings at run.learner of any
    command with a learner; a key given after the recipe still wins."""
    resfit = compose(command, ["+recipe=resfit", "run.learner.pretrain_updates=2000", *extra]).run.learner
    assert (resfit.actor_update, resfit.anchor_weight, resfit.actor_lr, resfit.critic_heads) == ("dpg", 0.0, 1e-6, 10)
    assert (resfit.residual_scale, resfit.critic_warmup_updates, resfit.grad_clip) == (0.1, 10_000, 1.0)
    assert resfit.pretrain_updates == 2000
    expo = compose(command, ["+recipe=expo", *extra]).run.learner
    assert (expo.actor_update, expo.gate_candidates, expo.backup_candidates) == ("select", 8, 8)
    with pytest.raises(ConfigError, match="recipe"):
        compose(command, ["+recipe=magic", *extra])


def test_a_saved_run_with_an_inert_awr_setting_still_loads(tmp_path):
    """A dpg run saved when awr's advantage defaulted to "td" stays loadable (arli eval, bench
    tune) although start-up validation refuses typing that setting for dpg now."""
    from dataclasses import replace

    from omegaconf import OmegaConf

    from arli.config import FinetuneConfig
    from arli.runs import load_run_config

    cfg = FinetuneConfig()
    cfg.run = replace(cfg.run, learner=replace(cfg.run.learner, actor_update="dpg", awr_advantage="td"))
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match=r"run\.learner\.awr_advantage"):
        compose("finetune", ["run.learner.actor_update=dpg", "run.learner.awr_advantage=td"])
    loaded = load_run_config(str(tmp_path))
    assert loaded.run.learner.actor_update == "dpg" and loaded.run.learner.awr_advantage == "q"


def test_a_run_saved_before_a_setting_existed_loads_with_what_it_ran(tmp_path):
    """A config.yaml without awr_advantage / anchor_decay_updates / start_guard / guard_episodes
    (written before they existed) loads as it ran: TD advantage, no fade, no guard, guards on the
    curve's episodes, not today's defaults."""
    from omegaconf import OmegaConf

    from arli.config import FinetuneConfig
    from arli.runs import load_run_config

    saved = OmegaConf.to_container(OmegaConf.structured(FinetuneConfig()))
    saved["run"]["learner"].update(actor_update="awr", gate_candidates=0)  # the learner of those days
    for key in ("awr_advantage", "anchor_decay_updates", "backup_candidates"):
        del saved["run"]["learner"][key]
    del saved["run"]["start_guard"]
    del saved["run"]["demonstrations"]
    del saved["run"]["guard_episodes"]
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    run = load_run_config(str(tmp_path)).run
    assert (run.learner.awr_advantage, run.learner.anchor_decay_updates, run.start_guard) == ("td", 0, False)
    assert run.learner.backup_candidates == 0 and FinetuneConfig().run.learner.backup_candidates == 8
    assert run.guard_episodes == 0 and run.guard_count() == run.eval_episodes  # its guards: the curve's episodes
    assert run.demonstrations == "expert" and FinetuneConfig().run.demonstrations == "bounded"
    assert FinetuneConfig().run.learner.awr_advantage == "q"  # today's default differs
