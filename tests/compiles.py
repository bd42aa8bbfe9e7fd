"""Counting XLA compiles, for tests that pin when a call may compile: the
measuring experiments' counter (`mha_jax.measure.timing.count_compiles`)."""

from mha_jax.measure.timing import COMPILE_EVENT, count_compiles

__all__ = ["COMPILE_EVENT", "count_compiles"]
