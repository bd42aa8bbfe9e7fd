"""The EAP speed benchmark's report: report.md from results.json alone.

`write` saves results.json and renders bench_report.md.tmpl; `render`
fills it from the saved results, so the report regenerates from
results.json (`report_lib.regenerate`).
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import machine
from mha_jax.measure import report as report_lib
from mha_jax.measure import timing

TEMPLATE = pathlib.Path(__file__).with_name("bench_report.md.tmpl")
MODULE = "experiments.eap_ioi.bench"
LABELS = {"eap": "EAP", "eap-ig": "EAP-IG"}


def write(config, results, workdir, command: str | None = None) -> dict:
  """results.json and report.md in `workdir`; returns what results.json
  holds."""
  return report_lib.write_rendered(
      workdir, results, lambda saved: render(saved, command), config=config)


def _seconds(t) -> str:
  """Median / minimum seconds, 3 significant digits (the smoke run's
  calls take milliseconds, the real model's minutes)."""
  return f"{t['median']:.3g} / {t['min']:.3g}"


PEER = """torch: an independent
implementation of the same definition on transformers' model
(experiments/eap_ioi/torch_eap.py, shown equal to mha_jax's on a tiny
Llama in tests/experiments/test_torch_eap.py), at {threads} threads{chunk}. Both
float32, in one process"""
CHUNK = """, its
prompts scored in calls of {size} (its autograd graph holds about 0.26 GB
per prompt; the calls' scores, weighted by their share of the prompts,
are the whole set's, since the metric is a mean over prompts)"""
ALONE = """torch's peer not run
(`peer` False: mha_jax alone, at a size where both libraries in one
process do not fit the machine's memory). float32"""
AGREEMENT = """A ratio below 1: mha_jax is faster. Each ratio is taken within a round.

## Agreement

The two libraries' scores over the edges, from the first calls (scores
by magnitude: |score|, the order circuits are cut from; the top edges:
the strongest by |score| in each, counted in both):

"""


def _alone(s: dict) -> str:
  """The speed table of a run without the peer."""
  rows = [[LABELS[m], _seconds(r["mha_jax_s"]),
           f"{r['first_s']['mha_jax']:.3g}", f"{r['compile_s']:.1f}"]
          for m, r in s["methods"].items()]
  return report_lib.md_table(
      ["method", "mha_jax s (median / min)", "first call s",
       "mha_jax compile s"], rows)


def roofline_table(s: dict) -> str:
  """Each method's matmul work and each contestant's share of the plain
  matmul's rate in the same rounds; a note for a run before the
  roofline."""
  if "roofline" not in s:
    return ("Not measured in this run (it predates the roofline: "
            "`mha_jax.measure.roofline`).")
  r = s["roofline"]
  names = list(next(iter(r["share"].values())))
  rows = [[LABELS[m], f"{r['work'][m] / 1e9:.4g}"]
          + [report_lib.share_cell(by[c]) for c in names]
          for m, by in r["share"].items()]
  n, rate = r["matmul_n"], timing.spread(r["rates"])
  return (f"The yardstick: a plain float32 `[{n}, {n}] x [{n}, {n}]` "
          f"product, {r['repeat']} calls a timing after an untimed pause of "
          f"{r['pause_s']:g} s (torch's worker threads spin on after its "
          f"calls), in the same rounds: {rate['median'] / 1e9:.1f} GFLOP/s "
          f"(median; {rate['min'] / 1e9:.1f} to {rate['max'] / 1e9:.1f} over "
          f"rounds: a round where the machine is slower for the yardstick "
          f"raises that round's shares). "
          f"A method's work is the matrix-multiply FLOPs of mha_jax's "
          f"compiled call (`flops.compiled_matmul_flops`: the products XLA "
          f"runs), the same numerator for both libraries. Each cell: that "
          f"work per second over the yardstick's rate in the same round, "
          f"in percent, median [min, max] over rounds.\n\n"
          + report_lib.md_table(
              ["method", "matmul work, GFLOP"]
              + [f"{c}: share of the matmul rate" for c in names], rows))


def render(s: dict, command: str | None = None) -> str:
  """report.md from the saved results `s` (with or without the peer)."""
  peer = s.get("peer", True)
  speed, agree = [], []
  for m, r in (s["methods"].items() if peer else ()):
    ratio = r["ratio"]
    speed.append([LABELS[m], _seconds(r["mha_jax_s"]), _seconds(r["torch_s"]),
                  f"{ratio['median']:.2f} [{ratio['min']:.2f}, "
                  f"{ratio['max']:.2f}]", f"{r['compile_s']:.1f}"])
    a = r["agree"]
    agree.append([LABELS[m], f"{a['rel_norm']:.2e}", f"{a['max_rel']:.2e}",
                  f"{a['spearman_abs']:.6f}",
                  f"{a['top_k_shared']} / {a['top_k']}"])
  loads = ", ".join(f"{x:.1f}" for x in s["loadavg_rounds"])
  if peer:
    tables = (report_lib.md_table(
        ["method", "mha_jax s (median / min)", "torch s (median / min)",
         "mha_jax / torch (median [min, max] over rounds)",
         "mha_jax compile s"], speed) + "\n\n" + AGREEMENT
              + report_lib.md_table(
                  ["method", "difference in norm / norm",
                   "largest difference / largest score",
                   "Spearman (ranks by magnitude)", "top edges shared"],
                  agree))
  else:
    tables = _alone(s)
  return report_lib.fill(TEMPLATE, {
      "command": report_lib.command(MODULE, command),
      "model": s["model"], "prompts": str(s["prompts"]),
      "tokens": str(s["tokens"]), "edges": f"{s['edges']:,}",
      "senders": str(s["senders"]), "receivers": str(s["receivers"]),
      "ig_steps": str(s["ig_steps"]),
      "rounds_text": ("1 timed round" if s["rounds"] == 1 else
                      f"{s['rounds']} interleaved rounds"),
      "peer_text": (PEER.format(threads=s["threads"], chunk=(
          CHUNK.format(size=s["peer_chunk"]) if s.get("peer_chunk") else ""))
                    if peer else ALONE),
      "speed_and_agreement": tables, "roofline": roofline_table(s),
      "resident": "both libraries" if peer else "mha_jax; torch's model read",
      "cores": str(s["cores"]), "cpu": machine.describe(s["cpu"]),
      "memory": report_lib.freed_memory(s.get("keep_freed_memory")),
      "loads": loads, "peak_rss_gb": f"{s['peak_rss_gb']:.1f}",
      "jax": s["jax"], "torch": s["torch"],
      "minutes": f"{s['seconds'] / 60:.1f}"})
