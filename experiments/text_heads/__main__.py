r"""Heads on real text: which heads byte-level models grow on Python code.

  python -m experiments.text_heads --workdir=runs/text_heads

Trains the models of `config.experiment.variants` (2 and 4 layers,
attention-only and with MLPs) on the training files of the corpus
(`configs/text.py`: the standard library's `.py` files), 3 seeds each,
then measures every model on held-out files: bits per byte beside a
unigram and a bigram model, every head's scores with their floors, the
taxonomy, each head's and each class's ablation effect, and the
in-context-learning score and best induction score at every checkpoint.
Writes report.md, results.json, PNG figures and explorer.html into
--workdir.
"""

from __future__ import annotations

from experiments import cli
from experiments.text_heads import report
from experiments.text_heads import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/text.py", workdir="runs/text_heads")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
