"""Shared test setup: strict numerics so shape bugs fail loudly."""

import jax

# Implicit rank promotion hides shape bugs (Equinox does the same).
jax.config.update("jax_numpy_rank_promotion", "raise")

import os

# Multi-device checks need 8 simulated CPU devices, which must be configured
# before JAX starts; tests/test_sharding.py runs them in a subprocess.
collect_ignore = []
if os.environ.get("MHA_JAX_MULTIDEVICE") != "1":
  collect_ignore.append("multidevice")
