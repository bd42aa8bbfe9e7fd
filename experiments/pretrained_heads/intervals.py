"""Pretrained heads: intervals over documents.

Shape letters: N units (sentence pairs, triples).

The pairs and triples come from 231 documents, several from one document,
and pairs of one document share its vocabulary and style: they are not
independent draws. Every interval of the experiment therefore resamples
documents, each drawn document bringing all its units
(`bootstrap.group_weights`).
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import bootstrap


def summary(values, e, groups=None) -> dict:
  """{"mean", "std" (ddof 1, over units), "ci95" (over `groups`, the
  units' documents)} of `values [N, ...]`."""
  v = np.asarray(values, np.float64)
  return {"mean": v.mean(0), "std": v.std(0, ddof=1),
          "ci95": bootstrap.grouped_interval(v, resamples=e.resamples,
                                             seed=e.seed, groups=groups)}
