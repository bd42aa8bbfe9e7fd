"""Side-by-side attention benchmark, measuring: time every case.

`measure` times every (shape set, shape, path) of `configs/benchmark.py`,
each case in its own process (`experiments.benchmark.bench`), with the
machine and load it ran on.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import jax

from experiments.benchmark import bench


def measure(config, workdir) -> dict:
  """{"meta": the date, versions, machine, load, argv, config and seconds;
  "rows": one dict per (set, shape, path), `bench.sweep`'s}."""
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  start = time.time()
  load_start = os.getloadavg()
  rows, mm = bench.sweep(config)
  meta = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
          "backend": jax.default_backend(), "cpus": os.cpu_count(),
          "matmul_gflops": mm, "load_avg_start": load_start,
          "load_avg_end": os.getloadavg(), "argv": sys.argv[1:],
          "config": config.to_dict(), "seconds": time.time() - start}
  return {"meta": meta, "rows": rows}
