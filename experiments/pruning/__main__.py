r"""Experiment 5: loss against heads kept, for three importance rankings.

  python -m experiments.pruning --workdir=runs/pruning

Writes report.md, results.json and prune_curve.png into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.pruning import report
from experiments.pruning import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/pruning.py", workdir="runs/pruning")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
