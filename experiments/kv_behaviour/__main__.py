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

from experiments import cli
from experiments.kv_behaviour import report
from experiments.kv_behaviour import run as run_lib

_FLAGS = cli.experiment_flags(
    config="configs/kv_behaviour.py", workdir="runs/kv_behaviour")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Train and measure (run.py), then write the report (report.py)."""
  results = run_lib.measure(config, workdir, reuse=reuse_runs,
                            command=command)
  return report.write(config, results, workdir)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
