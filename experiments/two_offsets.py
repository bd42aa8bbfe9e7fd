r"""Experiment 2: can one softmax deliver two positions? Sweep the head count.

  python -m experiments.two_offsets --workdir=runs/two_offsets

Continuous two-offset retrieval (target [u_{t-1}; u_{t-3}]) with one
attention-only layer at fixed d_model for every h in the config, plus one
head 4x wider; then the token version (class of (x_{t-1}, x_{t-3})).
Writes report.md, results.json and PNG figures into --workdir.
"""

from __future__ import annotations

import pathlib
import re

import jax
import numpy as np

from configs import two_offsets as two_offsets_config
from experiments import common
from mha_jax import analysis
from mha_jax import plots

def settings(config, heads, wide: bool):
  """`[(label, overrides)]`: each h at equal d_model [, one wide head]."""
  out = [(f"h={h}", {"model.num_heads": h, "model.head_dim": 0})
         for h in heads]
  if not wide:
    return out
  width = config.experiment.wide_factor * config.model.d_model
  out.append((f"h=1 wide (d_k={width})",
              {"model.num_heads": 1, "model.head_dim": width}))
  return out


def offset_profile(weights):
  """Per head `[H]`: weight on offset 1, on offset 3, and entropy (nats)."""
  w = weights[0]  # the one layer: [B, H, T, T]
  f = jax.jit(lambda w: (analysis.offset_score(w, 1),
                         analysis.offset_score(w, 3), analysis.entropy(w)))
  return [np.asarray(x) for x in f(w)]


def sweep(config, workdir, task, setting_list):
  """Train every `(label, overrides)` x seed on `task`; held-out numbers."""
  e = config.experiment
  base = common.variant(config, **{"task.name": task})
  batch = common.analysis_batch(base, e.analysis_examples)
  mask = np.asarray(batch["loss_mask"], bool)
  target_var = (float(np.var(np.asarray(batch["targets"])[mask]))
                if task.endswith("continuous") else None)
  out = {}
  for label, overrides in setting_list:
    runs = []
    for seed in e.seeds:
      c = common.variant(base, **overrides, **{"train.seed": seed})
      name = re.sub(r"[^A-Za-z0-9]+", "_", f"{task}_{label}_s{seed}")
      state = common.train_run(c, pathlib.Path(workdir) / name)
      model = state.model()
      ev = common.eval_loss(model, batch, state.loss)
      weights = common.weights_of(model, batch)["self"]
      off1, off3, ent = offset_profile(weights)
      run = {"seed": seed, **ev, "offset1": off1, "offset3": off3,
             "entropy": ent, "weights_example": weights[0, 0]}
      if target_var is not None:
        run["nmse"] = ev["loss"] / target_var
      # Two different heads each own one offset (> 0.5 of their weight)?
      run["split_heads"] = bool(
          off1.max() > 0.5 and off3.max() > 0.5
          and off1.argmax() != off3.argmax())
      runs.append(run)
    out[label] = runs
  return out, target_var


def _stat(runs, key):
  return common.mean_std([r[key] for r in runs])


def _best(runs, key):
  """Mean ± std over seeds of the largest per-head value of `key`."""
  return common.mean_std([r[key].max() for r in runs])


def run(config, workdir):
  e = config.experiment
  workdir = pathlib.Path(workdir)
  cont, target_var = sweep(config, workdir, "two_offset_continuous",
                           settings(config, e.heads, wide=True))
  tok, _ = sweep(config, workdir, "two_offset_token",
                 settings(config, e.token_heads, wide=False))

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
  report = _report(config, cont, tok, target_var)
  strip = lambda d: {k: [{kk: vv for kk, vv in r.items()
                          if kk != "weights_example"} for r in v]
                     for k, v in d.items()}
  results = {"continuous": strip(cont), "token": strip(tok),
             "target_variance": target_var}
  common.write_outputs(workdir, results, report)
  return results


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


if __name__ == "__main__":
  common.app_main(run, two_offsets_config.get_config, "two_offsets")
