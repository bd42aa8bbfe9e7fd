"""The head survey: each score per head with bootstrap intervals over
inputs, beside its floors, and which heads stand out.

Shape letters: N inputs, L layers, H heads, R bootstrap resamples.

Every function takes per-input scores `[N, L, H]` (one input's mean over
its counted query rows) and works in NumPy. `head_intervals` gives each
head's mean and percentile bootstrap interval over the inputs (one draw
of inputs per resample, `bootstrap.draws`, shared by all heads, so that
the intervals of two heads come from the same resampled input sets).
`sink_share` is Gu et al. (2025)'s Sink_k^eps for k = 0: the share of
the L H heads whose mean weight on the first token exceeds eps.
`standout` compares the top heads with their floors and with the other
heads.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import bootstrap

# Which inputs each reported score is read on, and whether a high or a
# low value marks the head (low entropy: a sharp head).
SCORES = {"previous": ("prose", "high"), "induction": ("repeated", "high"),
          "duplicate": ("repeated", "high"), "first": ("prose", "high"),
          "local": ("prose", "high"), "long": ("prose", "high"),
          "entropy": ("prose", "low")}


def head_intervals(values, idx, confidence: float = 0.95) -> dict:
  """{"mean", "lo", "hi"}, each `[L, H]`, of `values [N, L, H]` over the
  resampled input sets `idx [R, N]` (`bootstrap.draws`)."""
  v = np.asarray(values, np.float64)
  ci = bootstrap.interval(bootstrap.resampled_means(v, idx), confidence)
  return {"mean": v.mean(0), "lo": ci[..., 0], "hi": ci[..., 1]}


def sink_share(first, idx, eps: float, confidence: float = 0.95) -> dict:
  """Sink_0^eps: the share of heads whose mean first-token weight over the
  inputs exceeds `eps`, with its bootstrap interval; {"share", "lo",
  "hi", "heads": `[L, H]` bool}."""
  v = np.asarray(first, np.float64)
  heads = v.mean(0) > eps
  shares = (bootstrap.resampled_means(v, idx) > eps).mean((1, 2))  # [R]
  lo, hi = bootstrap.interval(shares, confidence)
  return {"share": float(heads.mean()), "lo": float(lo), "hi": float(hi),
          "heads": heads}


def floor_of(head_means, direction: str) -> float:
  """The most extreme head of a floor model (its highest mean, or lowest
  for a score where low marks the head): what a trained head must pass."""
  m = np.asarray(head_means)
  return float(m.max() if direction == "high" else m.min())


def ranked(head_means, direction: str) -> np.ndarray:
  """`[L H, 2]` (layer, head) pairs, the most marked first."""
  m = np.asarray(head_means)
  order = np.argsort(-m.ravel() if direction == "high" else m.ravel(),
                     kind="stable")
  return np.stack(np.unravel_index(order, m.shape), 1)


def ranks(head_means, direction: str) -> np.ndarray:
  """`[L, H]` each head's rank, 1 the most marked."""
  m = np.asarray(head_means)
  out = np.empty(m.size, np.int64)
  out[np.ravel_multi_index(ranked(m, direction).T, m.shape)] = np.arange(
      1, m.size + 1)
  return out.reshape(m.shape)


def standout(iv: dict, floor: float, direction: str, k: int) -> dict:
  """How the heads of one score compare with `floor` and with each
  other: {"above_floor": heads whose interval lies wholly past the floor,
  "top": the k most marked (layer, head), "separated": whether the
  weakest bound of the top k lies past the strongest bound of every
  other head (the group stands apart from the rest)}."""
  sign = 1.0 if direction == "high" else -1.0
  lo, hi = (iv["lo"], iv["hi"]) if sign > 0 else (-iv["hi"], -iv["lo"])
  order = ranked(iv["mean"], direction)
  top = [tuple(int(x) for x in p) for p in order[:k]]
  rest = order[k:]
  top_lo = min(lo[l, h] for l, h in top)
  rest_hi = max((hi[l, h] for l, h in rest), default=-np.inf)
  return {"above_floor": int((lo > sign * floor).sum()),
          "top": top, "separated": bool(top_lo > rest_hi)}
