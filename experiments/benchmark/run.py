"""Side-by-side attention benchmark, measuring: time every case.

`measure` times every (shape set, shape, path) of `configs/benchmark.py`,
each case in its own process (`experiments.benchmark.bench`), with the
machine and load it ran on.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import sys
import time

import jax

from experiments.benchmark import bench
from experiments.benchmark import train_step


def measure(config, workdir) -> dict:
  """{"meta": the date, versions, machine, load, argv, config and seconds;
  "rows": one dict per (set, shape, path), `bench.sweep`'s; "train_step":
  one dict per (shape, path) of the train-step set, `train_step.sweep`'s
  (empty when that set is not chosen)}."""
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  start = time.time()
  load_start = os.getloadavg()
  rows, mm = bench.sweep(config)
  steps = (train_step.sweep(config)
           if "train_step" in bench.names(config.sets) else [])
  meta = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
          "backend": jax.default_backend(), "cpus": os.cpu_count(),
          "matmul_gflops": mm, "load_avg_start": load_start,
          "load_avg_end": os.getloadavg(), "argv": sys.argv[1:],
          "config": config.to_dict(), "seconds": time.time() - start}
  meta["torch"] = _version("torch")
  meta["transformer_lens"] = _version("transformer_lens")
  return {"meta": meta, "rows": rows, "train_step": steps}


def _version(package):
  """The installed version of an optional peer, or None."""
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None
