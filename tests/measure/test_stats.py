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


# Gaps the mutation run of this module found (docs/testing.md): a spread
# other than 1, samples of exactly two, the constant-sample branch of the
# difference, an interval above 0, and the bootstrap's draws and tails.


def test_t_interval_scales_with_the_std_and_starts_at_two_values():
  # [2, 4, 6]: std 2, so the half-width is twice that of [1, 2, 3].
  lo, hi = stats.t_interval([2, 4, 6])
  half = 4.302652729911275 * 2 / math.sqrt(3)
  np.testing.assert_allclose([lo, hi], [4 - half, 4 + half], rtol=1e-9)
  # Two values: t_{0.975, 1} = 12.7062047 (tables 12.706), std sqrt(2).
  lo, hi = stats.t_interval([1, 3])
  half = 12.706204736174694 * math.sqrt(2) / math.sqrt(2)
  np.testing.assert_allclose([lo, hi], [2 - half, 2 + half], rtol=1e-9)
  assert stats.mean_std([1, 3]) == (2.0, math.sqrt(2))


def test_difference_of_two_values_each_and_of_one():
  d = stats.difference([1.0, 3.0], [0.0, 1.0])
  ref = sp_stats.ttest_ind([1.0, 3.0], [0.0, 1.0],
                           equal_var=False).confidence_interval(0.95)
  np.testing.assert_allclose(d["ci95"], [ref.low, ref.high], rtol=1e-10)
  assert stats.difference([1.0, 2.0, 3.0], [1.0])["ci95"] is None


def test_difference_of_constant_samples():
  # No spread: the interval is the difference itself.
  d = stats.difference([2.0, 2.0, 2.0], [1.0, 1.0])
  assert d == {"diff": 1.0, "ci95": [1.0, 1.0], "excludes_0": True}
  same = stats.difference([1.0, 1.0], [1.0, 1.0, 1.0])
  assert same == {"diff": 0.0, "ci95": [0.0, 0.0], "excludes_0": False}


def test_difference_excludes_zero_from_either_side():
  a = np.array([0.31, 0.29, 0.35, 0.30, 0.33])
  b = np.array([0.41, 0.38, 0.47])
  up = stats.difference(b, a)  # interval inside (0, 1)
  assert 0 < up["ci95"][0] < 1 and up["excludes_0"] is True
  # An interval inside (-1, 1) around 0 does not exclude it.
  near = stats.difference([0.30, 0.31, 0.32], [0.305, 0.315, 0.31])
  assert -1 < near["ci95"][0] < 0 < near["ci95"][1] < 1
  assert near["excludes_0"] is False


def test_detectable_difference_of_two_per_side():
  # 2 degrees of freedom: t_{0.975, 2} = 4.3026527, t_{0.8, 2} = 1.0606602.
  np.testing.assert_allclose(
      stats.detectable_difference(1.0, 2),
      (4.302652729749462 + 1.0606601717798214) * math.sqrt(2 / 2),
      rtol=1e-9)


def test_bootstrap_draws_every_row_and_its_tails_set_the_confidence():
  # The bootstrap means of [0, 1, 2] are symmetric about 1 and equal to 1
  # with probability 7/27, so the central 2% of them is exactly 1. Drawing
  # rows from a wrong range (never row 0, or the last row twice as often)
  # moves it.
  assert stats.bootstrap_interval([0.0, 1.0, 2.0], confidence=0.02) == (
      1.0, 1.0)
  # On 2000 normal values the 95% bootstrap interval has the width of the
  # t interval (within 5%; a 90% or 97% one is 16% or 9% off).
  x = np.random.default_rng(1).normal(size=2000)
  lo, hi = stats.bootstrap_interval(x, resamples=20000)
  tlo, thi = stats.t_interval(x)
  assert (hi - lo) / (thi - tlo) == pytest.approx(1.0, abs=0.05)
  # A [3, 2] matrix is resampled by its 3 rows (3 draws from rows 0-2),
  # not by its 2 columns: the central sum of the first column is 3.
  assert stats.bootstrap_interval([[0.0, 5.0], [1.0, 5.0], [2.0, 5.0]],
                                  lambda v: v[:, 0].sum(),
                                  confidence=0.02) == (3.0, 3.0)
  # Two rows are enough; one row of a matrix is not.
  assert stats.bootstrap_interval([[0.0, 1.0], [2.0, 3.0]],
                                  lambda v: v[:, 0].mean())[0] == 0.0
  with pytest.raises(ValueError, match="at least 2 examples along axis 0"):
    stats.bootstrap_interval([[0.0, 1.0, 2.0]])
