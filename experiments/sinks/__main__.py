r"""Attention sinks: do heads park attention on position 0, and what changes
with a BOS token, a learned sink logit or a soft cap?

  python -m experiments.sinks --workdir=runs/sinks

Trains the settings of `configs/sinks.py` (BOS off/on x plain, learned
sinks, soft cap) over several seeds, measures every head on held-out
sequences with `experiments.sinks.survey.survey` and writes report.md,
results.json, PNG figures and explorer.html into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.sinks import report
from experiments.sinks import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/sinks.py", workdir="runs/sinks")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
