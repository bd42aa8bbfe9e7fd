"""Loading and running pretrained checkpoints, reporting: report.md.

`write` turns what `__main__` measured into report.md and results.json;
nothing here loads or times a model. The prose is report.md.tmpl beside
this file, with the two parts a run may leave out or repeat in templates
of their own: minilm.md.tmpl (the MiniLM speed, skipped by --nominilm)
and gguf.md.tmpl (one GGUF decoder LM's section, once per model).
`render` fills them from results.json alone, so a run's table
regenerates from its results.json.
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import machine
from mha_jax.measure import report as report_lib
from mha_jax.measure import timing

HERE = pathlib.Path(__file__).parent
TEMPLATE = HERE / "report.md.tmpl"
MINILM_TEMPLATE = HERE / "minilm.md.tmpl"
GGUF_TEMPLATE = HERE / "gguf.md.tmpl"


def write(config, results, workdir) -> dict:
  """report.md (printed too) and results.json in `workdir`; returns what
  results.json holds. (Runs before 2026-12-07 named it table.md.)"""
  return report_lib.write_rendered(workdir, results, render, config=config,
                                   echo=True)


def render(saved: dict) -> str:
  """report.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved))


def _part(text: str) -> str:
  """A part of the page followed by a blank line; "" stays "", so a part
  that was not measured leaves no trace."""
  return text.rstrip("\n") + "\n\n" if text else ""


def load_table(loads) -> str:
  """One row per (checkpoint, loader): size, seconds, peak RSS over the
  RSS after the imports, and that peak over the size."""
  return report_lib.md_table(
      ["checkpoint", "loader", "size MB", "load s", "peak RSS - base MB",
       "peak / size"],
      [[name, loader, f"{r['checkpoint_mb']:.0f}", f"{r['seconds']:.2f}",
        f"{r['peak_mb'] - r['base_mb']:.0f}", f"{r['peak_over_size']:.2f}"]
       for name, by_loader in loads.items()
       for loader, r in by_loader.items()])


def minilm_section(saved) -> str:
  """The MiniLM speed table: median / minimum seconds per path, and its
  minimum over torch's at 2 threads and, where measured, at 1
  (`run.speed_ratios`)."""
  one = saved.get("speed_x_torch_1")
  def ratios(path, k):
    two = f"{saved['speed_x_torch'][path][k]:.2f}x"
    return f"{two} / {one[path][k]:.2f}x" if one else two
  share = saved.get("share")
  rows = [[path] + [f"{r[k][0]:.4f} / {r[k][1]:.4f} ({ratios(path, k)})"
                    for k in ("forward", "loss_grad")]
          + ([report_lib.share_cell(share[path][k])
              for k in ("forward", "loss_grad")] if share else [])
          for path, r in saved["speed"].items()]
  if share:
    rate = sorted(saved["matmul_flops_per_s"])[
        len(saved["matmul_flops_per_s"]) // 2]
    n = saved["matmul_n"]
    roof = (f"The roofline: a plain float32 `[{n}, {n}] x [{n}, {n}]` "
            f"product timed in the same rounds ({rate / 1e9:.1f} GFLOP/s, "
            f"median); a share is the task's matrix-multiply work "
            f"(forward {saved['work']['forward'] / 1e9:.3g} GFLOP, loss + "
            f"grad {saved['work']['loss_grad'] / 1e9:.3g}: the einsum "
            f"path's compiled program, the same for every path) per second "
            f"over the product's rate in the same round, median [min, max] "
            f"over rounds.")
  else:
    roof = ("The roofline: not measured in this run (it predates "
            "`mha_jax.measure.roofline`).")
  return report_lib.fill(MINILM_TEMPLATE, {
      "threads": "2 threads / 1 thread" if one else "2 threads",
      "batch": str(saved["batch"]), "length": str(saved["length"]),
      "roofline": roof,
      "speed_table": report_lib.md_table(
          ["path", "forward", "loss + grad"]
          + (["forward: share of the matmul rate",
              "loss + grad: share"] if share else []), rows)})


def speed_table(s) -> str:
  """Prefill seconds, decode tokens/s, first calls and agreeing tokens
  per contestant, with its ratios to torch at each thread count."""
  torch_names = list(s["summary"]["prefill"])[::-1]  # most threads first
  n = s["new_tokens"]
  ratio_head = " / ".join(t.split()[1] for t in torch_names)
  rows = []
  for c in s["times"]["prefill"]:
    pre = [s["summary"]["prefill"][t][c] for t in torch_names]
    dec = [s["summary"]["decode"][t][c] for t in torch_names]
    rows.append([
        c, f"{pre[0]['median']:.3f} / {pre[0]['min']:.3f}",
        " / ".join(f"{x['ratio']:.2f}" for x in pre),
        f"{n / dec[0]['median']:.1f} / {n / dec[0]['min']:.1f}",
        " / ".join(f"{x['ratio']:.2f}" for x in dec),
        f"{s['first']['prefill'][c]:.1f} / {s['first']['decode'][c]:.1f}",
        f"{s['agree'][c]} / {n}"]
                + ([report_lib.share_cell(s["roofline"]["share"][t][c])
                    for t in ("prefill", "decode")] if "roofline" in s
                   else []))
  table = report_lib.md_table(
      ["path", "prefill s: median / min",
       f"x torch {ratio_head} threads", "decode tokens/s: median / best",
       f"x torch {ratio_head} threads", "first call s: prefill / decode",
       "same tokens"]
      + (["prefill: share of the matmul rate",
          "decode: share of the weight stream"] if "roofline" in s else []),
      rows)
  if "roofline" not in s:
    return table
  r = s["roofline"]
  rate = {k: timing.spread(v)["median"] for k, v in r["rates"].items()}
  return (f"The roofline, timed in the same rounds: a plain "
          f"{report_lib.matmul_yardstick(r['matmul_n'])} "
          f"({rate['matmul'] / 1e9:.1f} GFLOP/s, median) against prefill's "
          f"{r['work']['prefill'] / 1e9:.3g} GFLOP of matrix products (the "
          f"einsum program's); a "
          f"{report_lib.stream_yardstick(*r['stream_shape'])} "
          f"({rate['stream'] / 1e9:.1f} GB/s, median), against decoding's "
          f"{r['work']['decode'] / 1e9:.3g} GB of weights (every parameter "
          f"once per new token). A share: the contestant's work per second "
          f"over the yardstick's in the same round, median [min, max] over "
          f"rounds.\n\n" + table)


def gguf_section(r) -> str:
  """One GGUF model: its loads, then prefill and decode against torch."""
  s = r["speed"]
  loads = report_lib.md_table(
      ["loader", "file MB", "float32 MB", "load s", "peak RSS - base MB",
       "peak / float32"],
      [[loader, f"{x['file_mb']:.0f}", f"{x['checkpoint_mb']:.0f}",
        f"{x['seconds']:.2f}", f"{x['peak_mb'] - x['base_mb']:.0f}",
        f"{x['peak_over_size']:.2f}"] for loader, x in r["load"].items()])
  return report_lib.fill(GGUF_TEMPLATE, {
      "title": r["title"], "load_table": loads,
      **{k: str(s[k]) for k in ("repeats", "prefill", "new_tokens", "prompt",
                                "attn_implementation", "reference")},
      "load_min": report_lib.fmt(min(s["loadavg"]), digits=1),
      "load_max": report_lib.fmt(max(s["loadavg"]), digits=1),
      "speed_table": speed_table(s)})


def values(saved: dict) -> dict:
  """The template's values, each written as the report shows it."""
  start, end = saved["loadavg"]
  return {
      "date": saved["date"],
      "wall_time": report_lib.wall_time(saved["seconds"], reused=False),
      "cores": str(saved["cores"]),
      "cpu": (f" of {machine.describe(saved['cpu'])}" if "cpu" in saved
              else ""),
      "load_start": report_lib.fmt(start, digits=1),
      "load_end": report_lib.fmt(end, digits=1),
      "load_table": _part(load_table(saved["load"]) if saved["load"] else ""),
      "minilm": _part(minilm_section(saved) if "speed" in saved else ""),
      "gguf": "".join(_part(gguf_section(r))
                      for r in saved["gguf"].values()),
  }
