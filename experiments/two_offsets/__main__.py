r"""Experiment 2: can one softmax deliver two positions? Sweep the head count.

  python -m experiments.two_offsets --workdir=runs/two_offsets

Continuous two-offset retrieval (target [u_{t-1}; u_{t-3}]) with one
attention layer at fixed d_model for every h in the config, plus two
single-head controls with more capacity (a 4x wider model; an added MLP),
each setting at its own learning rate (chosen from a grid on a separate
seed) and checked for a plateau; then the token version (class of
(x_{t-1}, x_{t-3})). Writes report.md, results.json, PNG figures and
explorer.html (every head of one continuous model, in a browser) into
--workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.two_offsets import report
from experiments.two_offsets import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/two_offsets.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/two_offsets", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
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
