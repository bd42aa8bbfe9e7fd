"""Summaries over seeds and examples that a reviewer can check.

The experiments train a handful of seeds, so every spread here is the
sample standard deviation (ddof = 1) and every interval accounts for the
small count (Student's t), or resamples examples (bootstrap) where the
unit is an example rather than a training run. With one value there is no
spread: `std` is None and the interval is None, never a made-up 0.

`summary(values)` is the record an experiment writes for each quantity:
every per-seed value, the count, the mean, the sample std and a 95% t
interval of the mean. `difference(a, b)` compares two settings (Welch's t
interval of mean(a) - mean(b)); `detectable_difference(std, n)` is the
smallest true difference that n seeds per setting would detect with 80%
power at the 5% level, which bounds what "no measurable difference" can
mean.
"""

from __future__ import annotations

from collections.abc import Callable
import math

import numpy as np
from scipy import stats as sp_stats

from mha_jax.measure import bootstrap


def _values(values, fn: str) -> np.ndarray:
  v = np.asarray(values, np.float64).reshape(-1)
  if v.size == 0:
    raise ValueError(f"{fn}: `values` is empty; expected at least one value")
  if not np.all(np.isfinite(v)):
    raise ValueError(f"{fn}: `values` holds non-finite numbers: {v.tolist()}")
  return v


def mean_std(values) -> tuple[float, float | None]:
  """`(mean, sample std)` with ddof = 1; std is None for a single value."""
  v = _values(values, "mean_std")
  return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None)


def t_interval(values, confidence: float = 0.95
               ) -> tuple[float, float] | None:
  """Student-t interval of the mean; None for a single value."""
  v = _values(values, "t_interval")
  if v.size < 2:
    return None
  half = (sp_stats.t.ppf(0.5 + confidence / 2, v.size - 1)
          * v.std(ddof=1) / math.sqrt(v.size))
  return float(v.mean() - half), float(v.mean() + half)


def summary(values, confidence: float = 0.95) -> dict:
  """Every value, n, mean, sample std and the t interval of the mean."""
  v = _values(values, "summary")
  mean, std = mean_std(v)
  ci = t_interval(v, confidence)
  return {"values": v.tolist(), "n": int(v.size), "mean": mean, "std": std,
          "ci95": None if ci is None else list(ci)}


def difference(a, b, confidence: float = 0.95) -> dict:
  """mean(a) - mean(b) with Welch's t interval (unequal variances).

  None for the interval when either side has a single value. `excludes_0`
  says whether the interval lies on one side of zero.
  """
  a, b = _values(a, "difference"), _values(b, "difference")
  diff = float(a.mean() - b.mean())
  if a.size < 2 or b.size < 2:
    return {"diff": diff, "ci95": None, "excludes_0": None}
  va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
  se = math.sqrt(va + vb)
  if se == 0.0:
    return {"diff": diff, "ci95": [diff, diff], "excludes_0": diff != 0.0}
  df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
  half = float(sp_stats.t.ppf(0.5 + confidence / 2, df) * se)
  lo, hi = diff - half, diff + half
  return {"diff": diff, "ci95": [lo, hi], "excludes_0": lo > 0 or hi < 0}


def detectable_difference(std: float, n: int, *, alpha: float = 0.05,
                          power: float = 0.8) -> float:
  """Smallest true difference a two-sided t-test on n vs n values detects.

  The normal-theory formula with t quantiles, (t_{1-alpha/2} + t_{power})
  * std * sqrt(2 / n) on 2n - 2 degrees of freedom: a difference below it
  is likely to go unseen, so "no difference" claims nothing below it.
  """
  if n < 2:
    raise ValueError(f"detectable_difference: `n` must be >= 2, got {n}")
  df = 2 * n - 2
  return float((sp_stats.t.ppf(1 - alpha / 2, df) + sp_stats.t.ppf(power, df))
               * std * math.sqrt(2.0 / n))


def bootstrap_interval(values, statistic: Callable[[np.ndarray], float]
                       = np.mean, *, confidence: float = 0.95,
                       resamples: int = 2000, seed: int = 0
                       ) -> tuple[float, float]:
  """Percentile bootstrap interval of `statistic` over `values`' first axis.

  For quantities averaged over examples (a head's score on each held-out
  sequence): the interval is over the examples drawn, not over seeds.
  The draws are `bootstrap.draws`.
  """
  v = np.asarray(values, np.float64)
  if v.shape[0] < 2:
    raise ValueError("bootstrap_interval: `values` needs at least 2 "
                     f"examples along axis 0, got shape {v.shape}")
  idx = bootstrap.draws(v.shape[0], resamples, seed)
  lo, hi = bootstrap.interval([statistic(v[i]) for i in idx], confidence)
  return float(lo), float(hi)
