"""Bootstrap intervals over prompts, and which heads a score separates
from the rest.

Shape letters: N prompts, R bootstrap resamples, M any trailing shape
(heads, roles).

One set of resampled prompt indices (`bootstrap.draws`) serves every
statistic of a run, so a difference of two statistics is paired: both are
computed on the same resampled prompts.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import bootstrap


def summary(values, idx) -> dict:
  """`{"mean", "ci95", "per_prompt"}` of `values [N]` (a scalar mean)."""
  v = np.asarray(values, np.float64)
  means = bootstrap.resampled_means(v, idx)
  return {"mean": float(v.mean()),
          "ci95": bootstrap.interval(means).tolist(),
          "per_prompt": v.tolist()}


def patched_fraction(patched, clean, corrupt, idx) -> dict:
  """How much of the clean-minus-corrupted logit difference a patch moves.

  `patched [N, M]` (every patch's per-prompt logit difference), `clean`,
  `corrupt [N]`. The fraction is (mean clean - mean patched) / (mean
  clean - mean corrupted): 1 = the patch alone takes the run all the way
  to the corrupted one (noising), computed on each resample as a ratio of
  means (a per-prompt ratio would divide by small differences). Returns
  `{"fraction" [M], "ci95" [M, 2], "samples" [R, M]}`.
  """
  p = bootstrap.resampled_means(patched, idx)  # [R, M]
  c = bootstrap.resampled_means(clean, idx)[:, None]
  x = bootstrap.resampled_means(corrupt, idx)[:, None]
  samples = (c - p) / (c - x)
  mp, mc, mx = (np.asarray(a, np.float64).mean(0)
                for a in (patched, clean, corrupt))
  return {"fraction": (mc - mp) / (mc - mx),
          "ci95": bootstrap.interval(samples), "samples": samples}


def separated(means, samples, *, k_max: int, floor: float = 0.0) -> dict:
  """The top heads of a score that an interval sets apart from the rest.

  `means [M]` (one per head) and their bootstrap `samples [R, M]` (the
  same resamples for every head). Heads are ranked by mean; the class is
  the top k (k <= k_max) for the LARGEST k at which the weakest member
  beats the strongest outsider: the paired 95% interval of (head k's
  score - head k+1's) lies above 0, and every member's own interval lies
  above `floor`. Returns
  `{"members": [indices], "k", "gap_ci95": [lo, hi] or None}`; no k
  passing gives no members (not resolved).
  """
  means = np.asarray(means, np.float64)
  samples = np.asarray(samples, np.float64)
  order = np.argsort(-means)
  best = {"members": [], "k": 0, "gap_ci95": None}
  for k in range(1, min(k_max, len(means) - 1) + 1):
    weakest, outsider = order[k - 1], order[k]
    gap = bootstrap.interval(samples[:, weakest] - samples[:, outsider])
    own = bootstrap.interval(samples[:, order[:k]])  # [k, 2]
    if gap[0] > 0 and np.all(own[:, 0] > floor):
      best = {"members": order[:k].tolist(), "k": k,
              "gap_ci95": gap.tolist()}
  return best
