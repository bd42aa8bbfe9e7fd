"""Shared test setup: strict numerics so shape bugs fail loudly."""

import os

# Most of the suite's time is XLA compiling small programs. Its CPU
# backend's older loop emitters compile them about 40% faster than the
# default fusion emitters (30 distinct jax.random programs: 8.4 -> 4.9 s;
# 7 small gradients: 1.3 -> 0.8 s), and the programs they emit compute the
# same operations. Set before JAX creates its CPU client; subprocesses
# (the multidevice suite, experiment workers) inherit it.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false"]
).strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# Implicit rank promotion hides shape bugs (Equinox does the same).
jax.config.update("jax_numpy_rank_promotion", "raise")

# The suite's time is mostly XLA compiling hundreds of tiny programs, and
# compiling without XLA's optimisation passes about halves the suite (8 min
# 47 s -> 4 min 45 s on 2 cores, same tests passing). The tests check
# values, gradients, shapes and errors, which the passes must not change;
# speed is measured by the benchmarks, and `mesh_check` and the experiments
# run the optimised programs end to end.
jax.config.update("jax_disable_most_optimizations", True)

# Multi-device checks need 8 simulated CPU devices, which must be configured
# before JAX starts; tests/parallel/test_sharding.py runs them in a subprocess.
collect_ignore = []
if os.environ.get("MHA_JAX_MULTIDEVICE") != "1":
  collect_ignore.append("parallel/multidevice")
# The real GGUF models (SmolLM2-135M, Gemma 3 270M) against transformers:
# a tier of its own, `make test-real`, which .ci/run also runs.
if os.environ.get("MHA_JAX_REAL_MODELS") != "1":
  collect_ignore.append("real_models")
