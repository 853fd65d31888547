"""Franka Panda / FR3 behind the runtime's driver interface, through ``franky-control``.

``safety.py`` turns an action into a Cartesian target (box, per-step limits) without any
robot; ``driver.py`` streams those targets to franky with recovery and a watchdog.
"""

from robot_drivers.franka.config import FrankaConfig
from robot_drivers.franka.safety import CartesianTarget, TargetIntegrator

__all__ = ["CartesianTarget", "FrankaConfig", "TargetIntegrator"]
