#!/usr/bin/env bash
# Robot PC: the runtime. Usage: launch/robot.sh GPU_HOST WORKSTATION_HOST [overrides...]
#   e.g. launch/robot.sh 10.0.0.2 10.0.0.3 actor_id=franka1 chunking.planned_delay_steps=4
gpu=$1 ws=$2; shift 2
exec "$(dirname "$0")/../.venv/bin/arli" actor transport.server="tcp://$gpu:5555" \
    transport.learner="tcp://$ws:5556" transport.weights="tcp://$ws:5557" "$@"
