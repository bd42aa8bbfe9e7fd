"""Reporting: results.json -> report.md (nothing here measures).

`render` fills report.md.tmpl from the saved results alone, so the report
regenerates from its results.json; the ratios were computed while
measuring (`run.summarise`).
"""

from __future__ import annotations

import functools
import pathlib

from mha_jax.measure import machine
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
PATHS = ("flash_skip", "flash_blocks", "flash_all", "einsum_dense",
         "torch_flex")


def write(config, results, workdir, command: str | None = None) -> dict:
  """report.md and results.json in `workdir` (the report printed too)."""
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config, echo=True)


def render(saved: dict, command: str | None = None) -> str:
  return report_lib.fill(TEMPLATE, values(saved, command))


def _cell(case, path) -> str:
  res = case["paths"].get(path)
  if res is None:
    return "not run: " + case["skipped"].get(path, "off in this config")
  if "error" in res:  # one table cell: the error's first line
    return "failed: " + res["error"].splitlines()[0][:150] + " (results.json)"
  text = f"{res['median_s']:.3g} s"
  if len(res["times_s"]) == 1:
    text += " (1 call)"
  if path != "flash_skip":
    x = res["x_skip"]
    text += f", {x['median']:.2f}x [{x['low']:.2f}, {x['high']:.2f}]"
  return text + f"; diff {res['max_abs_diff']:.1e}"


def roofline_table(saved: dict) -> str:
  """Per case: the rule's work and each path's share of the plain
  matmul's rate timed right before it; a note for a run before the
  roofline."""
  cases, c = saved["cases"], saved["config"]
  if "work_flops" not in cases[0]:
    return ("Not measured in this run (it predates the roofline: "
            "`mha_jax.measure.roofline`).")
  rows, rates = [], []
  for case in cases:
    row = [str(case["n"]), case["rule"], f"{case['work_flops'] / 1e9:.3g}"]
    for path in PATHS:
      res = case["paths"].get(path, {})
      row.append(report_lib.share_cell(res["share"]) if "share" in res
                 else "-")
      if "yardstick_flops_per_s" in res:
        rates.append(res["yardstick_flops_per_s"])
    rows.append(row)
  n = c["matmul_n"]
  return (f"Right before each path's timed calls, a plain float32 "
          f"`[{n}, {n}] x [{n}, {n}]` product was timed "
          f"{c['yardstick_repeats']} times after a pause of "
          f"{c['yardstick_pause_s']:g} s: {min(rates) / 1e9:.1f} to "
          f"{max(rates) / 1e9:.1f} GFLOP/s over the paths. A path's share is "
          f"the rule's work (4 B H Dh FLOPs for each (query, key) pair it "
          f"allows, the same for every path) per second over that rate, in "
          f"percent: at the median call [the slowest, the fastest]. Work a "
          f"path spends on masked pairs lowers its share.\n\n"
          + report_lib.md_table(
              ["n", "rule", "rule's work, GFLOP"] + list(PATHS), rows))


def values(saved: dict, command: str | None = None) -> dict:
  c = saved["config"]
  cases = saved["cases"]
  rows = [[str(case["n"]), case["rule"]] + [_cell(case, p) for p in PATHS]
          for case in cases]
  table = report_lib.md_table(
      ["n", "rule", "flash_skip", "flash_blocks (x skip)",
       "flash_all (x skip)", "einsum_dense (x skip)",
       "torch_flex (x skip)"], rows)
  block_rows = []
  for case in cases:
    b = case["blocks"]
    flex = case["paths"].get("torch_flex", {})
    block_rows.append([
        str(case["n"]), case["rule"], f"{b['computed']} / {b['total']}",
        f"{b['full']} full, {b['partial']} partial",
        f"{b['all_over_computed']:.1f}",
        f"{case['block_mask_s']:.2f} s",
        f"{flex['block_mask_s']:.2f} s" if "block_mask_s" in flex else "-"])
  blocks_table = report_lib.md_table(
      ["n", "rule", "blocks computed / all", "of which",
       "all / computed", "block mask build (JAX)",
       "create_block_mask (torch)"], block_rows)
  span_rows = [[str(case["n"]), case["rule"],
                f"{sp['block']}", str(sp["length"]),
                f"{sp['computed']} / {sp['blocks']}",
                f"{sp['computed'] / sp['listed']:.2f}"]
               for case in cases if (sp := case["spans"]) is not None]
  spans_table = report_lib.md_table(
      ["n", "rule", "blocks", "span (blocks)", "blocks computed / all",
       "computed / listed"], span_rows) if span_rows else "No case took spans."
  torch_v = next((case["paths"]["torch_flex"].get("torch") for case in cases
                  if "torch_flex" in case["paths"]), None)
  return {
      "command": report_lib.command("experiments.score_rules_bench", command),
      "took_s": f"{saved['took_s']:.0f}", "cpus": str(saved["cpus"]),
      "cpu": (machine.describe(saved["cpu"]) if "cpu" in saved
              else "a CPU the run did not record"),
      "load": f"{saved['load_before'][0]:.1f}",
      "load_after": f"{saved['load_after'][0]:.1f}",
      "jax": saved["jax"], "backend": saved["backend"],
      "memory": ("glibc kept freed memory for reuse" if
                 saved["keep_freed_memory"]["applied"] else
                 "glibc's default malloc ("
                 + saved["keep_freed_memory"]["reason"] + ")"),
      "torch": f"torch {torch_v}" if torch_v else "torch not run",
      "batch": str(c["batch"]), "heads": str(c["heads"]),
      "head_dim": str(c["head_dim"]), "documents": str(c["documents"]),
      "window": str(c["window"]), "block": str(c["block"]),
      "span_block": str(c["span_block"]), "spans_table": spans_table,
      "kernel": _kernel({case["heads_batched"] for case in cases}),
      "repeats": str(c["repeats"]), "slow_s": f"{c['slow_s']:g}",
      "table": table, "blocks_table": blocks_table,
      "roofline": roofline_table(saved),
      "claims": claims(cases)}


def _kernel(batched: set) -> str:
  """Which kernel flash_skip ran, from the cases' `heads_batched`."""
  if batched == {True}:
    return "the heads batched"
  if batched == {False}:
    return "one (batch, kv head) at a time"
  return "the heads batched in some cases"


def _side(x) -> str:
  """How a ratio to flash_skip reads: faster or slower only where every
  pair of single calls agrees (the bracketed range excludes 1)."""
  if x["high"] < 1:
    return "faster than flash_skip in every pair of calls"
  if x["low"] > 1:
    return "slower than flash_skip in every pair of calls"
  return "neither clearly faster nor slower: its single calls fall on both sides"


def claims(cases) -> str:
  """One line per case: skipping's gain beside the block count's, and
  the FlexAttention comparison, worded from the numbers."""
  lines = []
  for case in cases:
    p = case["paths"]
    x = p["flash_all"]["x_skip"]
    want = case["blocks"]["all_over_computed"]
    walk = p.get("flash_blocks")
    if walk is not None:  # flash_all against the block walk with the mask
      x = p["flash_all"]["x_blocks"]
    line = (f"- {case['rule']}, n = {case['n']}: without the block mask the "
            f"block walk took {x['median']:.1f}x the time with it (single "
            f"calls {x['low']:.1f}-{x['high']:.1f}x), where the block count "
            f"alone predicts {want:.1f}x")
    if walk is not None:
      wx = walk["x_skip"]
      line += (f"; the span walk (flash_skip) took "
               f"{1 / wx['median']:.2f}x the block walk's time "
               f"[{1 / wx['high']:.2f}, {1 / wx['low']:.2f}]")
    flex = p.get("torch_flex", {})
    if "x_skip" in flex:
      fx = flex["x_skip"]
      line += (f"; FlexAttention took {fx['median']:.2f}x flash_skip's time "
               f"[{fx['low']:.2f}, {fx['high']:.2f}], {_side(fx)}")
    elif "error" in flex:
      line += "; FlexAttention did not run (error above)"
    lines.append(line + ".")
  return "\n".join(lines)
