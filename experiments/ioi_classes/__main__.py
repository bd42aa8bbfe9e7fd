r"""The IOI upstream classes of two real decoder LMs on held-out prompts.

  python -m experiments.ioi_classes --workdir=runs/ioi_classes

Writes report.md and results.json into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.ioi_classes import report
from experiments.ioi_classes import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/ioi_classes.py",
                              workdir="runs/ioi_classes")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py); nothing is
  trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = run_lib.measure(config)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
