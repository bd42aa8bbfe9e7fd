"""Experiment 4, reporting: tables, figures and claims from the results.

Shape letters: L layers, H heads, T decoder length, S source length.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model. The prose is
report.md.tmpl beside this file; `render` fills it from results.json
alone, so a committed report regenerates from its results.json.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

FIGURES = ("cross_attention.png", "cross_heads.png")
# The per-example arrays kept for the figures only.
EXAMPLES = ("cross_example", "source_example", "decoder_example")
ALIGNMENT = ("accuracy", "mass", "mass_within_1")
ABLATIONS = ("zero_ablation", "mean_ablation", "resample_ablation",
             "taylor_estimate")
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(config, results["runs"][0], workdir)
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), EXAMPLES,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _figures(config, r0, workdir) -> None:
  """The first seed's cross-attention heatmaps and per-head bars."""
  seed = config.experiment.seeds[0]
  n = r0["source_length_example"]
  src = [str(x) for x in r0["source_example"][:n]]
  dec = [str(x) for x in r0["decoder_example"][:n]]
  acc0 = r0["alignment_accuracy"]
  titles = [[f"{report_lib.head_name(l, h)} align {acc0[l, h]:.2f}"
             for h in range(acc0.shape[1])] for l in range(acc0.shape[0])]
  plots.attention_grid(r0["cross_example"][:, :, :n, :n], q_labels=dec,
                       k_labels=src, head_titles=titles, cell=2.4,
                       title=f"Cross-attention, seed {seed}: rows = "
                       "decoder inputs, columns = source tokens",
                       path=str(workdir / FIGURES[0]))
  plots.metric_bars({"alignment accuracy": acc0,
                     "zero-ablation Δloss": r0["importance"]["zero_ablation"],
                     "-gradient (Taylor)":
                         r0["importance"]["taylor_estimate"]},
                    title=f"Cross-attention heads, seed {seed}",
                    path=str(workdir / FIGURES[1]))


def _layer_cell(accuracy) -> str:
  """One layer's heads' alignment accuracies, `0.12 / 0.98`."""
  return " / ".join(report_lib.fmt(a, digits=2) for a in accuracy)


def _seed_rows(runs, n_good) -> list[list]:
  """One row per seed: loss, accuracy, alignment per layer."""
  return [[r["seed"], report_lib.fmt(r["loss"]),
           report_lib.fmt(r["accuracy"]),
           _layer_cell(r["alignment_accuracy"][-1]),
           _layer_cell(r["alignment_accuracy"][0]),
           report_lib.fmt(np.max(r["alignment_accuracy"]), digits=2), n]
          for r, n in zip(runs, n_good)]


def _head_rows(r0) -> list[list[str]]:
  """Every cross-attention head of one run, then the two floors."""
  imp = r0["importance"]
  n_layers, n_heads = np.shape(r0["alignment_accuracy"])
  rows = [[report_lib.head_name(l, h)]
          + [report_lib.fmt(r0[f"alignment_{k}"][l][h], digits=2)
             for k in ALIGNMENT]
          + [report_lib.signed(imp[k][l][h]) for k in ABLATIONS]
          for l in range(n_layers) for h in range(n_heads)]
  uni, init = r0["floors"]["uniform"], r0["floors"]["init"]
  rows.append(["uniform over the source"]
              + [report_lib.fmt(uni[k], digits=2) for k in ALIGNMENT]
              + ["-"] * 4)
  rows.append(["init, best head"]
              + [report_lib.fmt(np.max(init[k]), digits=2)
                 for k in ALIGNMENT]
              + ["-"] * 4)
  return rows


def _sharp(ms, n_good) -> str:
  """Whether one head owns the alignment in every seed."""
  if min(n_good) >= 1:
    return (f"In every seed one head exceeds 0.9 (best "
            f"{ms('best_head_alignment')}).")
  return (f"No single head is sharp in every seed (best head "
          f"{ms('best_head_alignment')}; heads above 0.9 per seed: "
          f"{n_good}): the alignment is shared by several last-layer heads "
          "at once rather than owned by one.")


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, runs, sm = saved["config"], saved["runs"], saved["summary"]
  model, task, e = config["model"], config["task"], config["experiment"]
  n_good = [int((np.asarray(r["alignment_accuracy"]) > 0.9).sum())
            for r in runs]
  ms = lambda k: report_lib.fmt(sm[k]["mean"], sm[k]["std"])
  # Is the best-aligned head also the one whose removal costs most?
  top_match = sum(int(np.argmax(r["alignment_accuracy"]) ==
                      np.argmax(r["importance"]["zero_ablation"]))
                  for r in runs)
  summaries = ("token_accuracy", "best_head_alignment", "best_head_within_1",
               "uniform_alignment", "uniform_within_1",
               "init_best_head_alignment", "last_layer_alignment",
               "first_layer_alignment")
  return {
      "command": report_lib.command("experiments.cross_attention", command),
      "num_layers": model["num_layers"],
      "num_heads": model["num_heads"],
      "d_model": model["d_model"],
      "min_len": task["min_len"],
      "seq_len": task["seq_len"],
      "symbols": task["vocab_size"] - 3,
      "num_steps": config["train"]["num_steps"],
      "batch_size": task["batch_size"],
      "seeds": list(e["seeds"]),
      "analysis_examples": e["analysis_examples"],
      "seed_table": report_lib.md_table(
          ["seed", "loss", "token accuracy", "last-layer heads' alignment",
           "first-layer heads' alignment", "best head", "heads > 0.9"],
          _seed_rows(runs, n_good)),
      **{k: ms(k) for k in summaries},
      "first_seed": e["seeds"][0],
      "head_table": report_lib.md_table(
          ["head", "alignment accuracy", "weight on aligned token",
           "weight within ±1", "zero abl. Δloss", "mean abl. Δloss",
           "resample abl. Δloss", "-grad (Taylor)"], _head_rows(runs[0])),
      "sharp": _sharp(ms, n_good),
      "top_match": top_match,
      "num_seeds": len(runs),
  }
