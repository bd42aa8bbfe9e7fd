r"""One config trained on one device and on a 2x4 mesh: the same loss curve?

  python -m experiments.mesh_check --workdir=runs/mesh_check

About 3 minutes on 2 CPU cores. Runs the training entry point twice, each
in its own process, with the same (shortened) config, configs/mesh_check.py
(the model and task of configs/copy.py; its `experiment` group sets the
steps and the mesh, e.g. `--config.experiment.steps=300`):

  one device:  python -m experiments.train --config=configs/mesh_check.py ...
  2x4 mesh:    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
               python -m experiments.train --config=configs/mesh_check.py \
               ... --config.mesh.data=2 --config.mesh.model=4

then loads both final checkpoints and writes report.md / results.json:
the largest loss difference per logged step, the largest parameter
difference at the end, and the parameter bytes each device holds (every
split leaf must hold 1 / mesh.model of itself). Eight simulated devices
share the same CPU cores, so the wall times are NOT a speed claim.
"""

from __future__ import annotations

import os
import sys

from absl import flags
import jax
from ml_collections import config_flags

from experiments import cli
from experiments.mesh_check import report
from experiments.mesh_check import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = cli.config_flag(
    "configs/mesh_check.py", "The config both runs train; "
    "override fields as --config.experiment.steps=...")
_WORKDIR = flags.DEFINE_string("workdir", "runs/mesh_check", "Output folder.")


def run(config, workdir, config_args, command: str | None = None) -> dict:
  """Train and compare (run.py), then write the report (report.py).

  `config_args` are the `--config=...` arguments that give the training
  entry point `config`; `command` is the command line the report names
  (None: called from Python).
  """
  results = run_lib.measure(config, workdir, config_args)
  return report.write(config, results, workdir, command)


def main(argv):
  report_lib.check_no_arguments(argv)
  e = _CONFIG.value.experiment
  need = e.data * e.model
  if jax.device_count() < need:
    # The analysis needs the devices too; they exist only if XLA_FLAGS is
    # set before JAX starts, so start again with it.
    os.execve(sys.executable, [sys.executable, "-m", "experiments.mesh_check",
                               *sys.argv[1:]], cli.env_with_devices(need))
  # The children read the same file with the same command-line overrides.
  flag = flags.FLAGS["config"]
  config_args = [f"--config={config_flags.get_config_filename(flag)}"] + [
      f"--config.{k}={v}"
      for k, v in config_flags.get_override_values(flag).items()]
  run(_CONFIG.value, _WORKDIR.value, config_args, cli.command_line())


if __name__ == "__main__":
  cli.run_app(main)
