r"""Experiment 6: the induction circuit, by patching, weights and training.

  python -m experiments.circuits --workdir=runs/circuits

Trains the 2-layer models of experiment 1 (`configs/circuits.py`: its
config, with a checkpoint at every evaluation), then measures each one on
held-out clean/corrupted pairs (the first copy of the repeated segment
resampled): activation, attribution and path patching, composition and
copying scores against random matrices, direct logit attribution, and the
heads' scores at every checkpoint. Writes report.md, results.json, PNG
figures and explorer.html (every head of the first seed's model, its
patching numbers beside its attention scores) into --workdir.
"""


from __future__ import annotations

from experiments import cli
from experiments.circuits import report
from experiments.circuits import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/circuits.py", workdir="runs/circuits")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
