# Thin wrappers around the README's commands. A fresh machine needs only Python.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test run experiments benchmark mesh_check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -q -n 2

# Experiment 1 (induction heads) end to end: about 1.5 minutes on 2 idle cores.
run: install
	$(BIN)/python -m experiments.induction --workdir=runs/induction
	@echo "Report: runs/induction/report.md (figures beside it)"

# All five head experiments, each writing runs/<name>/report.md.
EXPERIMENTS := induction two_offsets head_dim cross_attention pruning
experiments: install
	for e in $(EXPERIMENTS); do \
	  $(BIN)/python -m experiments.$$e --workdir=runs/$$e || exit 1; \
	done
	@echo "Reports: runs/{$$(echo $(EXPERIMENTS) | tr ' ' ',')}/report.md"

benchmark: install
	$(BIN)/python -m experiments.benchmark
	$(BIN)/python -m experiments.cost_scaling

# One config on one device and on a 2x4 simulated mesh: about 2 minutes.
mesh_check: install
	$(BIN)/python -m experiments.mesh_check --workdir=runs/mesh_check

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
