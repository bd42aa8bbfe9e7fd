"""The real-LM benchmark's report: report.md from results.json alone.

`write` saves results.json and renders report.md.tmpl beside this file;
`render` fills it from the saved results, so the report regenerates from
results.json (`report_lib.regenerate`).
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import machine
from mha_jax.measure import report as report_lib

HERE = pathlib.Path(__file__).parent
TEMPLATE = HERE / "report.md.tmpl"
TASK_LABELS = {"forward": "forward", "loss_grad": "loss + gradient",
               "decode": "decode"}


def write(config, results, workdir) -> dict:
  """report.md and results.json in `workdir`; returns what results.json
  holds."""
  return report_lib.write_rendered(workdir, results, render, config=config)


def _ratio_cell(r) -> str:
  """Median over rounds [minimum, maximum]."""
  return f"{r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]"


def _time_cell(task, t, n) -> str:
  """Seconds (median / min), or for decode tokens/s (median / best)."""
  if task == "decode":
    return f"{n / t['median']:.1f} / {n / t['min']:.1f} tok/s"
  return f"{t['median']:.3f} / {t['min']:.3f} s"


def speed_table(s) -> str:
  refs, summ = list(s["ratios"]), s["summary"]
  rows = []
  for task in s["times"]:
    for c in s["contestants"]:
      rows.append([TASK_LABELS[task], c,
                   _time_cell(task, summ["times"][task][c], s["new_tokens"])]
                  + [_ratio_cell(summ["ratios"][ref][task][c])
                     for ref in refs])
  return report_lib.md_table(
      ["task", "contestant", "median / best"]
      + [f"time x {ref} (median [min, max] over rounds)" for ref in refs],
      rows)


def roofline_table(s) -> str:
  """Per task: the work of one call, the yardstick's rate (median over
  rounds) and each contestant's share of it, median [min, max]."""
  if "roofline" not in s:
    return ("Not measured in this run (it predates the roofline: "
            "`mha_jax.measure.roofline`).")
  r = s["roofline"]
  rate = {k: sorted(v)[len(v) // 2] for k, v in r["rates"].items()}
  rows = []
  for task, by in r["share"].items():
    stick, w = r["yardstick"][task], r["work"][task]
    work = (f"{w / 1e9:.3g} GB of weights" if stick == "weight stream"
            else f"{w / 1e9:.3g} GFLOP of matmuls")
    unit = "GB/s" if stick == "weight stream" else "GFLOP/s"
    rows.append([TASK_LABELS[task], work,
                 f"{stick}: {rate[stick] / 1e9:.1f} {unit}"]
                + [report_lib.share_cell(by[c]) for c in s["contestants"]])
  return (f"The yardsticks, timed in the same rounds: plain matmul, one "
          f"{report_lib.matmul_yardstick(r['matmul_n'])}; weight stream, one "
          f"{report_lib.stream_yardstick(*r['stream_shape'])}. Each cell: the "
          f"contestant's work per second over the yardstick's in the same "
          f"round, in percent, median [min, max] over rounds.\n\n"
          + report_lib.md_table(
              ["task", "work per call", "yardstick (median rate)"]
              + [f"{c}: share" for c in s["contestants"]], rows))


def first_table(s) -> str:
  rows = [[c] + [f"{s['first'][t][c]:.2f}" for t in s["first"]]
          for c in s["contestants"]]
  return report_lib.md_table(
      ["contestant"] + [f"first {TASK_LABELS[t]} s" for t in s["first"]],
      rows)


def second_table(s) -> str:
  return report_lib.md_table(
      ["contestant", "seconds", "XLA compiles"],
      [[c, f"{r['seconds']:.2f}", str(r["compiles"])]
       for c, r in s["second_prompt_call"].items()])


def agree_table(s) -> str:
  return report_lib.md_table(
      ["contestant", "forward logits: relative error to " + s["reference"],
       "loss", "same leading tokens"],
      [[c, f"{a['forward_rel']:.2e}", f"{a['loss']:.6f}",
        f"{a['tokens']} / {s['new_tokens']}"]
       for c, a in s["agree"].items()])


def profile_tables(s) -> str:
  """Per task: ms per call in each kind of work, both libraries, then
  each one's costliest ops."""
  if "profile" not in s:
    return "Not profiled in this run (`--config.experiment.profile=False`)."
  parts = []
  for task, by in s["profile"].items():
    (jn, j), (tn, t) = by.items()
    rows = [[k, f"{j['kinds'][k]:.1f}", f"{t['kinds'][k]:.1f}",
             f"{j['kinds'][k] - t['kinds'][k]:+.1f}"] for k in j["kinds"]]
    rows.append(["all ops", f"{j['total']:.1f}", f"{t['total']:.1f}",
                 f"{j['total'] - t['total']:+.1f}"])
    parts.append(f"**{TASK_LABELS[task]}**, ms per call:\n\n"
                 + report_lib.md_table(["kind", jn, tn, "difference"], rows))
    top = [[f"`{n}`", k, f"{ms:.1f}"] for n, k, ms in j["top"]]
    ttop = [[f"`{n}`", k, f"{ms:.1f}"] for n, k, ms in t["top"]]
    parts.append(f"Costliest ops of {jn}:\n\n" + report_lib.md_table(
        ["op", "kind", "ms"], top) + f"\n\nCostliest ops of {tn}:\n\n"
                 + report_lib.md_table(["op", "kind", "ms"], ttop))
  return "\n\n".join(parts)


def verdicts(s) -> str:
  """One line per task and torch reference: where the median ratio and
  the worst round stand against 1."""
  lines = []
  jax_names = [c for c in s["contestants"] if c.startswith("mha_jax")]
  for ref, by_task in s["summary"]["ratios"].items():
    for task, by in by_task.items():
      cells = []
      for c in jax_names:
        r = by[c]
        where = ("at or below 1 in every round" if r["max"] <= 1 else
                 "at or below 1 in the median" if r["median"] <= 1 else
                 "above 1 in the median")
        cells.append(f"{c} {r['median']:.2f} ({where})")
      lines.append(f"- {TASK_LABELS[task]} against {ref}: "
                   + "; ".join(cells) + ".")
  return "\n".join(lines)


def values(s) -> dict:
  load = s["loadavg_rounds"]
  warm = s.get("warm_rounds", 0)
  return {
      "model": s["model"], "file": s["file"], "date": s["date"],
      "minutes": f"{s['seconds'] / 60:.1f}", "cores": str(s["cores"]),
      "cpu": machine.describe(s["cpu"]),
      "memory": report_lib.freed_memory(s.get("keep_freed_memory")),
      "warm": f" and {warm} untimed round{'s' * (warm > 1)}" if warm else "",
      "versions": f"jax {s['jax']}, torch {s['torch']}",
      "load_min": f"{min(load):.1f}", "load_max": f"{max(load):.1f}",
      "tokens": str(s["tokens"]), "prompt": str(s["prompt"]),
      "new_tokens": str(s["new_tokens"]),
      "second_prompt": str(s["second_prompt"]),
      "width": str(s["decode_width"]),
      "slots": str(s["decode_cache_slots"]),
      "rounds": str(len(load)), "attn": s["attn_implementation"],
      "speed_table": speed_table(s), "roofline_table": roofline_table(s),
      "first_table": first_table(s),
      "second_table": second_table(s), "agree_table": agree_table(s),
      "profile_tables": profile_tables(s), "verdicts": verdicts(s)}


def render(saved: dict) -> str:
  """report.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved))
