"""Percentile bootstrap: the draws, resampled means and their intervals.

Shape letters: N units (examples, prompts, inputs, sentence pairs), R
resamples, G groups (documents), M any trailing shape.

Every bootstrap of the library and the experiments draws here, so two
intervals that should come from the same draws do, and a seed means the
same stream everywhere. Two ways to draw:

- by unit (`draws`): each resample draws N of the N units with
  replacement, `[R, N]` indices. One call serves every statistic of a
  run, so a difference of two statistics is paired (both on the same
  resampled units).
- by group (`group_weights`): where units come in groups that are not
  independent (the sentence pairs of one document share its vocabulary
  and style), each resample draws G of the G groups with replacement,
  each drawn group bringing all its units: `[R, N]` counts of each unit.

`resampled_means` and `weighted_means` are the mean over units on each
resample; `interval` is the percentile interval of any resampled
statistic. The seed is NumPy's `default_rng(seed)`, one generator per
call.
"""

from __future__ import annotations

import numpy as np


def draws(n: int, resamples: int, seed: int) -> np.ndarray:
  """`[R, N]` unit indices, each row N draws with replacement from
  `range(n)`."""
  if n < 2:
    raise ValueError(f"bootstrap.draws: a bootstrap needs at least 2 "
                     f"units, got n={n}")
  return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def group_weights(groups, *, resamples: int, seed: int
                  ) -> tuple[np.ndarray, int]:
  """`(weights [R, N], G)`: per resample, how many times each unit is
  drawn when whole groups are drawn with replacement (`groups [N]`, the
  group of each unit; G groups, G draws per resample)."""
  _, g = np.unique(np.asarray(groups), return_inverse=True)
  k = int(g.max()) + 1
  rng = np.random.default_rng(seed)
  counts = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)  # [R, G]
  return counts[:, g], k


def resampled_means(values, idx) -> np.ndarray:
  """`[R, ...]`: the mean over units of `values [N, ...]` in each
  resample `idx [R, N]` (`draws`)."""
  v = np.asarray(values, np.float64)
  return np.stack([v[i].mean(0) for i in idx])


def weighted_means(values, weights) -> np.ndarray:
  """`[R, ...]`: the mean over units of `values [N, ...]` in each
  resample given as counts `weights [R, N]` (`group_weights`)."""
  v = np.asarray(values, np.float64)
  n = v.shape[0]
  # A resample's mean is (its counts of each unit) @ values over the
  # units it holds.
  return ((weights @ v.reshape(n, -1)) / weights.sum(1, keepdims=True)
          ).reshape((len(weights),) + v.shape[1:])


def interval(samples, confidence: float = 0.95, *, axis: int = 0,
             levels: tuple[float, float] | None = None) -> np.ndarray:
  """`[..., 2]` percentile interval of resampled `samples` along `axis`
  (the resamples' axis), the other axes kept in order.

  The quantiles are (1 - confidence) / 2 and 1 - (1 - confidence) / 2.
  `levels` gives the two quantiles instead: the intervals written as
  quantiles (0.025, 0.975) keep them, since (1 - 0.95) / 2 is 2e-17
  above 0.025 and would move their last bits.
  """
  s = np.asarray(samples, np.float64)
  if levels is None:
    tail = (1 - confidence) / 2
    levels = (tail, 1 - tail)
  return np.stack([np.quantile(s, q, axis=axis) for q in levels], -1)


def grouped_interval(values, *, resamples: int, seed: int, groups=None,
                     levels: tuple[float, float] = (0.025, 0.975)
                     ) -> np.ndarray:
  """`[..., 2]` percentile intervals of the mean over axis 0 of `values
  [N, ...]`, every entry on the same draws. With `groups [N]` (the
  document each unit comes from) whole groups are drawn, each bringing
  all its units: units of one document are not independent, and drawing
  them one by one would make the interval too narrow. Without, each unit
  is its own group."""
  v = np.asarray(values, np.float64)
  weights, _ = group_weights(
      np.arange(v.shape[0]) if groups is None else groups,
      resamples=resamples, seed=seed)
  return interval(weighted_means(v, weights), levels=levels)
