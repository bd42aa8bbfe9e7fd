r"""mha_jax on one accelerator against PyTorch and transformers.

  python -m experiments.gpu_bench --workdir=runs/gpu_bench

Writes report.md and results.json into --workdir (again after each part,
so a run stopped early keeps what it finished). What is measured:
configs/gpu_bench.py and each part's module (train_steps.py, lms.py,
long_context.py, policy.py); the tables: report.py. `make gpu-check`
(scripts/gpu_check.sh) runs it on a GPU and copies the report into
docs/gpu.md. Run it with XLA_PYTHON_CLIENT_PREALLOCATE=false on a GPU:
JAX and torch share the device in this process.
"""

from __future__ import annotations

from experiments import cli
from experiments.gpu_bench import report
from experiments.gpu_bench import run as run_lib

_FLAGS = cli.experiment_flags(config="configs/gpu_bench.py",
                              workdir="runs/gpu_bench")


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure (run.py), writing the report (report.py) after each part;
  nothing is trained, so `reuse_runs` changes nothing, and the report
  names no command."""
  del reuse_runs, command
  results = run_lib.measure(
      config, on_part=lambda r: report.write(config, r, workdir))
  return report.write(config, results, workdir)


if __name__ == "__main__":
  cli.main(run, _FLAGS)
