"""Shared test setup: strict numerics so shape bugs fail loudly."""

import jax

# Implicit rank promotion hides shape bugs (Equinox does the same).
jax.config.update("jax_numpy_rank_promotion", "raise")

# The suite's time is mostly XLA compiling hundreds of tiny programs, and
# compiling without XLA's optimisation passes about halves the suite (8 min
# 47 s -> 4 min 45 s on 2 cores, same tests passing). The tests check
# values, gradients, shapes and errors, which the passes must not change;
# speed is measured by the benchmarks, and `mesh_check` and the experiments
# run the optimised programs end to end.
jax.config.update("jax_disable_most_optimizations", True)

import os

# Multi-device checks need 8 simulated CPU devices, which must be configured
# before JAX starts; tests/test_sharding.py runs them in a subprocess.
collect_ignore = []
if os.environ.get("MHA_JAX_MULTIDEVICE") != "1":
  collect_ignore.append("multidevice")
