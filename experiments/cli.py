"""The command line every experiment shares: its flags and its `main`.

Each `experiments/<name>/__main__.py` defines its flags at import with

  _FLAGS = cli.experiment_flags(config="configs/<name>.py",
                                workdir="runs/<name>")

(`--config`, with `--config.<field>=...` overrides, `--workdir` and
`--reuse_runs`), a `run(config, workdir, *, reuse_runs)` that measures
and reports, and hands both to `cli.main`.
"""

from __future__ import annotations

import pathlib
from typing import Callable, NamedTuple

from absl import app
from absl import flags
from ml_collections import config_flags

from mha_jax.measure import report as report_lib


class ExperimentFlags(NamedTuple):
  config: flags.FlagHolder
  workdir: flags.FlagHolder
  reuse_runs: flags.FlagHolder


def experiment_flags(*, config: str, workdir: str) -> ExperimentFlags:
  """Define `--config` (default `config`), `--workdir` (default
  `workdir`) and `--reuse_runs`."""
  return ExperimentFlags(
      config_flags.DEFINE_config_file(
          "config", config, "The experiment's config file; override fields "
          "as --config.train.num_steps=...", lock_config=True),
      flags.DEFINE_string(
          "workdir", workdir, "Output folder: report.md, results.json, "
          "figures, explorer.html and one sub-folder per training run."),
      flags.DEFINE_bool(
          "reuse_runs", False, "Load a finished run whose config.json "
          "matches instead of training it again (to redo only the "
          "analysis)."))


def main(run: Callable[..., dict], fl: ExperimentFlags) -> None:
  """Parse the command line, then `run(config, workdir, reuse_runs=...)`
  and print where the report is."""
  def _main(argv):
    report_lib.check_no_arguments(argv)
    run(fl.config.value, fl.workdir.value, reuse_runs=fl.reuse_runs.value)
    print(f"Report: {pathlib.Path(fl.workdir.value) / 'report.md'}")
  app.run(_main)
