r"""Experiment 1: do induction heads form, and does each head do its own job?

  python -m experiments.induction --workdir=runs/induction

Trains the 2-layer attention-only decoder of `configs/induction.py` and a
1-layer control over several seeds, then measures every head on held-out
sequences (previous-token and induction scores, entropy, Jensen-Shannon
distance between heads) and ablates each head. Writes report.md,
results.json and PNG figures into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.induction import report
from experiments.induction import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/induction.py", workdir="runs/induction")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
