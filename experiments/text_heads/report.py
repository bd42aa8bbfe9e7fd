"""Heads on real text, reporting: tables, figures and claims.

`write` turns what `run.measure` returned into report.md, its PNG figures
(`figures.draw`) and results.json; nothing here trains or runs a model.
The prose is report.md.tmpl beside this file; `render` fills it from
results.json alone, so a committed report regenerates from its
results.json. The tables are tables.py's, the claims' values claims.py's.
"""

from __future__ import annotations

import functools
import pathlib

from experiments.text_heads import claims
from experiments.text_heads import control as control_lib
from experiments.text_heads import figures as text_figures
from experiments.text_heads import tables
from mha_jax.measure import report as report_lib
from mha_jax.training import tasks

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
# The attention of the first 40 bytes, kept for the figures only.
DROP = ("weights_example",)


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  figures = text_figures.draw(workdir, results["runs"],
                              results["variants"], config)
  # results.json lists the figures after the runs, before the times.
  keys = list(results)
  at = keys.index("runs") + 1
  results = {k: results[k] for k in keys[:at]} | {"figures": figures} | {
      k: results[k] for k in keys[at:]}
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _setup(saved, command: str | None) -> dict:
  """The setup paragraph's values (`command`: the command line that ran)."""
  config, info = saved["config"], saved["corpus"]
  e, t, tr, m = (config[k] for k in ("experiment", "task", "train", "model"))
  seen = tr["num_steps"] * t["batch_size"] * t["seq_len"]
  reused = saved["train_time_s"] < 5 * len(saved["runs"])
  return {
      "command": report_lib.command("experiments.text_heads", command),
      "corpus": info["corpus"],
      "corpus_describe": info["describe"],
      "train_files": info["train_files"],
      "train_mb": f"{info['train_bytes'] / 1e6:.1f}",
      "held_out_files": info["held_out_files"],
      "held_out_mb": f"{info['held_out_bytes'] / 1e6:.1f}",
      "split_seed": t["split_seed"],
      "held_out_fraction": t["held_out_fraction"],
      "models": ", ".join(saved["variants"]),
      "mlp_width": m["mlp_dim"] or 4 * m["d_model"],
      "d_model": m["d_model"],
      "num_heads": m["num_heads"],
      "positions": m["positions"],
      "seq_len": t["seq_len"],
      "num_special": tasks.NUM_SPECIAL,
      "num_steps": tr["num_steps"],
      "batch_size": t["batch_size"],
      "learning_rate": f"{tr['learning_rate']:g}",
      "seen_mb": f"{seen / 1e6:.2f}",
      "seen_share": f"{100 * seen / max(info['train_bytes'], 1):.1f}%",
      "seeds": list(e["seeds"]),
      "analysis_examples": e["analysis_examples"],
      "wall_minutes": f"{saved['wall_time_s'] / 60:.1f}",
      "train_minutes": f"{saved['train_time_s'] / 60:.1f}",
      "reused": " (runs reused)" if reused else "",
      "cpu_minutes": f"{saved['cpu_time_s'] / 60:.1f}",
  }


def _controls(saved) -> dict:
  """The controls section's values."""
  ctl = saved["control"]
  cc, s = ctl["config"], ctl["summary"]
  deep, shallow = (f"L{d}" for d in cc["layers"])
  best_layer = s[deep]["repeat_induction"]["best_layer"]
  return {
      "control_steps": cc["steps"],
      "control_seq_len": cc["seq_len"],
      "control_seeds": cc["seeds"],
      "control_examples": cc["examples"],
      "control_half": cc["seq_len"] // 2,
      "deep": deep,
      "shallow": shallow,
      "experiment1_induction": tables.ms(s[deep]["experiment1_induction"], 2),
      "control_table": tables.control_table(s, deep, shallow),
      "verdicts": "; ".join(
          f"{tables.DETECTOR_NAMES[k]} "
          f"{claims.control_verdict(s[deep][k], s[shallow][k])}"
          for k in control_lib.DETECTORS),
      "best_layers": " or ".join(str(l) for l in sorted(set(best_layer))),
      "best_layer_per_seed": ", ".join(str(l) for l in best_layer),
      "control_minutes": f"{ctl['time_s'] / 60:.1f}",
  }


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  summary, config = saved["variants"], saved["config"]
  e, thr = config["experiment"], config["experiment"]["thresholds"]
  first = summary[next(iter(summary))]
  late, early = e["late_positions"], e["early_positions"]
  return {
      **_setup(saved, command),
      "bpb_table": tables.bpb_table(summary),
      "repeat_length": config["task"]["seq_len"] // 2,
      "best_table": tables.best_table(summary),
      "floor_ratio": f"{thr['floor_ratio']:g}",
      **{k: f"{thr[k]:g}" for k in ("sink", "induction", "positional",
                                    "syntactic")},
      "max_offset": e["max_offset"],
      "taxonomy_table": tables.taxonomy_table(summary),
      "every_head": tables.every_head(saved, e["seeds"][0]),
      **_controls(saved),
      "uniform_span": f"{first['uniform_span_induction']['mean']:.3f}",
      "uniform_span_strict":
          f"{first['uniform_span_induction_strict']['mean']:.3f}",
      "strict_table": tables.strict_table(summary),
      "class_ablation_table": tables.class_ablation_table(summary),
      "late_positions": f"{late[0]}-{late[1] - 1}",
      "early_positions": f"{early[0]}-{early[1] - 1}",
      "checkpoint_every": config["train"]["checkpoint_every"],
      "icl_table": tables.icl_table(summary),
      "explorer_model": list(summary)[-1],
      "first_seed": e["seeds"][0],
      "figures": "\n".join(f"![{f}]({f})" for f in saved["figures"]),
      **claims.values(saved),
  }
