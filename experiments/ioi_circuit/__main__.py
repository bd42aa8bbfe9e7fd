r"""Wang et al.'s faithfulness, completeness and minimality, and backup
heads, for the IOI circuits of SmolLM2-135M and Gemma 3 270M.

  python -m experiments.ioi_circuit --workdir=runs/ioi_circuit

Writes report.md and results.json into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.ioi_circuit import report
from experiments.ioi_circuit import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/ioi_circuit.py",
                              workdir="runs/ioi_circuit")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py); nothing is
  trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = run_lib.measure(config)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
