"""The source's cost claims, reporting: each claim beside its measured number.

`write` turns the results dict of `run.measure` into report.md, PNG plots
and results.json.
"""

from __future__ import annotations

import pathlib

import jax

from experiments.cost_scaling import scaling
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib
from mha_jax.measure import timing

# Kept out of results.json: the wall time, which the report names.
_NOT_SAVED = ("took_s",)


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


def _gflop(x) -> str:
  return report_lib.fmt(x / 1e9)


def _mib(x) -> str:
  return report_lib.fmt(x / 2**20, digits=1)


def _heads_lines(heads_pts) -> list[str]:
  """The table against h, then each path's claims."""
  p0 = heads_pts[0]
  lines = [f"## Against the head count (n={p0['n']}, D={p0['D']}, "
           f"B={p0['B']})", "", report_lib.md_table(
               ["path", "h", "time ms", "XLA GFLOP", "closed-form GFLOP",
                "fwd+bwd scratch MiB"],
               [[p["path"], p["h"], report_lib.fmt(p["time_ms"], digits=1),
                 _gflop(p["xla_flops"]) if "xla_flops" in p else "-",
                 _gflop(p["analytic_flops"]), _mib(p["train_temp_bytes"])]
                for p in heads_pts]), ""]
  for path in sorted({p["path"] for p in heads_pts}):
    hs, ts = scaling.series(heads_pts, path, "time_ms", "h")
    _, ms = scaling.series(heads_pts, path, "train_temp_bytes", "h")
    lines.append(f"- {path}: time max/min over h = {max(ts) / min(ts):.2f}"
                 f" (claim: flat, 1.00); scratch memory slope vs h = "
                 f"{timing.loglog_slope(hs, ms):.2f} (claim O(h n^2): 1 where "
                 "the weights dominate)")
    _, fl = scaling.series(heads_pts, path, "xla_flops", "h")
    if fl:
      lines.append(f"- {path}: XLA FLOPs max/min over h = "
                   f"{max(fl) / min(fl):.3f} (claim: independent of h)")
  return lines


def _length_lines(n_pts, slopes, fit_points) -> list[str]:
  """The table against n, then the fitted slopes beside the claims."""
  p0 = n_pts[0]
  lines = ["", f"## Against the length (h={p0['h']}, D={p0['D']}, "
           f"B={p0['B']})", "", report_lib.md_table(
               ["path", "n", "time ms", "XLA GFLOP", "fwd+bwd scratch MiB"],
               [[p["path"], p["n"], report_lib.fmt(p["time_ms"], digits=1),
                 _gflop(p["xla_flops"]) if "xla_flops" in p else "-",
                 _mib(p["train_temp_bytes"])] for p in n_pts]),
           "", f"Log-log slopes over the {fit_points} largest n:", ""]
  for path, s in slopes.items():
    want_mem = "1 (blockwise)" if path == "flash" else "2 (weights)"
    lines.append(f"- {path}: time slope {s['time']:.2f} (claim: about 2 at "
                 f"large n); memory slope {s['memory']:.2f} (claim: "
                 f"{want_mem})")
  ns, fl = scaling.series(n_pts, "einsum", "xla_flops", "n")
  if fl:
    slope = timing.loglog_slope(ns[-fit_points:], fl[-fit_points:])
    lines.append(f"- XLA FLOPs slope (einsum): {slope:.2f}")
  return lines


def report(config, results) -> str:
  """report.md: each claim beside the measured figure."""
  return "\n".join(
      ["# Cost claims, measured", "",
       "Command: python -m experiments.cost_scaling "
       f"(took {results['took_s']:.0f} s, jax {jax.__version__}, "
       f"{jax.default_backend()})", ""]
      + _heads_lines(results["heads"])
      + _length_lines(results["length"], results["slopes"],
                      config.fit_points))


def write(config, results, workdir) -> dict:
  """report.md (printed too), results.json and the plots in `workdir`;
  returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  text = report(config, results)
  written = report_lib.write_outputs(workdir, results, text, drop=_NOT_SAVED,
                                       config=config)
  heads_pts, n_pts = results["heads"], results["length"]
  _plot(heads_pts, "h", "time_ms", "forward ms", "time vs heads",
        "time_vs_heads.png", workdir, loglog=False)
  _plot(heads_pts, "h", "train_temp_bytes", "fwd+bwd scratch bytes",
        "memory vs heads", "memory_vs_heads.png", workdir, loglog=True)
  _plot(n_pts, "n", "time_ms", "forward ms", "time vs n", "time_vs_n.png",
        workdir, loglog=True)
  _plot(n_pts, "n", "train_temp_bytes", "fwd+bwd scratch bytes",
        "memory vs n", "memory_vs_n.png", workdir, loglog=True)
  print(text)
  return written
