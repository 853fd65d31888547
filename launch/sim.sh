#!/usr/bin/env bash
# One machine: server + learner + N sim actors as processes. Usage: launch/sim.sh [actors=N] [overrides...]
exec "$(dirname "$0")/../.venv/bin/arli" launch sim "$@"
