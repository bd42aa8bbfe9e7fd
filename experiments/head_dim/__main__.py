r"""Experiment 3: head width d_k against head count h at fixed d_model.

  python -m experiments.head_dim --workdir=runs/head_dim

Part A trains the two-offset retrieval layer of `configs/head_dim.py` for
every h (d_k = d_model / h), each at its own learning rate (chosen from a
grid on a seed that is not reported) and long enough to check a plateau,
and plots NMSE against steps. Part B fits the query/key maps of ONE head of
width d_k to a random target attention matrix and reports the error against
d_k (the low-rank bottleneck of a head). Writes report.md, results.json,
PNG figures and explorer.html (every head of the narrowest setting, in a
browser) into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.head_dim import report
from experiments.head_dim import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/head_dim.py", "The experiment's config file; override "
    "fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/head_dim", "Output folder: report.md, results.json, "
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
