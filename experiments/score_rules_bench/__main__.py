r"""User rules on long sequences: the blockwise kernel with block skipping
against itself without, the dense einsum path and PyTorch's FlexAttention.

  nice .venv/bin/python -m experiments.score_rules_bench \
      --workdir=docs/results/score_rules_bench

Writes report.md and results.json into `--workdir`. Sizes, rules and
repeats are fields of configs/score_rules_bench.py; what is timed is
`experiments.score_rules_bench.run`'s docstring.
"""

from __future__ import annotations

from absl import flags

from experiments import cli
from experiments.score_rules_bench import report
from experiments.score_rules_bench import run as run_lib
from mha_jax.measure import report as report_lib

_CONFIG = cli.config_flag(
    "configs/score_rules_bench.py", "The benchmark's config file; override "
    "fields as --config.sizes=8192")
_WORKDIR = flags.DEFINE_string("workdir", "runs/score_rules_bench",
                               "Output folder.")


def run(config, workdir, command: str | None = None) -> dict:
  """Measure (run.py), then write report.md and results.json (report.py),
  naming `command` (None: called from Python)."""
  return report.write(config, run_lib.measure(config), workdir, command)


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, cli.command_line())


if __name__ == "__main__":
  cli.run_app(main)
