#!/usr/bin/env bash
# GPU machine: the base policy behind ZeroMQ. Usage: launch/gpu_server.sh [overrides...]
#   e.g. launch/gpu_server.sh checkpoint=/models/pi0_franka transport.curve.enabled=true
exec "$(dirname "$0")/../.venv/bin/arli" serve transport.server=tcp://0.0.0.0:5555 "$@"
