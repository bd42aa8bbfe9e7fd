# Thin wrappers around the README's commands. A fresh machine needs only Python.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test run experiments benchmark clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -q -n 2

run: install
	$(BIN)/python -m experiments.toy_example

benchmark: install
	$(BIN)/python -m experiments.benchmark
	$(BIN)/python -m experiments.cost_scaling

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
