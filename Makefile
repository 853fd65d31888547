# Quick start: `make demo` (set up + run the main job), `make test` (set up + run the tests).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.synced
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export MUJOCO_GL ?= egl

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml uv.lock
	@$(PY) -m uv --version >/dev/null 2>&1 || $(PY) -m pip install --quiet uv
	$(PY) -m uv sync --frozen
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/arli finetune

test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests

bench: setup
	$(VENV)/bin/arli bench sim --json

clean:
	rm -rf $(VENV) outputs
