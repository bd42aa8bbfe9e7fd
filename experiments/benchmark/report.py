"""Side-by-side attention benchmark, reporting: table.md from the results.

`write` turns what `run.measure` returned ({"meta", "rows", "train_step",
"window_scaling"}) into table.md (one table per shape, a row per path) and
results.json; nothing here times anything. The prose is report.md.tmpl
beside this file; `render` fills it from results.json alone, so a run's
table regenerates from its results.json. The tables are one value each;
a section that was not measured is empty.
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import machine
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
PEERS = ("torch", "torch_compile", "transformer_lens")  # the train-step peers


def write(config, results, workdir) -> dict:
  """The report (`config.report_name`, table.md by default; printed too)
  and results.json in `workdir`; returns what results.json holds."""
  name = config.report_name
  written = report_lib.write_rendered(workdir, results, render,
                                      config=config, name=name, echo=True)
  print(f"\nDone in {written['meta']['seconds']:.0f} s: "
        f"{pathlib.Path(workdir) / name}")
  return written


def render(saved: dict) -> str:
  """table.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved))


def _fmt(x, digits=1) -> str:
  """`x` to `digits` decimals; "-" where it was not measured."""
  return "-" if x is None else report_lib.fmt(x, digits=digits)


def _sections(blocks) -> str:
  """Blocks (a heading and its table) each followed by a blank line; ""
  for none, so an unmeasured section leaves no trace."""
  return "".join(b + "\n\n" for b in blocks)


def _shape_key(r) -> tuple:
  """What one shape table shares: set, length, mask, dtype and modes."""
  return (r["set"], r["n"], r["causal"], r["dtype"], tuple(r["modes"]))


def _shape_row(r, modes, torch) -> list:
  """One path's cells: per mode time, GFLOP/s, % of matmul, ratios; then
  the last mode's peak RSS and XLA scratch."""
  if r.get("skipped"):
    return [r["path"], f"skipped: {r['skipped']}"]
  cells = [r["path"]]
  for m in modes:
    cells += [_fmt(r.get(m + "_ms")), _fmt(r.get(m + "_gflops")),
              _fmt(r.get(m + "_pct_mm"), 0), _fmt(r.get(m + "_x_anchor"), 2)]
    cells += [_fmt(r.get(m + "_x_torch"), 2)] if m in torch else []
  rss, temp = r.get(f"{modes[-1]}_rss"), r.get(f"{modes[-1]}_xla_temp")
  return cells + [_fmt(rss and rss / 2**20, 0),
                  _fmt(r.get(modes[-1] + "_rss_x_anchor"), 2),
                  _fmt(temp and temp / 2**20, 0)]


def _shape_block(group) -> str:
  """One shape's heading and table, a row per path; an "x torch" column
  only where torch was timed (it is optional)."""
  s, modes = group[0], group[0]["modes"]
  window = f" window={s['window']}" if s.get("window") else ""
  torch = [m for m in modes if any(m + "_x_torch" in r for r in group)]
  head = ["path"]
  for m in modes:
    head += [f"{m} ms", f"{m} GFLOP/s", f"{m} % mm", f"{m} x anchor"]
    head += [f"{m} x torch"] if m in torch else []
  head += ["peak RSS MiB", "RSS x anchor", "XLA temp MiB"]
  return (f"### {s['set']}: B={s['B']} n={s['n']} D={s['D']} h={s['h']} "
          f"{s['dtype']} causal={s['causal']}{window}\n\n"
          + report_lib.md_table(head, [_shape_row(r, modes, torch)
                                       for r in group]))


def shape_tables(rows) -> str:
  """One table per shape, in the order measured."""
  keys = dict.fromkeys(_shape_key(r) for r in rows)
  return _sections(_shape_block([r for r in rows if _shape_key(r) == k])
                   for k in keys)


def _ratio(r, peer) -> str:
  """The median over rounds of this path's step time / the peer's, and
  its range."""
  x = r.get(f"x_{peer}")
  return "-" if x is None else (f"{x['median']:.2f} "
                                f"({x['min']:.2f}-{x['max']:.2f})")


def _roofline(r) -> str:
  """The step's share of the same-run matmul rate, in percent, and its
  range over rounds; "-" for a run before the roofline was measured."""
  x = r.get("roofline")
  return "-" if x is None else (f"{100 * x['median']:.0f} "
                                f"({100 * x['min']:.0f}-{100 * x['max']:.0f})")


def _step_block(group) -> str:
  """One train-step shape's heading and table: ms per step, its share of
  the plain matmul rate and, per PyTorch peer timed, the ratio to it."""
  s = group[0]
  peers = [p for p in PEERS if any(f"x_{p}" in r for r in group)]
  rows = [[r["path"], f"skipped: {r['skipped']}"] if r.get("skipped")
          else [r["path"], _fmt(r["step_ms"]), _roofline(r)]
          + [_ratio(r, p) for p in peers]
          for r in group]
  roof = ""
  if "matmul_gflop" in s:
    rate = sorted(s["matmul_gflops"])[len(s["matmul_gflops"]) // 2]
    roof = (f"Matmul work per step: {s['matmul_gflop']:.3g} GFLOP; plain "
            f"{s['matmul_n']}^3 float32 matmul in the same rounds: "
            f"{rate:.1f} GFLOP/s (median).\n\n")
  if s.get("host_devices", 1) > 1:
    roof += (f"mha_jax's paths train on a data mesh of {s['host_devices']} "
             "host devices (the batch split over them); the peers as "
             "always.\n\n")
  return (f"### train_step: {s['shape']} (L={s['L']} H={s['H']} D={s['D']} "
          f"T={s['T']} B={s['B']} V={s['V']})\n\n" + roof
          + report_lib.md_table(["path", "ms per step",
                                 "% of matmul rate (range)"]
                                + [f"x {p} (range)" for p in peers], rows))


def train_step_tables(rows) -> str:
  """One table per train-step shape, in the order measured."""
  shapes = dict.fromkeys(r["shape"] for r in rows)
  return _sections(_step_block([r for r in rows if r["shape"] == shape])
                   for shape in shapes)


def window_scaling(scaling) -> str:
  """Each path's sliding-window time at the longest n against its time at
  the shortest scaled by the length ratio (`run.window_scaling`)."""
  lines = [f"- {w['path']}: fwd+bwd at n={w['n_long']} is "
           f"{w['time_x_linear']:.2f}x its n={w['n_short']} time scaled by "
           f"{w['n_long'] / w['n_short']:g} (1.00 = linear in n); peak RSS "
           f"grew {w['rss_growth']:.2f}x." for w in scaling]
  return _sections(["### window: time against length\n\n" + "\n".join(lines)]
                   if lines else [])


def values(saved: dict) -> dict:
  """The template's values, each written as the report shows it."""
  meta, mm = saved["meta"], saved["meta"]["matmul_gflops"]
  return {
      "argv": " ".join(meta["argv"]),
      "date": meta["date"],
      "jax": meta["jax"],
      "backend": meta["backend"],
      "cpus": str(meta["cpus"]),
      "cpu": (machine.describe(meta["isa"]) if "isa" in meta
              else "not recorded"),
      "torch": str(meta.get("torch")),
      "transformer_lens": str(meta.get("transformer_lens")),
      "load_start": report_lib.fmt(meta["load_avg_start"][0], digits=1),
      "load_end": report_lib.fmt(meta["load_avg_end"][0], digits=1),
      "matmul_n": str(saved["config"]["matmul_n"]),
      "matmul_float32": report_lib.fmt(mm["float32"], digits=1),
      "matmul_bfloat16": report_lib.fmt(mm["bfloat16"], digits=1),
      "shape_tables": shape_tables(saved["rows"]),
      "window_scaling": window_scaling(saved["window_scaling"]),
      "train_step_tables": train_step_tables(saved.get("train_step", ())),
  }
