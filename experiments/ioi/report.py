"""The IOI experiment's report: tables, figures and the wording that
depends on the numbers, from results.json alone.

`write` saves results.json, draws the figures and writes report.md;
`render(saved)` fills report.md.tmpl from results.json's contents, so a
committed report regenerates from it. No statistic is computed here:
intervals, fractions and classes come from `run.measure`.
"""

from __future__ import annotations

import json
import pathlib

from experiments.ioi import figures
from experiments.ioi import tables
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
# Bootstrap resamples: used for the intervals in run, too many to save.
DROP = ("samples",)


def write(config, results, workdir, command: str | None = None) -> dict:
  """results.json (first, so a figure or template error loses no
  measurement), the figures, then report.md; returns what results.json
  holds."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  saved = report_lib.saved_results(results, DROP, config=config)
  (workdir / "results.json").write_text(json.dumps(saved, indent=1) + "\n")
  figures.write(saved, workdir)
  return report_lib.write_outputs(workdir, saved, render(saved, command),
                                  config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, tables.values(saved, command))
