r"""Experiment 4: does cross-attention find the alignment of a reversal?

  python -m experiments.cross_attention --workdir=runs/cross_attention

Trains the encoder-decoder of `configs/cross_attention.py` on sequence
reversal for several seeds, then scores every cross-attention head by how
often its argmax lands on the aligned source token (len - 1 - t) and by how
much the loss rises when it is removed. Writes report.md, results.json and
PNG figures into --workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.cross_attention import report
from experiments.cross_attention import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/cross_attention.py", workdir="runs/cross_attention")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
