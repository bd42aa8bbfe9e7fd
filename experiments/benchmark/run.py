"""Side-by-side attention benchmark, measuring: time every case.

`measure` times every (shape set, shape, path) of `configs/benchmark.py`,
each case in its own process (`experiments.benchmark.bench`), with the
machine and load it ran on, and derives how the sliding-window times grow
with length (`window_scaling`), so results.json holds every number the
table shows.
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
from mha_jax.measure import machine
from mha_jax.training import host_memory


def measure(config, workdir) -> dict:
  """{"meta": the date, versions, machine, load, argv, config and seconds;
  "rows": one dict per (set, shape, path), `bench.sweep`'s; "train_step":
  one dict per (shape, path) of the train-step set, `train_step.sweep`'s
  (empty when that set is not chosen); "window_scaling": `window_scaling`
  of the rows}."""
  if config.keep_freed_memory:  # the default, as in the training loop
    host_memory.keep_freed_memory()
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  start = time.time()
  load_start = os.getloadavg()
  rows, mm = bench.sweep(config)
  steps = (train_step.sweep(config)
           if "train_step" in bench.names(config.sets) else [])
  meta = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
          "backend": jax.default_backend(), "cpus": os.cpu_count(),
          "isa": machine.instruction_sets(),
          "matmul_gflops": mm, "load_avg_start": load_start,
          "load_avg_end": os.getloadavg(), "argv": sys.argv[1:],
          "config": config.to_dict(), "seconds": time.time() - start}
  meta["torch"] = _version("torch")
  meta["transformer_lens"] = _version("transformer_lens")
  return {"meta": meta, "rows": rows, "train_step": steps,
          "window_scaling": window_scaling(rows)}


def window_scaling(rows) -> list[dict]:
  """Per path timed in the "window" set at two lengths or more: its
  fwd+bwd time at the longest n over its time at the shortest scaled by
  the length ratio ("time_x_linear", 1.0 = linear in n) and how much its
  peak RSS grew ("rss_growth")."""
  timed = [r for r in rows if r["set"] == "window" and "fwdbwd_ms" in r]
  out = []
  for path in dict.fromkeys(r["path"] for r in timed):
    mine = sorted((r for r in timed if r["path"] == path),
                  key=lambda r: r["n"])
    if len(mine) < 2:
      continue
    lo, hi = mine[0], mine[-1]
    grow = hi["n"] / lo["n"]
    out.append({"path": path, "n_short": lo["n"], "n_long": hi["n"],
                "time_x_linear": hi["fwdbwd_ms"] / (grow * lo["fwdbwd_ms"]),
                "rss_growth": hi["fwdbwd_rss"] / lo["fwdbwd_rss"]})
  return out


def _version(package):
  """The installed version of an optional peer, or None."""
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None
