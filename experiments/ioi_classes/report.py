"""The upstream-class report, from results.json alone.

`write` saves results.json and writes report.md;
`render(saved)` fills report.md.tmpl from results.json's contents, so a
committed report regenerates from it. No statistic is computed here.
"""

from __future__ import annotations

import json
import pathlib

from experiments.ioi_classes import tables
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """results.json (first, so a template error loses no measurement),
  then report.md; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  saved = report_lib.saved_results(results, config=config)
  (workdir / "results.json").write_text(json.dumps(saved, indent=1) + "\n")
  return report_lib.write_outputs(workdir, saved, render(saved, command),
                                  config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` as the command that ran."""
  return report_lib.fill(TEMPLATE, tables.values(saved, command))
