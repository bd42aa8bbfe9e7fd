"""The EAP speed benchmark's report: report.md from results.json alone.

`write` saves results.json and renders bench_report.md.tmpl; `render`
fills it from the saved results, so the report regenerates from
results.json (`report_lib.regenerate`).
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import report as report_lib

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


def render(s: dict, command: str | None = None) -> str:
  """report.md from the saved results `s`."""
  speed, agree = [], []
  for m, r in s["methods"].items():
    ratio = r["ratio"]
    speed.append([LABELS[m], _seconds(r["mha_jax_s"]), _seconds(r["torch_s"]),
                  f"{ratio['median']:.2f} [{ratio['min']:.2f}, "
                  f"{ratio['max']:.2f}]", f"{r['compile_s']:.1f}"])
    a = r["agree"]
    agree.append([LABELS[m], f"{a['rel_norm']:.2e}", f"{a['max_rel']:.2e}",
                  f"{a['spearman_abs']:.6f}",
                  f"{a['top_k_shared']} / {a['top_k']}"])
  loads = ", ".join(f"{x:.1f}" for x in s["loadavg_rounds"])
  return report_lib.fill(TEMPLATE, {
      "command": report_lib.command(MODULE, command),
      "model": s["model"], "prompts": str(s["prompts"]),
      "tokens": str(s["tokens"]), "edges": f"{s['edges']:,}",
      "senders": str(s["senders"]), "receivers": str(s["receivers"]),
      "ig_steps": str(s["ig_steps"]),
      "rounds_text": ("1 timed round" if s["rounds"] == 1 else
                      f"{s['rounds']} interleaved rounds"),
      "threads": str(s["threads"]),
      "speed_table": report_lib.md_table(
          ["method", "mha_jax s (median / min)", "torch s (median / min)",
           "mha_jax / torch (median [min, max] over rounds)",
           "mha_jax compile s"], speed),
      "agree_table": report_lib.md_table(
          ["method", "difference in norm / norm",
           "largest difference / largest score",
           "Spearman (ranks by magnitude)", "top edges shared"], agree),
      "cores": str(s["cores"]), "cpu": s["cpu"].get("model", "unknown"),
      "loads": loads, "peak_rss_gb": f"{s['peak_rss_gb']:.1f}",
      "jax": s["jax"], "torch": s["torch"],
      "minutes": f"{s['seconds'] / 60:.1f}"})
