# Pitstop developer entry points. `make test` and `make demo` do their own setup.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install system test lint typecheck unit demo golden agent-wheel clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,local]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check functions tests
	$(BIN)/ruff format --check functions tests
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

# Four processes on CI's two cores, one test file each at a time (fixtures are per module): most
# of the suite waits on emulators, Slurm and workflow timers rather than on the CPU (load average
# 1.3-2.3 with three processes), so a fourth stack fills the wait. A worker killed by a
# timeout ends the run: xdist's loadfile scheduler can deadlock replacing a crashed worker
# (pytest-xdist #784, #1378). Files go out longest first (tests/module-seconds.yaml, read by
# tests/conftest.py), not xdist's default of most tests first, which left the longest module to
# run alone at the end. The slowest tests are listed so CI shows where its time went.
unit: system install
	$(BIN)/pytest -q -n 4 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=25

test: lint typecheck unit

system:
	bash scripts/setup-system.sh

demo: system install
	$(BIN)/pitstop demo

# The deploy baselines (tests/fixtures/deploy/) from the code and data as they are: review the diff.
golden: install
	$(BIN)/python -m pitstop.tools.golden

# The Slurm agent alone as a wheel, dist/pitstop_slurm_agent-VERSION-py3-none-any.whl, for
# infra/slurm/startup-agent.sh (standard library only: no venv, no build backend, no network).
agent-wheel:
	$(PYTHON) functions/pitstop/tools/agent_wheel.py --out dist

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .import_linter_cache
