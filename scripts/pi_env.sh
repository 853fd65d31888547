#!/usr/bin/env bash
# A second environment for LeRobot's pi0 / pi0.5 (docs/vla.md): ARLI's locked packages, but
# transformers 4.53.2 patched for openpi instead of SmolVLA's transformers>=4.57.1.
#   scripts/pi_env.sh [VENV] [OPENPI_CHECKOUT]
# With an openpi checkout, its transformers_replace files are copied over transformers 4.53.2
# (what openpi's README does); without one, huggingface's fork fix/lerobot_openpi is installed
# from GitHub. Either way `arli.policies.lerobot_adapter.pi_transformers_installed()` holds after.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-pi}
OPENPI=${2:-}
PY=${PY:-python3}
UV="$PY -m uv"
REPLACE=src/openpi/models_pytorch/transformers_replace
if [[ -n "$OPENPI" && ! -d "$OPENPI/$REPLACE" ]]; then
  echo "pi_env: $OPENPI has no $REPLACE: pass an openpi checkout (github.com/Physical-Intelligence/openpi)" >&2
  exit 2
fi
REQS=$(mktemp)
OVERRIDE=$(mktemp)
trap 'rm -f "$REQS" "$OVERRIDE"' EXIT
# the lock without transformers and the two packages its version pins
$UV export --frozen --no-hashes --no-emit-project --all-groups \
  | grep -v -E '^(transformers|tokenizers|huggingface-hub)==' > "$REQS"
echo 'numpy>=1.26,<2.3' > "$OVERRIDE"  # as [tool.uv] override-dependencies in pyproject.toml
if [[ -n "$OPENPI" ]]; then
  TRANSFORMERS='transformers==4.53.2'
else
  TRANSFORMERS='transformers @ git+https://github.com/huggingface/transformers.git@fix/lerobot_openpi'
fi
$UV venv -q --clear --python 3.11 "$VENV"
$UV pip install -q --python "$VENV/bin/python" -r "$REQS" "$TRANSFORMERS" --override "$OVERRIDE"
$UV pip install -q --python "$VENV/bin/python" --no-deps -e .
if [[ -n "$OPENPI" ]]; then
  SITE=$("$VENV/bin/python" -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')
  cp -r "$OPENPI/$REPLACE/." "$SITE/"
fi
"$VENV/bin/python" -c 'from arli.policies.lerobot_adapter import pi_transformers_installed as ok; import sys; sys.exit(0 if ok() else 1)' \
  || { echo "pi_env: transformers in $VENV is not the openpi one: pi0 / pi0.5 will be refused" >&2; exit 1; }
echo "pi_env: $VENV ready: $VENV/bin/arli serve checkpoint=<pi0 or pi0.5 dir>"
