"""The one bootstrap: its draws, resampled means and intervals.

Known answers: the streams NumPy's `default_rng(seed)` gives (every
interval committed under docs/results was drawn from them, so they must
not change), intervals of constant values (a point), and two documents
whose whole-document draws can reach what unit draws cannot.
"""

from __future__ import annotations

import numpy as np
import pytest

from mha_jax.measure import bootstrap


def test_draws_are_the_seeds_stream():
  np.testing.assert_array_equal(
      bootstrap.draws(5, 7, 3),
      np.random.default_rng(3).integers(0, 5, size=(7, 5)))
  with pytest.raises(ValueError, match=r"bootstrap.draws: a bootstrap needs "
                     r"at least 2 units, got n=1"):
    bootstrap.draws(1, 10, 0)


def test_group_weights_are_the_seeds_multinomial():
  weights, g = bootstrap.group_weights(["b", "a", "b"], resamples=4, seed=2)
  counts = np.random.default_rng(2).multinomial(2, [0.5, 0.5], size=4)
  assert g == 2
  np.testing.assert_array_equal(weights, counts[:, [1, 0, 1]])


def test_resampled_means_equal_the_vectorised_mean_bit_for_bit():
  """The surveys took `values[idx].mean(1)`; the loop gives the same
  bits, so their intervals did not move when they came here."""
  rng = np.random.default_rng(0)
  v = rng.uniform(size=(37, 4, 9))
  idx = bootstrap.draws(37, 300, 5)
  np.testing.assert_array_equal(bootstrap.resampled_means(v, idx),
                                v[idx].mean(1))


def test_interval_levels_and_axis():
  s = np.arange(101.0)[:, None] * [1.0, 2.0]  # [R, 2]
  np.testing.assert_allclose(bootstrap.interval(s), [[2.5, 97.5],
                                                     [5.0, 195.0]])
  np.testing.assert_array_equal(bootstrap.interval(s.T, axis=-1),
                                bootstrap.interval(s))
  # (1 - 0.95) / 2 is not 0.025 in floating point; `levels` keeps the
  # quantiles an interval was written with.
  lo = bootstrap.interval(s, levels=(0.025, 0.975))[0, 0]
  assert lo == np.quantile(s[:, 0], 0.025)


def test_grouped_interval_covers_the_mean_and_shrinks_with_n():
  rng = np.random.default_rng(0)
  small, large = rng.normal(size=(20, 3)), rng.normal(size=(2000, 3))
  width = lambda v: np.diff(bootstrap.grouped_interval(v, resamples=500,
                                                       seed=0))
  for v in (small, large):
    ci = bootstrap.grouped_interval(v, resamples=500, seed=0)
    assert ci.shape == (3, 2)
    assert np.all(ci[:, 0] < v.mean(0)) and np.all(v.mean(0) < ci[:, 1])
  # Standard error 1/sqrt(n): 10x the width at 100x fewer units.
  ratio = float(np.mean(width(small) / width(large)))
  assert 6 < ratio < 14
  const = bootstrap.grouped_interval(np.ones((5, 2)), resamples=50, seed=0)
  np.testing.assert_allclose(const, 1.0)


def test_grouped_interval_draws_whole_documents():
  """Two documents: three pairs scoring 1 and one scoring 5. Drawing both
  documents' pairs whole, a resample's mean is 1 (the first twice), 5
  (the second twice) or (3 * 1 + 5) / 4 = 2 (each once), so the interval
  over 1000 resamples runs from 1 to 5; drawing pairs one by one it could
  not reach 5 (the four draws would all have to be the one pair)."""
  v = np.asarray([1.0, 1.0, 1.0, 5.0])
  ci = bootstrap.grouped_interval(v, resamples=1000, seed=0,
                                  groups=["a", "a", "a", "b"])
  np.testing.assert_allclose(ci, [1.0, 5.0])
  assert bootstrap.grouped_interval(v, resamples=1000, seed=0)[1] < 5.0
  # One unit per group is the bootstrap over units, draw for draw.
  x = np.random.default_rng(1).normal(size=(30, 2))
  np.testing.assert_array_equal(
      bootstrap.grouped_interval(x, resamples=200, seed=3,
                                 groups=np.arange(30)),
      bootstrap.grouped_interval(x, resamples=200, seed=3))
