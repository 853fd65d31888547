"""Franka Panda / FR3 behind the runtime's driver interface, through ``franky-control``.

``config.py`` (settings, no dependencies), ``safety.py`` (action -> Cartesian target with
every limit, no robot needed), ``driver.py`` (streams those targets to franky with
recovery and a watchdog).
"""
