"""mha_jax.measure.stats against textbook values and scipy's own tests."""

import math

import numpy as np
import pytest
from scipy import stats as sp_stats

from mha_jax.measure import stats


def test_mean_std_is_the_sample_std():
  # [1, 2, 3, 6]: mean 3, squared deviations 4 + 1 + 0 + 9 = 14, / (4 - 1).
  assert stats.mean_std([1, 2, 3, 6]) == (3.0, math.sqrt(14 / 3))
  assert stats.mean_std([5.0]) == (5.0, None)  # no spread from one value


def test_t_interval_known_answer():
  # t_{0.975, 2} = 4.302652729911275 (tables); std of [1, 2, 3] is 1.
  lo, hi = stats.t_interval([1, 2, 3])
  half = 4.302652729911275 / math.sqrt(3)
  # scipy inverts the t CDF numerically, to about 1e-10 relative.
  np.testing.assert_allclose([lo, hi], [2 - half, 2 + half], rtol=1e-9)
  assert stats.t_interval([1.0]) is None
  s = stats.summary([1, 2, 3])
  assert s["values"] == [1.0, 2.0, 3.0] and s["n"] == 3
  np.testing.assert_allclose(s["ci95"], [lo, hi])


def test_difference_matches_scipy_welch():
  a = np.array([0.31, 0.29, 0.35, 0.30, 0.33])
  b = np.array([0.41, 0.38, 0.47])
  d = stats.difference(a, b)
  ref = sp_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
  np.testing.assert_allclose(d["ci95"], [ref.low, ref.high], rtol=1e-10)
  assert d["diff"] == pytest.approx(a.mean() - b.mean())
  assert d["excludes_0"] is True
  overlap = stats.difference([1.0, 2.0, 3.0], [1.5, 2.5, 2.0])
  assert overlap["excludes_0"] is False
  assert stats.difference([1.0], b)["ci95"] is None


def test_detectable_difference_tends_to_the_normal_formula():
  # Large n: (z_{0.975} + z_{0.8}) * std * sqrt(2 / n) = 2.8016 * ...
  z = 1.959963984540054 + 0.8416212335729143
  big = stats.detectable_difference(1.0, 100_000)
  assert big == pytest.approx(z * math.sqrt(2 / 100_000), rel=1e-4)
  # Few seeds: wider than the normal formula (heavier t tails).
  assert stats.detectable_difference(1.0, 3) > z * math.sqrt(2 / 3) * 1.2
  with pytest.raises(ValueError, match="`n` must be >= 2, got 1"):
    stats.detectable_difference(1.0, 1)


def test_detectable_difference_known_t_quantiles():
  # n = 3 per side: 2n - 2 = 4 degrees of freedom; t_{0.975, 4} =
  # 2.7764451 and t_{0.8, 4} = 0.9409646 (tables: 2.776, 0.941).
  np.testing.assert_allclose(
      stats.detectable_difference(2.0, 3),
      (2.7764451051977934 + 0.9409645772351816) * 2.0 * math.sqrt(2 / 3),
      rtol=1e-9)
  # n = 5, alpha 0.01, power 0.9: 8 degrees of freedom, t_{0.995, 8} =
  # 3.3553873 and t_{0.9, 8} = 1.3968153 (tables: 3.355, 1.397).
  np.testing.assert_allclose(
      stats.detectable_difference(1.0, 5, alpha=0.01, power=0.9),
      (3.355387331333395 + 1.3968153097438654) * math.sqrt(2 / 5),
      rtol=1e-9)


def test_bootstrap_interval_covers_like_the_t_interval():
  x = np.random.default_rng(0).normal(size=400)
  lo, hi = stats.bootstrap_interval(x)
  tlo, thi = stats.t_interval(x)
  assert lo < x.mean() < hi
  np.testing.assert_allclose([lo, hi], [tlo, thi], atol=0.02)
  # Rows are resampled whole: a per-example matrix keeps its columns paired.
  pairs = np.stack([x, x], axis=1)
  lo2, hi2 = stats.bootstrap_interval(pairs, lambda v: np.mean(v[:, 0]
                                                               - v[:, 1]))
  assert lo2 == hi2 == 0.0


@pytest.mark.parametrize("bad, match", [
    ([], "`values` is empty"), ([1.0, float("nan")], "non-finite")])
def test_bad_values_are_named(bad, match):
  with pytest.raises(ValueError, match=match):
    stats.summary(bad)
