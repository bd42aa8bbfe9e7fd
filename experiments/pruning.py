r"""Experiment 5: loss against heads kept, for three importance rankings.

  python -m experiments.pruning --workdir=runs/pruning

Writes report.md, results.json and prune_curve.png into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from experiments import common
from mha_jax import held_out
from mha_jax import interventions
from mha_jax import plots
from mha_jax import runs

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/pruning.py", "The experiment's config file; override "
    "fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/pruning", "Output folder: report.md, results.json, "
    "prune_curve.png and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")

RANKINGS = ("zero_ablation", "mean_ablation", "taylor_estimate",
            "gradient_abs")


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train, prune and write the report; returns what results.json holds."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  rank_batch = held_out.analysis_batch(config, e.analysis_examples, seed=111)
  test_batch = held_out.analysis_batch(config, e.analysis_examples, seed=222)
  curves = {k: [] for k in RANKINGS + ("random", "most_important_first")}
  for r in runs.seed_runs(config, workdir, e.seeds, reuse=reuse_runs):
    seed, state = r.seed, r.state
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
  return common.write_outputs(
      workdir, {"heads_kept": kept, "curves": curves,
                "mean": {k: v[0] for k, v in stats.items()},
                "std": {k: v[1] for k, v in stats.items()}},
      _report(config, stats, kept))


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


def main(argv):
  common.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
