"""How far attribution patching can stand in for activation patching.

Shape letters: N patches (heads, or heads x settings), B examples, S
sets of paths.

Attribution patching is a first-order estimate of activation patching
(`patching`); one Pearson r over heads of several layers mostly measures
how the layers differ. `calibration` answers the two questions a reader
has, within one group of patches (one layer, say): does the estimate
RANK the patches as activation patching does (r, top-k agreement), and
does it get their SIZE (the least-squares slope of the estimate on the
real patch: 1 where sizes are right, near 0 where the estimate misses
what patching moves). `pooled_fractions` turns per-example metric sums
into patching fractions, and `bootstrap_fractions` resamples examples.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import bootstrap


def _pair(actual, estimate):
  a = np.asarray(actual, np.float64).reshape(-1)
  e = np.asarray(estimate, np.float64).reshape(-1)
  if a.shape != e.shape or a.size < 2:
    raise ValueError(f"calibration: `actual` and `estimate` must hold the "
                     f"same number (>= 2) of patches, got {a.size} and "
                     f"{e.size}")
  return a, e


def top_k_agreement(actual, estimate, k: int) -> float:
  """Share of the k patches largest in |actual| that are also among the k
  largest in |estimate| (1: the same top k)."""
  a, e = _pair(actual, estimate)
  if not 1 <= k <= a.size:
    raise ValueError(f"top_k_agreement: `k` must be in [1, {a.size}], "
                     f"got {k}")
  top = lambda x: set(np.argsort(-np.abs(x), kind="stable")[:k].tolist())
  return len(top(a) & top(e)) / k


def calibration(actual, estimate, *, k: int = 1) -> dict:
  """`{"slope", "pearson", "top_k", "k", "n"}` of `estimate` against
  `actual` (`[N]` each, or any shape with N entries).

  slope: least squares of estimate on actual (with an intercept); None
  where actual does not vary. pearson: None where either does not vary.
  """
  a, e = _pair(actual, estimate)
  # np.ptp, not the variance: equal values can have a variance of 1e-33.
  spread_a, spread_e = np.ptp(a) > 0, np.ptp(e) > 0
  slope = (float(np.cov(a, e, bias=True)[0, 1] / a.var()) if spread_a
           else None)
  r = float(np.corrcoef(a, e)[0, 1]) if spread_a and spread_e else None
  return {"slope": slope, "pearson": r, "top_k": top_k_agreement(a, e, k),
          "k": k, "n": int(a.size)}


def _fraction(m, m_c, m_x, noising):
  return ((m_c - m) if noising else (m - m_x)) / (m_c - m_x)


def pooled_fractions(patched, clean, corrupted, noising: bool):
  """Patching fractions from per-example metric sums.

  `patched [S, B]`, `clean [B]`, `corrupted [B]`: each example's summed
  metric (`patching.per_example_logprob`) in the patched, clean and
  corrupted runs. The pooled metric is their sum over the total count of
  scored predictions, as the patching functions score it; that count
  cancels in the fraction. Returns `[S]`: (m - m_x) / (m_c - m_x)
  denoising, (m_c - m) / (m_c - m_x) noising.
  """
  return _fraction(np.sum(patched, axis=-1), np.sum(clean),
                   np.sum(corrupted), noising)


def bootstrap_fractions(patched, clean, corrupted, noising: bool, *,
                        resamples: int = 1000, seed: int = 0,
                        confidence: float = 0.95) -> np.ndarray:
  """`[S, 2]` percentile-bootstrap intervals of `pooled_fractions` over
  the B examples (`bootstrap.draws`, as `stats.bootstrap_interval`
  draws; every set uses the same draws, and the normalisation is
  recomputed on each)."""
  patched = np.asarray(patched, np.float64)
  b = patched.shape[-1]
  if b < 2:
    raise ValueError(f"bootstrap_fractions: need at least 2 examples, got "
                     f"{b}")
  idx = bootstrap.draws(b, resamples, seed)
  frac = _fraction(patched[:, idx].sum(-1), np.asarray(clean)[idx].sum(-1),
                   np.asarray(corrupted)[idx].sum(-1), noising)  # [S, R]
  return bootstrap.interval(frac, confidence, axis=-1)
