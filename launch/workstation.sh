#!/usr/bin/env bash
# Workstation: the learner service for a fleet of robots. Usage: launch/workstation.sh [overrides...]
#   e.g. launch/workstation.sh run.env_steps=50000 output_dir=outputs/learner_franka
exec "$(dirname "$0")/../.venv/bin/arli" learner transport.learner=tcp://0.0.0.0:5556 \
    transport.weights=tcp://0.0.0.0:5557 "$@"
