r"""The source's cost claims, measured: time, FLOPs and memory vs h and vs n.

    python -m experiments.cost_scaling                  # ~3 min on 2 cores
    python -m experiments.cost_scaling --config.n=256,512,1024,2048,4096,8192

Writes report.md (each claim next to its measured number), results.json and
PNG plots into `--workdir` (runs/cost_scaling). Sizes, paths and repeats
are fields of configs/cost_scaling.py.

What is measured, and how, is `experiments.cost_scaling.scaling`'s
docstring; slopes are fitted over the `fit_points` largest n.
"""

from __future__ import annotations

from absl import flags

from experiments import cli
from experiments.cost_scaling import report
from experiments.cost_scaling import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = cli.config_flag(
    "configs/cost_scaling.py", "The measurement's config file; "
    "override fields as --config.n=256,512")
_WORKDIR = flags.DEFINE_string("workdir", "runs/cost_scaling", "Output folder.")


def run(config, workdir) -> dict:
  """Both sweeps (run.py); write report.md, results.json and the plots
  (report.py).

  Returns what results.json holds: {"heads": points, "length": points,
  "slopes", "head_effects", "took_s", "jax", "backend", "config"}.
  """
  results = run_lib.measure(config, workdir)
  return report.write(config, results, workdir)


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run_app(main)
