r"""Train any config: the one entry point of every experiment.

  python -m experiments.train --config=configs/default.py \
      --workdir=runs/default --config.model.num_heads=8

Hyperparameters live only in the config; override them with
`--config.<group>.<field>=value`. Rerunning with the same `--workdir`
resumes from its latest checkpoint.
"""

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from mha_jax import config as config_lib
from mha_jax import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file (configs/*.py).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for metrics.jsonl, config.json and "
    "checkpoints/; reused to resume.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  # Fail on inconsistent values before building or compiling anything.
  try:
    config_lib.validate_config(config)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  logging.info("Config:\n%s", config)
  train.train_and_evaluate(config, _WORKDIR.value)
  logging.info("Done; metrics in %s/metrics.jsonl", _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
