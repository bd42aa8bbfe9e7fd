"""Experiment 6, reporting: tables, figures and claims from the results.

`write` turns the results dict of `run.measure` into its PNG figures,
report.md and results.json; nothing here trains or measures. The prose is
report.md.tmpl beside this file; `render` fills it from results.json
alone (the tables from `tables.values`, the claims' values from
`claims.values`), so a committed report regenerates from its
results.json.
"""

from __future__ import annotations

import functools
import pathlib

from experiments.circuits import claims as claims_lib
from experiments.circuits import figures as circuit_plots
from experiments.circuits import roles
from experiments.circuits import tables as tables_lib
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(workdir, results["runs"], results["baselines"],
           tuple(results["setup"]["layout"]))
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _figures(workdir, runs, baselines, layout) -> None:
  """The six figures the template links, from the in-memory results."""
  rows = {k.replace("seed", "seed "): r for k, r in runs.items()}
  circuit_plots.composition(rows, baselines["composition"],
                            path=str(workdir / "composition.png"))
  circuit_plots.path_patching(rows, path=str(workdir / "path_patching.png"))
  circuit_plots.head_patching(rows, path=str(workdir / "head_patching.png"))
  circuit_plots.position_patching(
      rows, layout, path=str(workdir / "position_patching.png"))
  circuit_plots.copying_and_dla(rows, baselines["copying"]["copying"],
                                path=str(workdir / "copying_dla.png"))
  circuit_plots.dynamics(rows, path=str(workdir / "dynamics.png"))


def _reference(saved, i) -> str:
  """Each seed's clean (`i` 0) or corrupted (1) metric."""
  return ", ".join(
      f"{saved['runs'][f'seed{s}']['heads']['noise']['reference'][i]:.2f}"
      for s in saved["config"]["experiment"]["seeds"])


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, claims, cal = saved["config"], saved["claims"], saved["calibration"]
  e, m, t = config["experiment"], config["model"], config["train"]
  return {
      "command": report_lib.command("experiments.circuits", command),
      "seeds": list(e["seeds"]), "num_seeds": len(e["seeds"]),
      "first_seed": e["seeds"][0],
      **{k: m[k] for k in ("num_heads", "d_model", "positions")},
      **{k: t[k] for k in ("num_steps", "checkpoint_every")},
      **{k: e[k] for k in ("analysis_examples", "position_examples",
                           "segment", "first", "second",
                           "bootstrap_resamples", "threshold")},
      "clean_metrics": _reference(saved, 0),
      "corrupted_metrics": _reference(saved, 1),
      "matters": saved["setup"]["matters"],
      "chance": f"{claims['chance']:.2f}",
      "num_kinds": len(claims["reference"]),
      "denoise_pooled_r": report_lib.summary(cal["denoise_pooled_r"], 2),
      "noise_pooled_r": report_lib.summary(cal["noise_pooled_r"], 2),
      "draws": saved["baselines"]["draws"],
      **tables_lib.values(saved),
      **claims_lib.values(saved),
      **roles.values(saved),
  }
