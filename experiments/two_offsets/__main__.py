r"""Experiment 2: can one softmax deliver two positions? Sweep the head count.

  python -m experiments.two_offsets --workdir=runs/two_offsets

Continuous two-offset retrieval (target [u_{t-1}; u_{t-3}]) with one
attention layer at fixed d_model for every h in the config, plus two
single-head controls with more capacity (a 4x wider model; an added MLP),
each setting at its own learning rate (chosen from a grid on a separate
seed) and checked for a plateau; then the token version (class of
(x_{t-1}, x_{t-3})). Writes report.md, results.json, PNG figures and
explorer.html (every head of one continuous model, in a browser) into
--workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.two_offsets import report
from experiments.two_offsets import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/two_offsets.py", workdir="runs/two_offsets")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
