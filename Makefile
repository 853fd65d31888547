# Quick start: `make demo` (set up + run the main job), `make test` (set up + run the tests).
# `make smoke`: the whole finetuning path in about a minute; `make test-fast`: the fast tests.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.synced
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export MUJOCO_GL ?= egl

.PHONY: setup demo smoke test test-fast test-pi pi-env bench clean

# --compile-bytecode: every process the tests start imports torch and LeRobot from
# bytecode written once here, not compiled again from source where PYTHONDONTWRITEBYTECODE is set
# UV=uv: a uv installed on its own (pipx, its installer), where the system Python refuses pip installs
UV ?= $(PY) -m uv
$(STAMP): pyproject.toml uv.lock
	@$(UV) --version >/dev/null 2>&1 || $(PY) -m pip install --quiet uv
	$(UV) sync --frozen --compile-bytecode
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/arli finetune

# the main job's path at a tiny budget on the scripted expert's chunks (no base pretraining)
smoke: setup
	$(VENV)/bin/arli finetune env=pick_cube checkpoint=expert run.env_steps=3000 run.anchor_episodes=4 \
		run.eval_every=1500 run.eval_episodes=10 run.guard_episodes=10 run.test_episodes=50 run.learn_after=300 \
		run.learner.pretrain_updates=200 output_dir=outputs/smoke

# a worker per core (pytest-xdist), each test module on one worker: most tests wait on processes,
# sockets or one torch thread, so one test at a time leaves a core of this 2-core machine idle
test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --durations=15 tests

test-fast: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile -m "not slow" tests

# pi0 / pi0.5 need transformers patched for openpi, in an environment of their own (docs/vla.md);
# OPENPI=<openpi checkout> patches transformers 4.53.2 with its files, else huggingface's fork
pi-env: setup
	PY=$(PY) scripts/pi_env.sh .venv-pi $(OPENPI)

test-pi:
	.venv-pi/bin/python -m pytest -q -p no:cacheprovider -m slow -k pi_policies tests/test_vla_serving.py

bench: setup
	$(VENV)/bin/arli bench sim --json

clean:
	rm -rf $(VENV) .venv-pi outputs
