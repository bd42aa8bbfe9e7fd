"""Experiment 5, measuring: loss against heads kept, for several rankings.

Shape letters: L layers, H heads per layer; N = L H heads in all.

`measure` trains `experiment.seeds`, ranks the heads of each model on one
held-out batch by every score of `RANKINGS` (and two baselines), removes
them cumulatively and measures the loss on a second held-out batch; it
writes explorer.html of the first seed and returns the curves, their mean
and sample std over seeds, and each ranking against random order with two
heads removed.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.interp import explorer
from mha_jax.interp import interventions
from mha_jax.measure import runs
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import train_state

# One-shot rankings, each by a score of `interventions.head_importance`.
RANKINGS = ("zero_ablation", "mean_ablation", "resample_ablation",
            "taylor_estimate", "gradient_abs", "michel")
BASELINES = ("random", "most_important_first")


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train, prune; `{"heads_kept", "curves", "mean", "std",
  "two_removed_minus_random"}` with each curve `[N + 1]` losses (after 0,
  1, ..., N removals)."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  curves = {k: [] for k in RANKINGS + ("michel_iterative",) + BASELINES}
  for r in runs.seed_runs(config, workdir, e.seeds, reuse=reuse):
    # Two held-out batches per seed: one to rank the heads, one to
    # measure the pruned model on.
    rank_batch, test_batch = (held_out.analysis_batch(
        config, e.analysis_examples, seed=held_out.ANALYSIS_SEED + k + r.seed)
                              for k in (1000, 2000))
    if r.seed == e.seeds[0]:  # the heads being pruned, in a browser
      explorer.write_explorer(
          r.state.model(), test_batch, workdir / "explorer.html",
          loss=r.state.loss,
          init_model=train_state.create_train_state(r.config).model(),
          title=f"Pruning: the 2-layer induction model, seed {r.seed}")
    for k, curve in _prune_curves(config, r, rank_batch, test_batch).items():
      curves[k].append(curve)
  n_heads = len(curves["random"][0]) - 1
  kept = np.arange(n_heads, -1, -1)  # heads kept after k removals
  # Each ranking against random order, seed by seed, with two removed.
  vs_random = {k: stats.difference(np.asarray(curves[k])[:, 2],
                                   np.asarray(curves["random"])[:, 2])
               for k in curves if k != "random"}
  return {"heads_kept": kept, "curves": curves,
          "mean": {k: np.mean(v, 0) for k, v in curves.items()},
          "std": {k: _std(v) for k, v in curves.items()},
          "two_removed_minus_random": vs_random}


def _prune_curves(config, r, rank_batch, test_batch) -> dict:
  """One seed's loss curves `[N + 1]`, one per ranking and baseline."""
  model, loss = r.state.model(), r.state.loss
  imp = interventions.head_importance(model, rank_batch, loss)
  out = {}
  for k in RANKINGS:
    order = np.argsort(imp[k].ravel())  # least loss increase first
    out[k] = interventions.prune_curve(model, test_batch, loss, order)
  out["michel_iterative"] = interventions.iterative_prune_curve(
      model, rank_batch, test_batch, loss)[0]
  out["most_important_first"] = interventions.prune_curve(
      model, test_batch, loss, np.argsort(imp["zero_ablation"].ravel())[::-1])
  rng = np.random.default_rng(r.seed)
  n = imp["zero_ablation"].size
  out["random"] = np.mean([interventions.prune_curve(
      model, test_batch, loss, rng.permutation(n))
                           for _ in range(config.experiment.random_orders)], 0)
  return out


def _std(curves):
  """Sample std over seeds at each point; None with one seed."""
  v = np.asarray(curves)
  return v.std(0, ddof=1) if len(v) > 1 else None
