r"""Attention sinks: do heads park attention on position 0, and what changes
with a BOS token, a learned sink logit or a soft cap?

  python -m experiments.sinks --workdir=runs/sinks

Trains the settings of `configs/sinks.py` (BOS off/on x plain, learned
sinks, soft cap) over several seeds, measures every head on held-out
sequences with `experiments.sinks.survey.survey` and writes report.md,
results.json, PNG figures and explorer.html into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.sinks import report
from experiments.sinks import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/sinks.py", "The experiment's config file; override "
    "fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/sinks", "Output folder: report.md, results.json, PNGs, "
    "explorer.html and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir)


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
