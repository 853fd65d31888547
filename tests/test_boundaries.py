"""The layers point down, checked on what a fresh interpreter actually imports.

Bottom: records and leaf types (``arli.types``, ``arli.interfaces``), the one ``arli``
module ``robot_drivers`` may import. Then transport, chunking and augment. Then rl and
runtime (runtime may use rl, never the reverse). Then the application: finetune,
commands, bench.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

APPLICATION = ("arli.finetune", "arli.commands", "arli.bench", "arli.cli", "arli.config", "arli.record_cli")


def imported(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def under(mods: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in mods if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_sim_envs_do_not_depend_on_the_method():
    assert not under(imported("sim_envs.experts"), "arli")


@pytest.mark.parametrize("module", ["robot_drivers.base", "robot_drivers.sim", "robot_drivers.teleop",
                                    "robot_drivers.franka.driver", "robot_drivers.camera"])
def test_robot_drivers_import_only_the_leaf_types(module):
    assert set(under(imported(module), "arli")) <= {"arli", "arli.types"}


def test_leaf_types_import_nothing_of_the_stack():
    mods = imported("arli.interfaces")
    assert set(under(mods, "arli")) <= {"arli", "arli.types", "arli.interfaces"}
    assert not under(mods, "robot_drivers", "sim_envs", "torch")


@pytest.mark.parametrize("module", ["arli.transport.codec", "arli.transport.inference_client",
                                    "arli.transport.zmq_io", "arli.transport.openpi_endpoint"])
def test_transport_does_not_import_the_runtime(module):
    assert not under(imported(module), "arli.runtime", "arli.rl", *APPLICATION)


@pytest.mark.parametrize("module", ["arli.rl.learner", "arli.rl.trainer", "arli.rl.transitions", "arli.rl.replay",
                                    "arli.rl.recorded"])
def test_rl_imports_neither_the_runtime_nor_the_drivers(module):
    assert not under(imported(module), "arli.runtime", "robot_drivers", *APPLICATION)


@pytest.mark.parametrize("module", ["arli.runtime.loop", "arli.runtime.acting", "arli.runtime.actor",
                                    "arli.runtime.server", "arli.runtime.learner_service",
                                    "arli.runtime.recording", "arli.runtime.link"])
def test_the_runtime_does_not_import_the_application(module):
    assert not under(imported(module), *APPLICATION)


@pytest.mark.parametrize("module", ["arli.bench.latency_sweep", "arli.bench.anchor_start", "arli.bench.base",
                                    "arli.bench.runtime", "arli.bench.transport", "arli.bench.learner",
                                    "arli.bench.interventions", "arli.bench.pipeline", "arli.bench.sim",
                                    "arli.bench.critic", "arli.bench.serve", "arli.bench.record",
                                    "arli.bench.tune", "arli.bench.runs", "arli.bench.ceiling",
                                    "arli.bench.sweep_runs", "arli.bench.diagnostics",
                                    "arli.bench.critic_refit", "arli.bench.claims"])
def test_benchmarks_do_not_import_the_commands(module):
    assert not under(imported(module), "arli.commands", "arli.cli")


def test_the_claims_judge_cells_without_running_them():
    """``arli.bench.claims`` judges a sweep's cells: it never loads the sweep that runs them,
    the learner or the simulator."""
    assert not under(imported("arli.bench.claims"), "arli.bench.latency_sweep", "arli.rl.learner", "arli.finetune",
                     "sim_envs", "torch")


def test_the_robot_side_actor_does_not_import_torch():
    """The robot PC runs the residual in numpy: ``arli actor``'s modules never load torch."""
    mods = imported("arli.runtime.actor, arli.transport.inference_client, arli.transport.openpi_endpoint, "
                    "arli.runtime.link, "
                    "robot_drivers.sim, robot_drivers.franka.driver, robot_drivers.teleop")
    assert not under(mods, "torch", "lerobot")


def test_the_inference_server_imports_no_robot_driver():
    assert not under(imported("arli.runtime.server"), "robot_drivers")


def test_the_runtime_loop_depends_on_the_driver_interface_only():
    mods = imported("arli.runtime.loop")
    assert "robot_drivers.base" in mods
    assert not under(mods, "robot_drivers.sim", "sim_envs", "mujoco", "torch")


def test_native_tasks_do_not_import_robosuite():
    """robosuite's import prints warnings; only its own tasks should pay for it."""
    code = ("import sys, sim_envs; env = sim_envs.make_env('peg_insert'); env.reset(seed=0); "
            "print('robosuite' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False" and "robosuite" not in out.stderr
