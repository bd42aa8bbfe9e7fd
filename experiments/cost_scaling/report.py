"""The source's cost claims, reporting: each claim beside its measured number.

`write` turns what `run.measure` returned into report.md, PNG plots and
results.json; nothing here measures. The prose is report.md.tmpl beside
this file; `render` fills it from results.json alone (the slopes and
ratios are computed while measuring), so a report regenerates from its
results.json.
"""

from __future__ import annotations

import pathlib

from experiments.cost_scaling import scaling
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir) -> dict:
  """report.md (printed too), results.json and the plots in `workdir`;
  returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  heads_pts, n_pts = results["heads"], results["length"]
  _plot(heads_pts, "h", "time_ms", "forward ms", "time vs heads",
        "time_vs_heads.png", workdir, loglog=False)
  _plot(heads_pts, "h", "train_temp_bytes", "fwd+bwd scratch bytes",
        "memory vs heads", "memory_vs_heads.png", workdir, loglog=True)
  _plot(n_pts, "n", "time_ms", "forward ms", "time vs n", "time_vs_n.png",
        workdir, loglog=True)
  _plot(n_pts, "n", "train_temp_bytes", "fwd+bwd scratch bytes",
        "memory vs n", "memory_vs_n.png", workdir, loglog=True)
  return report_lib.write_rendered(workdir, results, render, config=config,
                                   echo=True)


def render(saved: dict) -> str:
  """report.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved))


def _plot(points, along, key, ylabel, title, filename, workdir, loglog):
  """One measure of every path against `along` (log2 x axis)."""
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


def _gflop(p) -> str:
  """XLA's forward FLOPs of a point in GFLOP; "-" where not counted."""
  return report_lib.fmt(p["xla_flops"] / 1e9) if "xla_flops" in p else "-"


def _mib(x) -> str:
  return report_lib.fmt(x / 2**20, digits=1)


def _head_claims(effects) -> str:
  """Each path's time and memory against h, beside the claims."""
  lines = []
  for path, e in effects.items():
    lines.append(f"- {path}: time max/min over h = "
                 f"{e['time_max_over_min']:.2f} (claim: flat, 1.00); scratch "
                 f"memory slope vs h = {e['memory_slope']:.2f} (claim O(h "
                 "n^2): 1 where the weights dominate)")
    if "xla_flops_max_over_min" in e:
      lines.append(f"- {path}: XLA FLOPs max/min over h = "
                   f"{e['xla_flops_max_over_min']:.3f} (claim: independent "
                   "of h)")
  return "\n".join(lines)


def _length_claims(slopes) -> str:
  """Each path's fitted slopes against n, beside the claims; then the
  einsum path's FLOP slope."""
  lines = [f"- {path}: time slope {s['time']:.2f} (claim: about 2 at large "
           f"n); memory slope {s['memory']:.2f} (claim: "
           f"{'1 (blockwise)' if path == 'flash' else '2 (weights)'})"
           for path, s in slopes.items()]
  if "xla_flops" in slopes.get("einsum", {}):
    lines.append("- XLA FLOPs slope (einsum): "
                 f"{slopes['einsum']['xla_flops']:.2f}")
  return "\n".join(lines)


def values(saved: dict) -> dict:
  """The template's values, each written as the report shows it."""
  heads, length = saved["heads"], saved["length"]
  time_ms = lambda p: report_lib.fmt(p["time_ms"], digits=1)
  return {
      "took_s": f"{saved['took_s']:.0f}",
      "jax": saved["jax"],
      "backend": saved["backend"],
      "head_n": str(heads[0]["n"]),
      "head_d": str(heads[0]["D"]),
      "head_b": str(heads[0]["B"]),
      "heads_table": report_lib.md_table(
          ["path", "h", "time ms", "XLA GFLOP", "closed-form GFLOP",
           "fwd+bwd scratch MiB"],
          [[p["path"], p["h"], time_ms(p), _gflop(p),
            report_lib.fmt(p["analytic_flops"] / 1e9),
            _mib(p["train_temp_bytes"])] for p in heads]),
      "head_claims": _head_claims(saved["head_effects"]),
      "length_h": str(length[0]["h"]),
      "length_d": str(length[0]["D"]),
      "length_b": str(length[0]["B"]),
      "length_table": report_lib.md_table(
          ["path", "n", "time ms", "XLA GFLOP", "fwd+bwd scratch MiB"],
          [[p["path"], p["n"], time_ms(p), _gflop(p),
            _mib(p["train_temp_bytes"])] for p in length]),
      "fit_points": str(saved["config"]["fit_points"]),
      "length_claims": _length_claims(saved["slopes"]),
  }
