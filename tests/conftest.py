"""Shared test setup: strict numerics so shape bugs fail loudly."""

import jax

# Implicit rank promotion hides shape bugs (Equinox does the same).
jax.config.update("jax_numpy_rank_promotion", "raise")
