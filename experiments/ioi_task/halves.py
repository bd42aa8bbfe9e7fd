"""The selection and held-out halves of a prompt set, and intervals over
prompts and over templates.

Shape letters: N prompts, R resamples, M any trailing shape.

Prompts of one template share all their words but the names, so they
are not independent draws of "an IOI sentence": an interval over prompts
says how sure the mean is for these eight templates, one over templates
(whole templates drawn with replacement, `bootstrap.group_weights`) how
far it would move with other templates of the same kind. Both are given.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import bootstrap


def split(template, order, *, share: float, seed: int):
  """`(selection, held_out)` sorted prompt indices: inside each template
  and order, a seeded shuffle puts round(share * count) prompts in the
  selection half and the rest in the held-out half, so both halves hold
  every template and both orders alike."""
  if not 0 < share < 1:
    raise ValueError(f"halves.split: `share` must lie strictly between 0 "
                     f"and 1, got {share!r}")
  template, order = np.asarray(template), np.asarray(order)
  rng = np.random.default_rng(seed)
  sel, held = [], []
  for t in np.unique(template):
    for o in np.unique(order):
      cell = np.flatnonzero((template == t) & (order == o))
      cell = rng.permutation(cell)
      k = int(round(share * len(cell)))
      if k == 0 or k == len(cell):
        raise ValueError(f"halves.split: template {t}, order {o} has "
                         f"{len(cell)} prompts; `share`={share} leaves a "
                         "half without any")
      sel += cell[:k].tolist()
      held += cell[k:].tolist()
  return np.sort(sel), np.sort(held)


class Draws:
  """One prompt set's resamples: `idx [R, N]` prompt draws and `weights
  [R, N]` template draws, shared by every statistic of the set so that
  differences are paired."""

  def __init__(self, template, *, resamples: int, seed: int):
    template = np.asarray(template)
    self.idx = bootstrap.draws(len(template), resamples, seed)
    self.weights, _ = bootstrap.group_weights(template, resamples=resamples,
                                              seed=seed + 1)

  def ci(self, values) -> np.ndarray:
    """`[..., 2]` interval over prompts of the mean of `values [N, ...]`."""
    return bootstrap.interval(bootstrap.resampled_means(values, self.idx))

  def ci_templates(self, values) -> np.ndarray:
    """`[..., 2]` interval over templates of the mean of `values`."""
    return bootstrap.interval(bootstrap.weighted_means(values, self.weights))

  def summary(self, values) -> dict:
    """`{"mean", "ci95", "ci95_templates", "per_prompt"}` of `values [N]`
    (or `[N, M]`, one of each per column)."""
    v = np.asarray(values, np.float64)
    return {"mean": v.mean(0), "ci95": self.ci(v),
            "ci95_templates": self.ci_templates(v), "per_prompt": v}


def by_template(values, template) -> list:
  """The mean of `values [N]` over each template's prompts, in template
  order."""
  v, template = np.asarray(values, np.float64), np.asarray(template)
  return [float(v[template == t].mean()) for t in np.unique(template)]
