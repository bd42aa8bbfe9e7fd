r"""Side-by-side attention benchmark: mha_jax's paths against the libraries.

    python -m experiments.benchmark                 # ~5 min on 2 idle cores
    python -m experiments.benchmark --config.sets=long \
        --config.long_n=32768 --config.long_fwd_n=65536 --config.repeats=1 \
        --config.warmup=0 --config.paths=flash      # the long-context targets

Writes `table.md` and `results.json` into `--workdir` (runs/benchmark). The
shape sets, paths and repeats are fields of configs/benchmark.py; how a case
is timed (one process each, medians, peak RSS, XLA scratch, ratios to the
fastest anchor) is `experiments.benchmark.bench`'s docstring.
"""

from __future__ import annotations

import os
import sys

from absl import flags
import jax

from experiments import cli
from experiments.benchmark import bench
from experiments.benchmark import report
from experiments.benchmark import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = cli.config_flag(
    "configs/benchmark.py", "The benchmark's config file; override "
    "fields as --config.sets=standard,bf16")
_WORKDIR = flags.DEFINE_string("workdir", "runs/benchmark", "Output folder.")


def run(config, workdir) -> dict:
  """Time every (set, shape, path) (run.py); write table.md and
  results.json (report.py).

  Returns what results.json holds: {"meta": ..., "rows": [...]}.
  """
  results = run_lib.measure(config, workdir)
  return report.write(config, results, workdir)


def main(argv):
  report_lib.check_no_arguments(argv)
  config = _CONFIG.value
  devices = config.train_step.host_devices
  if ("train_step" in bench.names(config.sets) and devices > 1
      and jax.device_count() != devices):
    # Host devices exist only if XLA_FLAGS is set before JAX starts.
    os.execve(sys.executable, [sys.executable, "-m", "experiments.benchmark",
                               *sys.argv[1:]], cli.env_with_devices(devices))
  run(config, _WORKDIR.value)


if __name__ == "__main__":
  cli.run_app(main)
