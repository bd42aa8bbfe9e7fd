"""Pretrained heads: intervals over documents.

Shape letters: N units (sentence pairs, triples), R resamples, G groups
(documents).

The pairs and triples come from 231 documents, several from one document,
and pairs of one document share its vocabulary and style: they are not
independent draws. Every interval of the experiment therefore resamples
documents, each drawn document bringing all its units.
"""

from __future__ import annotations

import numpy as np


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


def bootstrap_means(values, *, resamples: int, seed: int, groups=None
                    ) -> np.ndarray:
  """`[..., 2]` percentile-bootstrap 95% intervals of the mean over axis 0
  of `values [N, ...]`, every entry on the same draws. With `groups [N]`
  (the document each unit comes from) whole groups are drawn, each bringing
  all its units: pairs of one document are not independent, and drawing
  them one by one would make the interval too narrow. Without, each unit
  is its own group."""
  v = np.asarray(values, np.float64)
  n = v.shape[0]
  weights, _ = group_weights(np.arange(n) if groups is None else groups,
                             resamples=resamples, seed=seed)
  # A resample's mean is (its counts of each group, per unit) @ values
  # over the units it holds.
  means = ((weights @ v.reshape(n, -1)) / weights.sum(1, keepdims=True)
           ).reshape((resamples,) + v.shape[1:])
  return np.moveaxis(np.quantile(means, [0.025, 0.975], axis=0), 0, -1)


def summary(values, e, groups=None) -> dict:
  """{"mean", "std" (ddof 1, over units), "ci95" (over `groups`, the
  units' documents)} of `values [N, ...]`."""
  v = np.asarray(values, np.float64)
  return {"mean": v.mean(0), "std": v.std(0, ddof=1),
          "ci95": bootstrap_means(v, resamples=e.resamples, seed=e.seed,
                                  groups=groups)}
