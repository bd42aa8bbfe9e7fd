r"""Heads on real text: which heads byte-level models grow on Python code.

  python -m experiments.text_heads --workdir=runs/text_heads

Trains the models of `config.experiment.variants` (2 and 4 layers,
attention-only and with MLPs) on the training files of the corpus
(`configs/text.py`: the standard library's `.py` files), 3 seeds each,
then measures every model on held-out files: bits per byte beside a
unigram and a bigram model, every head's scores with their floors, the
taxonomy, each head's and each class's ablation effect, and the
in-context-learning score and best induction score at every checkpoint.
Writes report.md, results.json, PNG figures and explorer.html into
--workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.text_heads import report
from experiments.text_heads import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/text.py", "The experiment's config file; override "
    "fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/text_heads", "Output folder: report.md, results.json, "
    "PNGs, explorer.html and one sub-folder per training run.")
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
