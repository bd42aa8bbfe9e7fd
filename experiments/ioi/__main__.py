r"""Indirect-object identification in SmolLM2-135M and Gemma 3 270M.

  python -m experiments.ioi --workdir=runs/ioi

Writes report.md, results.json and the patching figures into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.ioi import report
from experiments.ioi import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/ioi.py", workdir="runs/ioi")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py); nothing is
  trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = run_lib.measure(config)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
