r"""Induction heads on real text: BPE tokens, the ICL score and the heads.

  python -m experiments.text_induction --workdir=runs/text_induction

Trains, per seed of `config.experiment.seeds`, a 2-layer attention-only
decoder on the standard library's code in BPE tokens and the same model on
bytes, measures at every checkpoint the in-context-learning score, the
loss at every position and every head's prefix-matching and copying
scores on held-out files, finds when induction heads formed and when the
ICL score moved, and ablates the formed heads. Writes report.md,
results.json and PNG figures into --workdir (docs/text_induction.md).
"""

from __future__ import annotations

from experiments import cli
from experiments.text_induction import report
from experiments.text_induction import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/text_induction.py", workdir="runs/text_induction")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
