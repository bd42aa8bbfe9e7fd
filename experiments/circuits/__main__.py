r"""Experiment 6: the induction circuit, by patching, weights and training.

  python -m experiments.circuits --workdir=runs/circuits

Trains the 2-layer models of experiment 1 (`configs/circuits.py`: its
config, with a checkpoint at every evaluation), then measures each one on
held-out clean/corrupted pairs (the first copy of the repeated segment
resampled): activation, attribution and path patching, composition and
copying scores against random matrices, direct logit attribution, and the
heads' scores at every checkpoint. Writes report.md, results.json, PNG
figures and explorer.html (every head of the first seed's model, its
patching numbers beside its attention scores) into --workdir.
"""


from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.circuits import report
from experiments.circuits import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/circuits.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/circuits", "Output folder: report.md, results.json, "
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
