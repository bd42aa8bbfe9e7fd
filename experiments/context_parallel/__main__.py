r"""Context parallelism on simulated CPU devices: memory and a long run.

  .venv/bin/python -m experiments.context_parallel --workdir=runs/context_parallel

About 4 minutes on 2 idle CPU cores (configs/context_parallel.py says what is
measured; `--config.experiment.long_len=0` skips the long run). Starts
itself again with `experiment.devices` simulated CPU devices when fewer
exist, then writes report.md and results.json into the workdir.
"""

from __future__ import annotations

import os
import sys

from absl import flags
import jax

from experiments import cli
from experiments.context_parallel import report
from experiments.context_parallel import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = cli.config_flag("configs/context_parallel.py",
                          "What to measure; override fields as "
                          "--config.experiment.long_len=...")
_WORKDIR = flags.DEFINE_string("workdir", "runs/context_parallel",
                               "Output folder.")


def run(config, workdir, command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py),
  naming `command` (None: called from Python)."""
  return report.write(config, run_lib.measure(config), workdir, command)


def main(argv):
  report_lib.check_no_arguments(argv)
  need = _CONFIG.value.experiment.devices
  if jax.device_count() < need:
    # Simulated devices exist only if XLA_FLAGS is set before JAX starts.
    os.execve(sys.executable,
              [sys.executable, "-m", "experiments.context_parallel",
               *sys.argv[1:]], cli.env_with_devices(need))
  run(_CONFIG.value, _WORKDIR.value, cli.command_line())


if __name__ == "__main__":
  cli.run_app(main)
