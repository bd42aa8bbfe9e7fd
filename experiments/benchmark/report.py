"""Side-by-side attention benchmark, reporting: table.md from the results.

`write` turns the results dict of `run.measure` ({"meta", "rows"}) into
table.md (one table per shape, a row per path) and results.json.
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import report as report_lib


def _fmt(x, digits=1):
  """`x` to `digits` decimals; "-" where it was not measured."""
  return "-" if x is None else report_lib.fmt(x, digits=digits)


def markdown(rows, mm, matmul_n=2048, steps=()):
  """One table per shape; a row per path; skipped paths say why; then the
  train-step tables (`steps`)."""
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
                 f" {_fmt(r.get(m + '_pct_mm'), 0)} |"
                 f" {_fmt(r.get(m + '_x_anchor'), 2)} |")
        if m in torch:
          line += f" {_fmt(r.get(m + '_x_torch'), 2)} |"
      rss = r.get(f"{last}_rss")
      temp = r.get(f"{last}_xla_temp")
      line += (f" {_fmt(rss and rss / 2**20, 0)} |"
               f" {_fmt(r.get(last + '_rss_x_anchor'), 2)} |"
               f" {_fmt(temp and temp / 2**20, 0)} |")
      out.append(line)
    out.append("")
  out += window_scaling(rows)
  out += train_step_tables(steps)
  return "\n".join(out)


def _ratio(r, peer):
  x = r.get(f"x_{peer}")
  return "-" if x is None else (f"{x['median']:.2f} "
                                f"({x['min']:.2f}-{x['max']:.2f})")


def train_step_tables(rows) -> list[str]:
  """One table per train-step shape: ms per step and, per PyTorch peer,
  the median over rounds of this path's time / the peer's (range)."""
  out = []
  for shape in dict.fromkeys(r["shape"] for r in rows):
    group = [r for r in rows if r["shape"] == shape]
    s = group[0]
    peers = [p for p in ("torch", "transformer_lens")
             if any(f"x_{p}" in r for r in group)]
    out += [f"### train_step: {shape} (L={s['L']} H={s['H']} D={s['D']} "
            f"T={s['T']} B={s['B']} V={s['V']})", ""]
    head = "| path | ms per step |" + "".join(
        f" x {p} (range) |" for p in peers)
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in group:
      if r.get("skipped"):
        out.append(f"| {r['path']} | skipped: {r['skipped']} |")
        continue
      out.append(f"| {r['path']} | {_fmt(r['step_ms'])} |"
                 + "".join(f" {_ratio(r, p)} |" for p in peers))
    out.append("")
  return out


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


def _header(meta) -> str:
  """The command and the machine the times were taken on."""
  return (f"Command: python -m experiments.benchmark "
          f"{' '.join(meta['argv'])}\n"
          f"({meta['date']}, jax {meta['jax']}, {meta['backend']}, "
          f"{meta['cpus']} CPUs, torch {meta.get('torch')}, "
          f"transformer_lens {meta.get('transformer_lens')}, "
          f"load average {meta['load_avg_start'][0]:.1f} "
          f"at start, {meta['load_avg_end'][0]:.1f} at end)\n\n")


def write(config, results, workdir) -> dict:
  """table.md (the table printed too) and results.json in `workdir`;
  returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  meta = results["meta"]
  table = markdown(results["rows"], meta["matmul_gflops"], config.matmul_n,
                   results.get("train_step", ()))
  written = report_lib.write_outputs(workdir, results, _header(meta) + table,
                                       config=config)
  # This report has always been table.md (the docs link it by that name).
  (workdir / "report.md").replace(workdir / "table.md")
  print(table)
  print(f"Done in {meta['seconds']:.0f} s: {workdir / 'table.md'}")
  return written
