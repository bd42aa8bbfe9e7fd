r"""Experiment 2: can one softmax deliver two positions? Sweep the head count.

  python -m experiments.two_offsets --workdir=runs/two_offsets

Continuous two-offset retrieval (target [u_{t-1}; u_{t-3}]) with one
attention-only layer at fixed d_model for every h in the config, plus one
head 4x wider; then the token version (class of (x_{t-1}, x_{t-3})).
Writes report.md, results.json and PNG figures into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments import common
from mha_jax import plots
from mha_jax import two_offsets

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/two_offsets.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/two_offsets", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")


def _stat(runs, key):
  return common.mean_std([r[key] for r in runs])


def _best(runs, key):
  """Mean ± std over seeds of the largest per-head value of `key`."""
  return common.mean_std([r[key].max() for r in runs])


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train the sweeps and write the report; returns what results.json holds."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  cont, target_var = two_offsets.sweep(
      config, workdir, "two_offset_continuous",
      two_offsets.settings(config, e.heads, wide=True), reuse=reuse_runs)
  tok, _ = two_offsets.sweep(
      config, workdir, "two_offset_token",
      two_offsets.settings(config, e.token_heads, wide=False),
      reuse=reuse_runs)

  labels = list(cont)
  nmse = [_stat(cont[k], "nmse") for k in labels]
  plots.setting_bars(labels, [m for m, _ in nmse], [s for _, s in nmse],
                     ylabel="normalised MSE", logy=True,
                     title="Two-offset retrieval, one layer, d_model "
                     f"{config.model.d_model}",
                     path=str(workdir / "nmse_vs_heads.png"))
  # Heatmaps: the single head next to a multi-head model, same example.
  show = [labels[0]] + [k for k in labels if k in ("h=2", "h=4")][:1]
  grid, titles = [], []
  for k in show:
    r = cont[k][0]
    grid.append(r["weights_example"])
    titles.append([f"{k} head {h + 1}: off1 {r['offset1'][h]:.2f} off3 "
                   f"{r['offset3'][h]:.2f}"
                   for h in range(len(r["offset1"]))])
  t = config.task.seq_len
  plots.attention_grid(grid, q_labels=[str(i) for i in range(t)],
                       k_labels=[str(i) for i in range(t)],
                       head_titles=titles, cell=2.8,
                       title="Continuous task, seed 0: rows = query t, "
                       "columns = key",
                       path=str(workdir / "attention.png"))
  results = {"continuous": cont, "token": tok, "target_variance": target_var}
  return common.write_outputs(workdir, results,
                              _report(config, cont, tok, target_var),
                              drop=("weights_example",))


def _report(config, cont, tok, target_var):
  e = config.experiment
  d = config.model.d_model
  rows = []
  for k, runs in cont.items():
    rows.append([k, common.fmt(*_stat(runs, "nmse")),
                 common.fmt(*common.mean_std([r["offset1"].max()
                                              for r in runs]), digits=2),
                 common.fmt(*common.mean_std([r["offset3"].max()
                                              for r in runs]), digits=2),
                 f"{sum(r['split_heads'] for r in runs)}/{len(runs)}"])
  trows = []
  for k, runs in tok.items():
    trows.append([k, common.fmt(*_stat(runs, "accuracy")),
                  common.fmt(*_stat(runs, "loss")),
                  common.fmt(*common.mean_std([r["offset1"].max()
                                               for r in runs]), digits=2),
                  common.fmt(*common.mean_std([r["offset3"].max()
                                               for r in runs]), digits=2),
                  common.fmt(*common.mean_std([r["entropy"].min()
                                               for r in runs]), digits=2)])
  h1 = cont["h=1"]
  multi = [k for k in cont if k not in ("h=1",) and "wide" not in k]
  best_multi = min(multi, key=lambda k: _stat(cont[k], "nmse")[0])
  wide = [k for k in cont if "wide" in k][0]
  tok_h1 = _stat(tok["h=1"], "accuracy")
  tok_best = max((k for k in tok if k != "h=1" and "wide" not in k),
                 key=lambda k: _stat(tok[k], "accuracy")[0])
  lines = [
      "# Experiment 2: two positions at once",
      "",
      "Command: `python -m experiments.two_offsets "
      "--workdir=runs/two_offsets` (config `configs/two_offsets.py`). One "
      f"attention-only layer, d_model {d}, {config.model.positions} "
      f"positions, sequences of {config.task.seq_len}, "
      f"{config.train.num_steps} steps of batch {config.task.batch_size}, "
      f"seeds {list(e.seeds)}; numbers on {e.analysis_examples} held-out "
      "sequences (positions t >= 3).",
      "",
      "## Continuous: target [u_{t-1}; u_{t-3}], u ~ N(0, I_"
      f"{config.task.feature_dim})",
      "",
      f"Normalised MSE = MSE / variance of the targets ({target_var:.3f}); "
      "0 is perfect, 1 is predicting the mean. One softmax with weight a on "
      "t-1 and 1 - a on t-3 hands every value dimension the same blend "
      "a u_{t-1} + (1 - a) u_{t-3}; the best linear read-out of the two "
      "halves from it explains a^2 / (a^2 + (1-a)^2) and (1-a)^2 / (a^2 + "
      "(1-a)^2) of their variance, which sum to 1, so NMSE >= 0.5 for EVERY "
      "split a, including a = 1 (fetch one position, guess the other).",
      "",
      common.md_table(["setting", "NMSE", "best head weight on t-1",
                       "best head weight on t-3",
                       "runs with one head per offset"], rows),
      "",
      "![nmse_vs_heads.png](nmse_vs_heads.png)",
      "![attention.png](attention.png)",
      "",
      "## Token version: class of the pair (x_{t-1}, x_{t-3}), "
      f"{config.task.vocab_size} symbols, chance accuracy "
      f"1/{config.task.vocab_size ** 2}",
      "",
      common.md_table(["setting", "accuracy", "loss",
                       "best head weight on t-1", "best head weight on t-3",
                       "lowest head entropy (nats)"], trows),
      "",
      "## What this shows, next to the source's claim",
      "",
      "The source argues that one softmax cannot deliver two different "
      "positions' values in separate subspaces, and several heads can.",
      "",
      f"* Continuous: h = 1 reaches NMSE {common.fmt(*_stat(h1, 'nmse'))} "
      "(the 0.5 bound above; its head puts "
      f"{common.fmt(*_best(h1, 'offset1'), digits=2)}"
      " of its weight on t-1 and "
      f"{common.fmt(*_best(h1, 'offset3'), digits=2)}"
      " on t-3); "
      f"the single head {config.experiment.wide_factor}x wider reaches "
      f"{common.fmt(*_stat(cont[wide], 'nmse'))}, so width does not buy "
      f"a second position. The best multi-head setting ({best_multi}) "
      f"reaches {common.fmt(*_stat(cont[best_multi], 'nmse'))}. See the "
      "table for where small d_k starts to hurt.",
      f"* Token version: h = 1 reaches accuracy {common.fmt(*tok_h1)} vs "
      f"{common.fmt(*_stat(tok[tok_best], 'accuracy'))} for {tok_best}. "
      + ("So on discrete symbols ONE head can also solve it: an unequal "
         "split of the weight between t-1 and t-3 keeps the pair (and its "
         "order) decodable from the blended value, which a continuous "
         "target cannot afford. What still differs is the loss and how "
         "mixed the single head's attention is (entropy column)."
         if tok_h1[0] > 0.9 else
         "One head does not solve the token version in this budget "
         "either; see the loss and entropy columns for how far it gets."),
  ]
  return "\n".join(lines)


def main(argv):
  common.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
