r"""Experiment 3: head width d_k against head count h at fixed d_model.

  python -m experiments.head_dim --workdir=runs/head_dim

Part A trains the two-offset retrieval layer of `configs/head_dim.py` for
every h (d_k = d_model / h), each at its own learning rate (chosen from a
grid on a seed that is not reported) and long enough to check a plateau,
and plots NMSE against steps. Part B fits the query/key maps of ONE head of
width d_k to a random target attention matrix and reports the error against
d_k (the low-rank bottleneck of a head). Writes report.md, results.json,
PNG figures and explorer.html (every head of the narrowest setting, in a
browser) into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.head_dim import report
from experiments.head_dim import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/head_dim.py", workdir="runs/head_dim")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
