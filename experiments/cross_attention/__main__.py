r"""Experiment 4: does cross-attention find the alignment of a reversal?

  python -m experiments.cross_attention --workdir=runs/cross_attention

Trains the encoder-decoder of `configs/cross_attention.py` on sequence
reversal for several seeds, then scores every cross-attention head by how
often its argmax lands on the aligned source token (len - 1 - t) and by how
much the loss rises when it is removed. Writes report.md, results.json and
PNG figures into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.cross_attention import report
from experiments.cross_attention import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/cross_attention.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/cross_attention", "Output folder: report.md, "
    "results.json, PNGs and one sub-folder per training run.")
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
