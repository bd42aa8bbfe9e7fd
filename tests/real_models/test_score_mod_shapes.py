"""User rules against the float64 reference over many random shapes, with
hypothesis (the heavy tier: MHA_JAX_REAL_MODELS=1, as `make test-real`
sets it). `make test` checks one seeded shape per rule
(tests/core/test_score_mod.py); here hypothesis draws 6 per rule,
from one query up, including the edge shapes it tries first (one query,
one key), each compiling every path: about 2 minutes. And the span walk
(tests/core/test_span_walk.py) on 8 random windows and shapes."""

import os

import hypothesis
from hypothesis import strategies as st
import pytest

from mha_jax.core import block_mask
from mha_jax.core.kernels import flash
from tests.core import test_score_mod as score_mod_tests
from tests.core import test_span_walk

pytestmark = pytest.mark.skipif(
    os.environ.get("MHA_JAX_REAL_MODELS") != "1",
    reason="heavy tier (MHA_JAX_REAL_MODELS=1): six compiled shapes per "
    "rule")


@pytest.mark.parametrize("name", score_mod_tests.RULES)
@hypothesis.settings(max_examples=6, deadline=None, derandomize=True,
                     suppress_health_check=[
                         hypothesis.HealthCheck.too_slow])
@hypothesis.given(b=st.integers(1, 2), tq=st.integers(1, 13),
                  extra=st.integers(0, 6),
                  heads=st.sampled_from([(2, 1), (2, 2), (4, 2)]),
                  seed=st.integers(0, 99))
def test_rule_matches_float64_reference_on_random_shapes(name, b, tq, extra,
                                                         heads, seed):
  score_mod_tests._check_rule(name, b, tq, tq + extra, heads[0], heads[1],
                              seed)


@hypothesis.settings(max_examples=8, deadline=None, derandomize=True,
                     suppress_health_check=[
                         hypothesis.HealthCheck.too_slow,
                         hypothesis.HealthCheck.filter_too_much])
@hypothesis.given(b=st.integers(1, 2), t=st.integers(9, 40),
                  window=st.integers(1, 9),
                  heads=st.sampled_from([(2, 1), (2, 2), (4, 2)]),
                  sinks=st.booleans(), seed=st.integers(0, 99))
def test_span_walk_matches_float64_reference_on_random_shapes(
    b, t, window, heads, sinks, seed):
  # A causal window of `window` keys on blocks of 4, where banded enough
  # for the span walk (hypothesis.assume), against the float64 reference.
  keep = lambda qi, ki: (ki <= qi) & (qi - ki < window)
  bm = block_mask.create(lambda b, h, qi, ki: keep(qi, ki), None, None, t,
                         t, 4, 4)
  hypothesis.assume(flash.span_walk("cpu", bm, b * heads[0]) is not None)
  test_span_walk.check_against_reference(b, t, heads[0], heads[1], keep,
                                         sinks, seed)
