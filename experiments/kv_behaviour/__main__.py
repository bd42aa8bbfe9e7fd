r"""What sharing key/value heads costs a trained model: MHA vs GQA vs MQA.

  python -m experiments.kv_behaviour --workdir=runs/kv_behaviour
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/kv_behaviour/results.json

Trains one decoder per (variant, seed) of `configs/kv_behaviour.py` through
the shared training loop (same task, steps, data, learning-rate schedule
and initial seed for every variant; the schedule is constant after warmup,
so an intermediate evaluation is a shorter run of the same schedule). The
variants are K = H (MHA), 1 < K < H (GQA) and K = 1 (MQA) key/value heads,
plus K values trained again with the head width widened so that the model
has MHA's parameter count. Measures on held-out data: the eval loss at
every evaluation (the time until it first drops below
`experiment.loss_threshold`, per seed, as a survival curve), and at the end
the eval loss and accuracy and the accuracy of free-running generation with
the KV cache (`mha_jax.measure.continuations`). Every variant is compared
with MHA by Welch 95% intervals. Writes report.md, results.json, PNG figures and
explorer.html (every head of the first seed's MHA model, in a browser);
results.json is in the format `experiments.kv_cache --behaviour_results`
reads ("runs": one display row per variant, "variants": the numbers behind
them).

Shape letters: H query heads, K key/value heads, Dh head width, L layers.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.kv_behaviour import report
from experiments.kv_behaviour import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/kv_behaviour.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/kv_behaviour", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs)
  return report.write(config, results, workdir)


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
