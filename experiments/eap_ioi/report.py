"""The EAP experiment's report: tables and the wording that depends on
the numbers, from results.json alone.

`write` saves results.json, draws the figure and writes report.md;
`render(saved)` fills report.md.tmpl from results.json's contents, so a
committed report regenerates from it. No statistic is computed here:
intervals, curves and areas come from `run.measure`; the one derived
number, the EAP-IG run time at 128 prompts, is a stated extrapolation.
"""

from __future__ import annotations

import json
import pathlib

from experiments.eap_ioi import figures
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
MODULE = "experiments.eap_ioi"
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct"}
LABELS = figures.LABELS
ABLATION = {"corrupted": "corrupted (ABC)", "mean": "mean"}
# Held-out circuit sizes the prose quotes (fractions of the edges).
QUOTED = (0.01, 0.05)


def write(config, results, workdir, command: str | None = None) -> dict:
  """results.json (first, so a figure or template error loses no
  measurement), the figure, then report.md; returns what results.json
  holds."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  saved = report_lib.saved_results(results, config=config)
  (workdir / "results.json").write_text(json.dumps(saved, indent=1) + "\n")
  figures.write(saved, workdir)
  return report_lib.write_outputs(workdir, saved, render(saved, command),
                                  config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included)."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _ci(v, ci, spec="+.3f") -> str:
  return f"{v:{spec}} {report_lib.interval(ci, spec=spec)}"


def _triple(t, spec="+.3f") -> str:  # [value, lo, hi]
  return _ci(t[0], t[1:], spec)


def _timing(saved) -> tuple[str, str]:
  """The timing table, and the sentence on how EAP-IG's run time grows
  with the prompts (measured at two counts; 128 extrapolated linearly
  from those two where it was not measured)."""
  t = saved["timing"]
  rows = [[LABELS.get(k, "EAP-IG") + ("" if k in LABELS else " (timing)"),
           v["prompts"], v["steps"], f"{v['compile_s']:.0f}",
           f"{v['run_s']:.0f}", f"{v['compile_s'] + v['run_s']:.0f}"]
          for k, v in t.items()]
  table = report_lib.md_table(["method", "prompts", "gradient points",
                               "compile (s)", "run (s)", "total (s)"], rows)
  ig = t["eap-ig"]
  other = [v for k, v in t.items() if k.startswith("eap-ig_")]
  if any(v["prompts"] == 128 for v in [ig] + other):
    v = next(v for v in [ig] + other if v["prompts"] == 128)
    return table, (f"EAP-IG over every edge for 128 prompts: "
                   f"{v['run_s']:.0f} s run after {v['compile_s']:.0f} s "
                   "compile (measured).")
  if not other:
    return table, "EAP-IG was timed at one prompt count only."
  small = other[0]
  ratio = ig["run_s"] / small["run_s"]
  slope = (ig["run_s"] - small["run_s"]) / (ig["prompts"] - small["prompts"])
  at128 = ig["run_s"] + slope * (128 - ig["prompts"])
  return table, (
      f"EAP-IG's run time went from {small['run_s']:.0f} s at "
      f"{small['prompts']} prompts to {ig['run_s']:.0f} s at "
      f"{ig['prompts']} ({ratio:.2f}x for {ig['prompts'] / small['prompts']:.0f}x"
      f" the prompts); 128 prompts were not timed here: on the line through "
      f"those two points they would take about {at128:.0f} s of run time "
      f"plus a compile like the others' ({ig['compile_s']:.0f} s), an "
      "extrapolation, not a measurement.")


def _cpr_table(saved) -> str:
  rows = []
  for a, c in saved["curves"].items():
    for m, cv in c["methods"].items():
      rows.append([ABLATION[a], LABELS[m], _ci(cv["cpr"], cv["cpr_ci95"]),
                   _ci(cv["cmd"], cv["cmd_ci95"], ".3f")])
    cprs = [r["cpr"] for r in c["random"]]
    cmds = [r["cmd"] for r in c["random"]]
    rows.append([ABLATION[a], f"random ({len(cprs)} draws)",
                 f"{min(cprs):+.3f} to {max(cprs):+.3f}",
                 f"{min(cmds):.3f} to {max(cmds):.3f}"])
  return report_lib.md_table(["ablation", "circuits", "CPR (higher better)",
                              "CMD (lower better)"], rows)


def _curve_table(saved, ablation) -> str:
  c = saved["curves"][ablation]
  s = saved["sizes"]
  rows = []
  for i, (f, k) in enumerate(zip(s["fractions"], s["counts"])):
    rnd = [r["faithfulness"][i] for r in c["random"]]
    rows.append([f"{f:g}", f"{k:,}"] + [
        _ci(c["methods"][m]["faithfulness"][i],
            c["methods"][m]["faithfulness_ci95"][i]) for m in LABELS] + [
        f"{min(rnd):+.3f} to {max(rnd):+.3f}"])
  return report_lib.md_table(["fraction of edges", "edges"] + [
      LABELS[m] for m in LABELS] + ["random"], rows)


def _overlap(saved) -> str:
  h = saved["hand_built"]
  parts = []
  for key, name in (("overlap", "EAP-IG"), ("overlap_eap", "EAP")):
    for o in h[key]:
      parts.append(f"{name}'s top {o['k']} heads hold {len(o['found'])} of "
                   f"the {len(h['heads'])} ({', '.join(o['found']) or 'none'}"
                   f"; missing: {', '.join(o['missing']) or 'none'})")
  ranks = ", ".join(f"{n} {r}" for n, r in h["overlap"][0]["ranks"].items())
  return "; ".join(parts) + f". Each hand-built head's rank by EAP-IG: {ranks}."


def _at_hand_table(saved) -> str:
  rows = []
  for a, c in saved["curves"].items():
    at = c["at_hand"]
    rnd = [r[0] for r in at["random"]]
    rows.append([ABLATION[a], _triple(at["hand"]), _triple(at["eap-ig"]),
                 _triple(at["eap-ig_minus_hand"]),
                 f"{min(rnd):+.3f} to {max(rnd):+.3f}"])
  return report_lib.md_table(["ablation", "hand-built heads",
                              "EAP-IG, same edge count",
                              "EAP-IG minus hand-built",
                              "random, same edge count"], rows)


def _top_edges(saved, method, n=10) -> str:
  rows = [[i + 1, s, r, f"{v:+.4f}"] for i, (s, r, v) in enumerate(
      saved["scores"][method]["top_edges"][:n])]
  return report_lib.md_table(["#", "sender", "receiver", "score"], rows)


def _at(c, method, fraction, saved):
  i = saved["sizes"]["fractions"].index(fraction)
  cv = c["methods"][method]
  return _ci(cv["faithfulness"][i], cv["faithfulness_ci95"][i], "+.2f")


def _shows(saved) -> str:
  """The conclusions, worded from the numbers."""
  cur = saved["curves"]
  out = []
  for a, c in cur.items():
    ig, ea = c["methods"]["eap-ig"], c["methods"]["eap"]
    rnd = [r["cpr"] for r in c["random"]]
    above = ("its interval above every draw" if ig["cpr_ci95"][0] > max(rnd)
             else "its interval not above every draw")
    vs = ("above" if ig["cpr_ci95"][0] > ea["cpr_ci95"][1] else
          "below" if ig["cpr_ci95"][1] < ea["cpr_ci95"][0] else
          "overlapping")
    out.append(f"Under {ABLATION[a]} ablation, EAP-IG's CPR on held-out "
               f"prompts is {ig['cpr']:.3f} "
               f"{report_lib.interval(ig['cpr_ci95'])}, {above} of "
               f"random circuits' CPR ({min(rnd):.3f} to {max(rnd):.3f}); EAP's "
               f"is {ea['cpr']:.3f} {report_lib.interval(ea['cpr_ci95'])}, "
               f"the two intervals {vs if vs == 'overlapping' else 'with EAP-IG ' + vs}.")
  corrupted = cur.get("corrupted", next(iter(cur.values())))
  fr = [f for f in QUOTED if f in saved["sizes"]["fractions"]]
  if fr:
    out.append("EAP-IG's top circuits (corrupted ablation) keep " + ", ".join(
        f"{_at(corrupted, 'eap-ig', f, saved)} of the difference at "
        f"{100 * f:g}% of the edges" for f in fr) + ".")
  h = saved["hand_built"]
  o = h["overlap"][0]
  d = corrupted["at_hand"]["eap-ig_minus_hand"]
  word = ("is more faithful than" if d[1] > 0 else
          "is less faithful than" if d[2] < 0 else
          "differs by no resolvable amount from")
  out.append(f"Of the {len(h['heads'])} hand-built heads, EAP-IG's top "
             f"{o['k']} heads hold {len(o['found'])}. At the hand-built "
             f"circuit's size ({h['edges']:,} edges), EAP-IG's circuit "
             f"{word} the hand-built heads' (EAP-IG minus hand-built "
             f"{_triple(d)}, corrupted ablation).")
  return " ".join(out)


def values(saved: dict, command: str | None = None) -> dict:
  """Every `$name` of report.md.tmpl, written from results.json."""
  e = saved["config"]["experiment"]
  timing, scaling = _timing(saved)
  t = saved["task"]
  return {
      "command": report_lib.command(MODULE, command),
      "wall": report_lib.wall_time(saved["wall_s"], False),
      "cpu_min": f"{saved['cpu_s'] / 60:.1f}",
      "backend": saved["backend"],
      "model": MODEL_NAMES.get(saved["model"], saved["model"]),
      "layers": str(saved["layers"]), "heads": str(saved["heads"]),
      "kv_heads": str(saved["kv_heads"]),
      "senders": f"{saved['graph']['senders']:,}",
      "receivers": f"{saved['graph']['receivers']:,}",
      "edges": f"{saved['graph']['edges']:,}",
      "total": str(saved["prompts"]["total"]),
      "n_score": str(len(saved["prompts"]["score_idx"])),
      "n_eval": str(len(saved["prompts"]["eval_idx"])),
      "seed": str(e["seed"]), "steps": str(e["ig_steps"]),
      "resamples": str(e["resamples"]),
      "example": saved["prompts"]["example"][1],
      "score_clean": _ci(t["score_clean"]["mean"], t["score_clean"]["ci95"],
                         "+.2f"),
      "eval_clean": _ci(t["eval_clean"]["mean"], t["eval_clean"]["ci95"],
                        "+.2f"),
      "eval_abc": _ci(t["eval_abc"]["mean"], t["eval_abc"]["ci95"], "+.2f"),
      "timing_table": timing, "scaling": scaling,
      "cpr_table": _cpr_table(saved),
      "curve_corrupted": _curve_table(saved, "corrupted")
      if "corrupted" in saved["curves"] else "(not run)",
      "curve_mean": _curve_table(saved, "mean")
      if "mean" in saved["curves"] else "(not run)",
      "draws": str(e["random_draws"]),
      "figure": figures.FILE,
      "top_ig": _top_edges(saved, "eap-ig"),
      "hand_heads": ", ".join(f"L{l}H{h}" for l, h in
                              saved["hand_built"]["heads"]),
      "hand_source": saved["hand_built"]["source"],
      "hand_edges": f"{saved['hand_built']['edges']:,}",
      "hand_fraction": f"{100 * saved['hand_built']['fraction']:.2f}%",
      "overlap": _overlap(saved),
      "at_hand_table": _at_hand_table(saved),
      "empty_corrupted": _ci(saved["curves"]["corrupted"]["m_empty"]["mean"],
                             saved["curves"]["corrupted"]["m_empty"]["ci95"],
                             "+.2f") if "corrupted" in saved["curves"]
      else "n/a",
      "empty_mean": _ci(saved["curves"]["mean"]["m_empty"]["mean"],
                        saved["curves"]["mean"]["m_empty"]["ci95"], "+.2f")
      if "mean" in saved["curves"] else "n/a",
      "eval_seconds": f"{sum(c['seconds'] for c in saved['curves'].values()) / 60:.1f}",
      "n_circuits": str(sum(c["circuits"] for c in saved["curves"].values())),
      "shows": _shows(saved),
  }
