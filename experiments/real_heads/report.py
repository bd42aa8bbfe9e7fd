"""The real-heads experiment, reporting: report.md, results.json, figures.

`write` turns what `run.measure` returned into the files; nothing here
runs a model or computes a statistic (intervals, floors, random draws and
verdict inputs are all in results.json). The prose is report.md.tmpl
beside this file, with one section per model in model.md.tmpl and the
repeat-distance part in distance.md.tmpl (only the models that measured
it); `render` fills them from results.json alone.
"""

from __future__ import annotations

import pathlib

from experiments.real_heads import figures
from experiments.real_heads import tables
from mha_jax.measure import report as report_lib

HERE = pathlib.Path(__file__).parent
TEMPLATE = HERE / "report.md.tmpl"
MODEL_TEMPLATE = HERE / "model.md.tmpl"
DISTANCE_TEMPLATE = HERE / "distance.md.tmpl"


def write(config, results, workdir, command: str | None = None) -> dict:
  """The figures, report.md and results.json; returns what results.json
  holds."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  saved = report_lib.saved_results(results, config=config)
  figures.draw(workdir, saved)
  return report_lib.write_outputs(workdir, saved, render(saved, command),
                                  config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  e = saved["config"]["experiment"]
  sections = "\n\n".join(
      report_lib.fill(MODEL_TEMPLATE, model_values(name, r, e)).rstrip()
      for name, r in saved["models"].items())
  return {
      "command": report_lib.command("experiments.real_heads", command),
      "wall": report_lib.wall_time(saved["wall_s"], False),
      "model_walls": ", ".join(f"{r['info']['label']} "
                               f"{r['wall_s'] / 60:.1f} min"
                               for r in saved["models"].values()),
      "repeat_inputs": e["repeat_inputs"], "repeat_len": e["repeat_len"],
      "token_lo": e["token_range"][0], "token_hi": e["token_range"][1],
      "text_inputs": e["text_inputs"], "text_len": e["text_len"],
      "local": e["local"], "sink_eps": e["sink_eps"],
      "resamples": e["resamples"], "top_k": e["top_k"],
      "random_draws": e["random_draws"],
      "causal_inputs": e["causal_inputs"],
      "causal_text_len": e["causal_text_len"],
      "single_top": e["single_top"],
      "models": sections,
      "findings": tables.findings(saved),
  }


def model_values(name: str, r: dict, e: dict) -> dict:
  """One model's section."""
  info, s, c = r["info"], r["survey"], r["causal"]
  kv = r["kv"]
  return {
      "label": info["label"], "name": name, "layers": info["layers"],
      "heads": info["heads"],
      "kv_heads": f"{info['kv_heads']} KV head"
                  + ("s" if info["kv_heads"] > 1 else ""),
      "head_dim": info["head_dim"],
      "windows": tables.windows(info["windows"]),
      "floor_inputs": s["floor_inputs"],
      "survey_table": tables.survey_table(s, e["top_k"]),
      "sink": tables.sink(s["sink"], e["sink_eps"]),
      "clean": tables.clean(c["clean"]),
      "zero_table": tables.causal_table(c, "zero"),
      "mean_table": tables.causal_table(c, "mean"),
      "single_table": tables.single_table(c, s),
      "layer0": tables.layer0(c, s),
      "kv": tables.kv(kv, e),
      "distance": (report_lib.fill(DISTANCE_TEMPLATE,
                                   tables.distance_values(r, e))
                   if "distance" in r else ""),
  }
