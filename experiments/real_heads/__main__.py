r"""What the heads of two real decoder LMs do, offline.

  python -m experiments.real_heads --workdir=runs/real_heads

Writes report.md, results.json and the figures into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.real_heads import report
from experiments.real_heads import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/real_heads.py", workdir="runs/real_heads")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py). Nothing is
  trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = run_lib.measure(config)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
