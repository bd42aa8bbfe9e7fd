r"""The source's cost claims, measured: time, FLOPs and memory vs h and vs n.

    python -m experiments.cost_scaling                  # ~3 min on 2 cores
    python -m experiments.cost_scaling --config.n=256,512,1024,2048,4096,8192

Writes report.md (each claim next to its measured number), results.json and
PNG plots into `--workdir` (runs/cost_scaling). Sizes, paths and repeats
are fields of configs/cost_scaling.py.

What is measured, and how, is `experiments.cost_scaling.scaling`'s docstring; slopes are
fitted over the `fit_points` largest n.
"""

from __future__ import annotations

import pathlib
import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from mha_jax.measure import report as report_lib
from experiments.cost_scaling import scaling
from mha_jax.measure import plots
from mha_jax.measure import timing

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/cost_scaling.py", "The measurement's config file; "
    "override fields as --config.n=256,512", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/cost_scaling", "Output folder.")


def _plot(points, along, key, ylabel, title, filename, workdir, loglog):
  fig, ax = plots.subplots(figsize=(5, 3.5))
  for path in sorted({p["path"] for p in points}):
    xs, ys = scaling.series(points, path, key, along)
    if xs:
      ax.plot(xs, ys, marker="o", label=path)
  ax.set_xscale("log", base=2)
  if loglog:
    ax.set_yscale("log")
  ax.set_xlabel(along)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(workdir / filename, dpi=120)


def report(heads_pts, n_pts, fit_points):
  """report.md lines: each claim beside the measured figure."""
  lines = ["# Cost claims, measured", ""]
  lines.append(f"## Against the head count (n={heads_pts[0]['n']}, "
               f"D={heads_pts[0]['D']}, B={heads_pts[0]['B']})")
  lines += ["", "| path | h | time ms | XLA GFLOP | closed-form GFLOP | "
            "fwd+bwd scratch MiB |", "|---|---|---|---|---|---|"]
  for p in heads_pts:
    lines.append(f"| {p['path']} | {p['h']} | {p['time_ms']:.1f} | "
                 + (f"{p['xla_flops'] / 1e9:.3f}" if "xla_flops" in p else "-")
                 + f" | {p['analytic_flops'] / 1e9:.3f} | "
                 f"{p['train_temp_bytes'] / 2**20:.1f} |")
  lines.append("")
  for path in sorted({p["path"] for p in heads_pts}):
    hs, ts = scaling.series(heads_pts, path, "time_ms", "h")
    _, ms = scaling.series(heads_pts, path, "train_temp_bytes", "h")
    lines.append(f"- {path}: time max/min over h = {max(ts) / min(ts):.2f}"
                 f" (claim: flat, 1.00); scratch memory slope vs h = "
                 f"{timing.loglog_slope(hs, ms):.2f} (claim O(h n^2): 1 where the "
                 "weights dominate)")
    fh, fl = scaling.series(heads_pts, path, "xla_flops", "h")
    if fl:
      lines.append(f"- {path}: XLA FLOPs max/min over h = "
                   f"{max(fl) / min(fl):.3f} (claim: independent of h)")
  lines += ["", f"## Against the length (h={n_pts[0]['h']}, "
            f"D={n_pts[0]['D']}, B={n_pts[0]['B']})", "",
            "| path | n | time ms | XLA GFLOP | fwd+bwd scratch MiB |",
            "|---|---|---|---|---|"]
  for p in n_pts:
    lines.append(f"| {p['path']} | {p['n']} | {p['time_ms']:.1f} | "
                 + (f"{p['xla_flops'] / 1e9:.3f}" if "xla_flops" in p else "-")
                 + f" | {p['train_temp_bytes'] / 2**20:.1f} |")
  lines += ["", f"Log-log slopes over the {fit_points} largest n:", ""]
  slopes = scaling.length_slopes(n_pts, fit_points)
  for path, s in slopes.items():
    st, sm = s["time"], s["memory"]
    want_mem = "1 (blockwise)" if path == "flash" else "2 (weights)"
    lines.append(f"- {path}: time slope {st:.2f} (claim: about 2 at large n);"
                 f" memory slope {sm:.2f} (claim: {want_mem})")
  ns, fl = scaling.series(n_pts, "einsum", "xla_flops", "n")
  if fl:
    lines.append(f"- XLA FLOPs slope (einsum): "
                 f"{timing.loglog_slope(ns[-fit_points:], fl[-fit_points:]):.2f}")
  return lines, slopes


def run(config, workdir) -> dict:
  """Both sweeps; write report.md, results.json and the plots.

  Returns what results.json holds: {"heads": points, "length": points,
  "slopes": {path: {"time", "memory"}}}.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  start = time.time()
  heads_pts, n_pts = scaling.sweep(config)
  lines, slopes = report(heads_pts, n_pts, config.fit_points)
  lines = [lines[0], "", "Command: python -m experiments.cost_scaling "
           f"(took {time.time() - start:.0f} s, jax {jax.__version__}, "
           f"{jax.default_backend()})"] + lines[1:]
  results = report_lib.write_outputs(
      workdir, {"heads": heads_pts, "length": n_pts, "slopes": slopes},
      "\n".join(lines))
  _plot(heads_pts, "h", "time_ms", "forward ms", "time vs heads",
        "time_vs_heads.png", workdir, loglog=False)
  _plot(heads_pts, "h", "train_temp_bytes", "fwd+bwd scratch bytes",
        "memory vs heads", "memory_vs_heads.png", workdir, loglog=True)
  _plot(n_pts, "n", "time_ms", "forward ms", "time vs n", "time_vs_n.png",
        workdir, loglog=True)
  _plot(n_pts, "n", "train_temp_bytes", "fwd+bwd scratch bytes",
        "memory vs n", "memory_vs_n.png", workdir, loglog=True)
  print("\n".join(lines))
  return results


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
