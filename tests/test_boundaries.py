"""DESIGN.md §3 boundaries, checked on what a fresh interpreter actually imports."""

from __future__ import annotations

import subprocess
import sys



def imported(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_sim_envs_do_not_depend_on_the_method():
    assert not any(m == "arli" or m.startswith("arli.") for m in imported("sim_envs.experts"))


def test_the_inference_server_imports_no_robot_driver():
    assert not any(m.startswith("robot_drivers") for m in imported("arli.runtime.server"))


def test_the_runtime_loop_depends_on_the_driver_interface_only():
    mods = imported("arli.runtime.loop")
    assert "robot_drivers.base" in mods
    assert not any(m.startswith(("robot_drivers.sim", "sim_envs", "mujoco")) for m in mods)


def test_native_tasks_do_not_import_robosuite():
    """robosuite's import prints warnings; only its own tasks should pay for it."""
    code = ("import sys, sim_envs; env = sim_envs.make_env('peg_insert'); env.reset(seed=0); "
            "print('robosuite' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False" and "robosuite" not in out.stderr
