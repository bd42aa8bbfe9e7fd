r"""The IOI output heads of two real decoder LMs on held-out prompts.

  python -m experiments.ioi_output_heads --workdir=runs/ioi_output_heads

Writes report.md, results.json and groups.png into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.ioi_output_heads import report
from experiments.ioi_output_heads import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/ioi_output_heads.py",
                              workdir="runs/ioi_output_heads")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py); nothing is
  trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = run_lib.measure(config)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
