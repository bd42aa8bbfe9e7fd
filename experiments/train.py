r"""Train any config: the one entry point of every experiment.

  python -m experiments.train --config=configs/default.py \
      --workdir=runs/default --config.model.num_heads=8

Hyperparameters live only in the config; override them with
`--config.<group>.<field>=value` (`--config=configs/default.py:smoke` for a
run of seconds). Rerunning with the same `--workdir` resumes from its
latest checkpoint.

Several devices: `--config.mesh.data=2 --config.mesh.model=4` (see
docs/multi_device.md). Several hosts: start the same command
on every host with `--distributed`, which calls `jax.distributed.initialize`
before JAX touches a device; the coordinator comes from
JAX_COORDINATOR_ADDRESS (or the cluster: SLURM, Cloud TPU, ...), the
process count and index from `--num_processes` / `--process_id` (or the
cluster).
"""

import jax
from absl import flags
from absl import logging

from experiments import cli
from mha_jax.measure import report as report_lib
from mha_jax.training import config as config_lib
from mha_jax.training import host_memory
from mha_jax.training import train
from mha_jax.training import train_state
from mha_jax.training import workdir as workdir_lib

_CONFIG = cli.config_flag(
    None, "Path to a config file (configs/*.py).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for metrics.jsonl, config.json and "
    "checkpoints/; reused to resume.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-host run: call jax.distributed.initialize() "
    "first, on every host.")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "With --distributed: number of processes (hosts); "
    "default: detected from the cluster.")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "With --distributed: this process's index in "
    "[0, num_processes); default: detected from the cluster.")
flags.mark_flags_as_required(["config", "workdir"])


def run(config, workdir) -> train_state.TrainState:
  """Validate `config`, then train (or resume) it in `workdir`."""
  # Refuse before building or compiling anything, and before the config
  # is printed, so that the refusal is the last line of the output.
  config_lib.validate_config(config)
  workdir_lib.check_free(workdir)
  logging.info("Config:\n%s", config)
  # As every command that trains (cli.main): XLA's per-step scratch
  # reuses the last step's pages instead of faulting in fresh ones
  # (host_memory's docstring); MHA_JAX_KEEP_FREED_MEMORY=0 opts out.
  host_memory.keep_freed_memory()
  state = train.train_and_evaluate(config, workdir)
  logging.info("Done; metrics in %s/metrics.jsonl", workdir)
  return state


def main(argv):
  report_lib.check_no_arguments(argv)
  if _DISTRIBUTED.value:
    # Must run before anything asks JAX for devices: afterwards
    # jax.devices() lists every host's devices and the mesh spans them all.
    jax.distributed.initialize(num_processes=_NUM_PROCESSES.value,
                               process_id=_PROCESS_ID.value)
    logging.info("Process %d of %d, %d local / %d global devices",
                 jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count())
  # A bad config value or a workdir in use ends in one line (cli.run_app).
  run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run_app(main)
