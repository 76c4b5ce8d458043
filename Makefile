# Pitstop developer entry points. `make test` and `make demo` do their own setup.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint typecheck unit demo clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check functions tests
	$(BIN)/ruff format --check functions tests

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q

test: lint typecheck unit

demo: install
	@echo "make demo: the local end-to-end demo (emulators, fake Compute, real Slurm, fault scenarios)"
	@echo "is not built yet (issue 5). Until then: 'make test', and 'pitstop classify' on your own logs."
	@exit 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
