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

import json
import os
import pathlib
import sys
import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from mha_jax.measure import report as report_lib
from experiments.benchmark import bench

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/benchmark.py", "The benchmark's config file; override "
    "fields as --config.sets=standard,bf16", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/benchmark", "Output folder.")


def _fmt(x, spec=".1f"):
  return "-" if x is None else format(x, spec)


def markdown(rows, mm, matmul_n=2048):
  """One table per shape; a row per path; skipped paths say why."""
  out = [f"Plain matmul ({matmul_n}^3, same run): {mm['float32']:.1f} "
         f"GFLOP/s float32, {mm['bfloat16']:.1f} GFLOP/s bfloat16.", ""]
  keys = []
  for r in rows:
    key = (r["set"], r["n"], r["causal"], r["dtype"], tuple(r["modes"]))
    if key not in keys:
      keys.append(key)
  for key in keys:
    group = [r for r in rows if (r["set"], r["n"], r["causal"], r["dtype"],
                                 tuple(r["modes"])) == key]
    s = group[0]
    window = f" window={s['window']}" if s.get("window") else ""
    out.append(f"### {s['set']}: B={s['B']} n={s['n']} D={s['D']} h={s['h']}"
               f" {s['dtype']} causal={s['causal']}{window}")
    out.append("")
    # A "x torch" column only where torch was timed (it is optional).
    torch = [m for m in s["modes"] if any(m + "_x_torch" in r for r in group)]
    head = "| path |"
    for m in s["modes"]:
      head += f" {m} ms | {m} GFLOP/s | {m} % mm | {m} x anchor |"
      head += f" {m} x torch |" if m in torch else ""
    head += " peak RSS MiB | RSS x anchor | XLA temp MiB |"
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    last = s["modes"][-1]
    for r in group:
      line = f"| {r['path']} |"
      if r.get("skipped"):
        out.append(line + f" skipped: {r['skipped']} |")
        continue
      for m in s["modes"]:
        line += (f" {_fmt(r.get(m + '_ms'))} | {_fmt(r.get(m + '_gflops'))} |"
                 f" {_fmt(r.get(m + '_pct_mm'), '.0f')} |"
                 f" {_fmt(r.get(m + '_x_anchor'), '.2f')} |")
        if m in torch:
          line += f" {_fmt(r.get(m + '_x_torch'), '.2f')} |"
      rss = r.get(f"{last}_rss")
      temp = r.get(f"{last}_xla_temp")
      line += (f" {_fmt(rss and rss / 2**20, '.0f')} |"
               f" {_fmt(r.get(last + '_rss_x_anchor'), '.2f')} |"
               f" {_fmt(temp and temp / 2**20, '.0f')} |")
      out.append(line)
    out.append("")
  out += window_scaling(rows)
  return "\n".join(out)


def window_scaling(rows) -> list[str]:
  """Lines comparing each path's sliding-window time at the longest n
  with its time at the shortest scaled by the length ratio (1.0 = linear
  in n), for time and peak RSS."""
  timed = [r for r in rows if r["set"] == "window" and "fwdbwd_ms" in r]
  lines = []
  for path in dict.fromkeys(r["path"] for r in timed):
    mine = sorted((r for r in timed if r["path"] == path),
                  key=lambda r: r["n"])
    if len(mine) < 2:
      continue
    lo, hi = mine[0], mine[-1]
    grow = hi["n"] / lo["n"]
    lines.append(
        f"- {path}: fwd+bwd at n={hi['n']} is "
        f"{hi['fwdbwd_ms'] / (grow * lo['fwdbwd_ms']):.2f}x its n={lo['n']} "
        f"time scaled by {grow:g} (1.00 = linear in n); peak RSS grew "
        f"{hi['fwdbwd_rss'] / lo['fwdbwd_rss']:.2f}x.")
  return (["### window: time against length", ""] + lines + [""]
          if lines else [])


def run(config, workdir) -> dict:
  """Time every (set, shape, path); write table.md and results.json.

  Returns what results.json holds: {"meta": ..., "rows": [...]}.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  start = time.time()
  load_start = os.getloadavg()
  rows, mm = bench.sweep(config)
  meta = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
          "backend": jax.default_backend(), "cpus": os.cpu_count(),
          "matmul_gflops": mm, "load_avg_start": load_start,
          "load_avg_end": os.getloadavg(), "argv": sys.argv[1:],
          "config": config.to_dict(), "seconds": time.time() - start}
  results = {"meta": meta, "rows": rows}
  (workdir / "results.json").write_text(json.dumps(results, indent=1))
  table = markdown(rows, mm, config.matmul_n)
  (workdir / "table.md").write_text(
      f"Command: python -m experiments.benchmark {' '.join(sys.argv[1:])}\n"
      f"({meta['date']}, jax {meta['jax']}, {meta['backend']}, "
      f"{meta['cpus']} CPUs, load average {load_start[0]:.1f} at start, "
      f"{meta['load_avg_end'][0]:.1f} at end)\n\n" + table)
  print(table)
  print(f"Done in {meta['seconds']:.0f} s: {workdir / 'table.md'}")
  return results


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
