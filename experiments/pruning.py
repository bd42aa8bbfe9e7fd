r"""Experiment 5: loss against heads kept, for three importance rankings.

  python -m experiments.pruning --workdir=runs/pruning

Writes report.md, results.json and prune_curve.png into --workdir.
"""

from __future__ import annotations

import pathlib

import numpy as np

from configs import pruning as pruning_config
from experiments import common
from mha_jax import interventions
from mha_jax import plots

RANKINGS = ("zero_ablation", "mean_ablation", "taylor_estimate",
            "gradient_abs")


def run(config, workdir):
  e = config.experiment
  workdir = pathlib.Path(workdir)
  rank_batch = common.analysis_batch(config, e.analysis_examples, seed=111)
  test_batch = common.analysis_batch(config, e.analysis_examples, seed=222)
  curves = {k: [] for k in RANKINGS + ("random", "most_important_first")}
  for seed in e.seeds:
    c = common.variant(config, **{"train.seed": seed})
    state = common.train_run(c, workdir / f"seed{seed}")
    model = state.model()
    imp = interventions.head_importance(model, rank_batch, state.loss)
    for k in RANKINGS:
      order = np.argsort(imp[k].ravel())  # least loss increase first
      curves[k].append(interventions.prune_curve(model, test_batch,
                                                 state.loss, order))
    curves["most_important_first"].append(interventions.prune_curve(
        model, test_batch, state.loss,
        np.argsort(imp["zero_ablation"].ravel())[::-1]))
    rng = np.random.default_rng(seed)
    n = imp["zero_ablation"].size
    curves["random"].append(np.mean([interventions.prune_curve(
        model, test_batch, state.loss, rng.permutation(n))
                                     for _ in range(e.random_orders)], 0))
  n_heads = len(curves["random"][0]) - 1
  kept = np.arange(n_heads, -1, -1)  # heads kept after k removals
  stats = {k: (np.mean(v, 0), np.std(v, 0)) for k, v in curves.items()}
  plots.line_plot(kept, {k: stats[k] for k in curves},
                  xlabel="heads kept", ylabel="held-out loss",
                  title="Pruning the 2-layer induction model",
                  path=str(workdir / "prune_curve.png"))
  report = _report(config, stats, kept)
  common.write_outputs(workdir, {"heads_kept": kept, "curves": curves,
                                 "mean": {k: v[0] for k, v in stats.items()},
                                 "std": {k: v[1] for k, v in stats.items()}},
                       report)
  return stats


def _report(config, stats, kept):
  e = config.experiment
  header = ["heads kept"] + [k.replace("_", " ") for k in stats]
  rows = [[int(h)] + [common.fmt(stats[k][0][i], stats[k][1][i], digits=2)
                      for k in stats] for i, h in enumerate(kept)]
  full = stats["zero_ablation"][0][0]
  # Fewest heads each ranking keeps while the loss stays within 0.1 nats
  # of the full model.
  def fewest(k):
    ok = [int(h) for h, m in zip(kept, stats[k][0]) if m <= full + 0.1]
    return min(ok)
  budget = {k: fewest(k) for k in stats}
  at2 = {k: float(stats[k][0][2]) for k in stats}
  best2 = min(at2, key=at2.get)
  lines = [
      "# Experiment 5: head importance and pruning",
      "",
      "Command: `python -m experiments.pruning --workdir=runs/pruning` "
      "(config `configs/pruning.py`): the 2-layer induction model "
      f"({config.model.num_heads} heads per layer, "
      f"{config.train.num_steps} steps), seeds {list(e.seeds)}. Heads are "
      f"ranked on one held-out batch of {e.analysis_examples} sequences "
      "and removed cumulatively (gate 0), least important first; the loss "
      "is measured on a second held-out batch. 'random' averages "
      f"{e.random_orders} random orders per seed; 'most important first' "
      "removes by zero ablation in reverse. Mean ± std over seeds.",
      "",
      common.md_table(header, rows),
      "",
      "![prune_curve.png](prune_curve.png)",
      "",
      "Fewest heads kept with the loss within 0.1 nats of the full model "
      f"({full:.3f}): "
      + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in budget.items())
      + ".",
      "",
      "## What this shows",
      "",
      f"With {int(kept[2])} of {int(kept[0])} heads kept (two removed) the "
      "held-out loss is: "
      + ", ".join(f"{k.replace('_', ' ')} {at2[k]:.2f}" for k in at2)
      + f". Ranking by {best2.replace('_', ' ')} degrades slowest. The "
      "batch-gradient (Taylor) ranking is "
      + ("WORSE than random order: it removes heads the model needs, "
         "because at a trained optimum d loss / d gate is ~0 for every "
         "head and its sign is noise (see experiment 1)."
         if at2["taylor_estimate"] > at2["random"] else
         "better than random order here.")
      + " The per-example |gradient| ranking "
      + ("tracks the ablation rankings."
         if abs(at2["gradient_abs"] - at2["zero_ablation"]) < 0.1 else
         "departs from the ablation rankings.")
      + f" Even the best order keeps the loss within 0.1 nats only while "
      f"removing {int(kept[0]) - min(budget.values())} head(s): in this "
      "small model few heads are idle, so the circuit is spread over most "
      "heads rather than concentrated in one or two.",
  ]
  return "\n".join(lines)


if __name__ == "__main__":
  common.app_main(run, pruning_config.get_config, "pruning")
