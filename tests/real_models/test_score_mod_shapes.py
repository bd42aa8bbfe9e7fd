"""User rules against the float64 reference over many random shapes, with
hypothesis (the heavy tier: MHA_JAX_REAL_MODELS=1, as `make test-real`
sets it). `make test` checks one seeded shape per rule
(tests/core/test_score_mod.py); here hypothesis draws 6 per rule,
from one query up, including the edge shapes it tries first (one query,
one key), each compiling every path: about 2 minutes."""

import os

import hypothesis
from hypothesis import strategies as st
import pytest

from tests.core import test_score_mod as score_mod_tests

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
