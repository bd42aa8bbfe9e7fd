"""The output-head experiment's report, from results.json alone.

`write` saves results.json, draws the figure and writes report.md;
`render(saved)` fills report.md.tmpl from results.json's contents, so a
committed report regenerates from it. No statistic is computed here.
"""

from __future__ import annotations

import json
import pathlib

from experiments.ioi_output_heads import figures
from experiments.ioi_output_heads import tables
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """results.json (first, so a figure or template error loses no
  measurement), the figure, then report.md; returns what results.json
  holds."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  saved = report_lib.saved_results(results, config=config)
  (workdir / "results.json").write_text(json.dumps(saved, indent=1) + "\n")
  figures.write(saved, workdir)
  return report_lib.write_outputs(workdir, saved, render(saved, command),
                                  config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` as the command that ran."""
  return report_lib.fill(TEMPLATE, tables.values(saved, command))
