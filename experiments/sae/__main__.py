r"""Sparse autoencoders on one attention layer's z: what each head writes,
as features.

  python -m experiments.sae --workdir=runs/sae
  python -m experiments.sae --config=configs/sae.py:smollm2 \
      --workdir=runs/sae_smollm2

Collects the layer's z (heads concatenated) from the model of
configs/sae.py, trains a ReLU-L1 and a TopK SAE per seed, measures them
(L0, dead and dense features, explained variance, loss recovered through
the z hook against zero and mean ablation) and finds their induction
features on repeated random tokens. Writes report.md, results.json,
figures and view.html (the features' top contexts) into --workdir; each
SAE's checkpoints are in its sub-folder, so an interrupted run resumes.
"""

from __future__ import annotations

from experiments import cli
from experiments.sae import report
from experiments.sae import run as run_lib
from experiments.sae import sources
from experiments.sae import view

_FLAGS = cli.experiment_flags(config="configs/sae.py", workdir="runs/sae")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py). Finished SAEs
  and the trained model are always reused when their config matches, so
  `reuse_runs` changes nothing here."""
  del reuse_runs
  src = sources.load(config, workdir)  # once, for measuring and the pages
  results = run_lib.measure(config, workdir, src)
  written = report.write(config, results, workdir, command)
  view.write(config, workdir, src)
  return written


if __name__ == "__main__":
  cli.main(run, _FLAGS)
