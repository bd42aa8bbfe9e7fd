"""The circuit criteria's report, from results.json alone.

`write` saves results.json and writes report.md; `render(saved)` fills
report.md.tmpl (one model.md.tmpl section per model) from results.json's
contents, so a committed report regenerates from it. No statistic is
computed here: means, intervals and ranks come from `run.measure`.
"""

from __future__ import annotations

import functools
import pathlib

from mha_jax.measure import report as report_lib

HERE = pathlib.Path(__file__).parent
TEMPLATE = HERE / "report.md.tmpl"
MODEL_TEMPLATE = HERE / "model.md.tmpl"
LABELS = {"smollm2": "SmolLM2-135M", "gemma3": "Gemma 3 270M",
          "tiny_llama": "tiny random Llama"}
# The faithfulness the report calls "most of the model's": the lower end
# of the interval over prompts at or above this fraction of F(M).
MOST = 0.5
head = lambda x: report_lib.head_name(*x)


def cell(summ: dict, spec: str = "+.2f") -> str:
  """`+1.23 [+0.98, +1.51]`: a mean and its 95% interval."""
  return (f"{summ['mean']:{spec}} "
          f"{report_lib.interval(summ['ci95'], spec=spec)}")


def fraction(r: dict) -> str:
  return (f"{r['value']:.2f} {report_lib.interval(r['ci95'], spec='.2f')}"
          f" (templates {report_lib.interval(r['ci95_templates'], spec='.2f')})")


def heads(pairs) -> str:
  return ", ".join(head(x) for x in pairs) or "none"


def backup_text(groups: list) -> str:
  if not groups:
    return ("**Backup heads**: not measured (the circuit names no output "
            "head).")
  return "\n\n".join(_backup(b) for b in groups)


def _backup(b: dict) -> str:
  rows = [[head(r["head"]), cell(r["before"]), cell(r["after"]),
           cell(r["change"])] for r in b["heads"]]
  return "\n\n".join([
      f"**Backup heads** ({b['group']} {heads(b['knocked'])} knocked out; "
      "odd prompts):",
      report_lib.md_table(["head", "direct effect before", "after",
                           "change"], rows),
      f"The knocked heads' own direct effect before: "
      f"{cell(b['knocked_direct_before'])}; the summed change of every "
      f"other head's direct effect: {cell(b['others_change'])}."])


def model_values(m: dict) -> dict:
  """One model's section values."""
  faith = [[kind, cell(m[kind]["circuit"]), fraction(m[kind]["fraction"]),
            cell(m[kind]["gap"])] for kind in ("mean", "resample")]
  complete = [[c["k"], heads(c["heads"]), cell(c["circuit_minus_k"]),
               cell(c["model_minus_k"]), cell(c["difference"])]
              for c in m["completeness"]]
  minimal = [[head(r["head"]), r["class"]] + [
      f"{cell(k['change'])} (K: {heads(k['heads'])})" for k in r["k"]]
      + [""] * (2 - len(r["k"])) for r in m["minimality"]]
  r = m["random"]
  return {
      "label": LABELS.get(m["model"], m["model"]),
      "size": m["size"], "total": m["layers"] * m["heads"],
      "class_list": "; ".join(f"{label}: {heads(hs)}"
                              for label, hs in m["classes"].items()),
      "full": cell(m["full"]), "full_mean": f"{m['full']['mean']:+.2f}",
      "abc": cell(m["abc"]), "empty": cell(m["empty"]),
      "faith_table": report_lib.md_table(
          ["ablation", "F(C)", "F(C) / F(M)", "F(M) - F(C)"], faith),
      "random_mean": f"{r['fraction_mean']:.2f}",
      "random_std": f"{r['fraction_std']:.2f}",
      "random_max": f"{r['fraction_max']:.2f}",
      "random_above": r["at_or_above_circuit"], "random_n": len(r["draws"]),
      "templates": "; ".join(
          f"{t['template'] + 1}: {t['circuit']:+.2f} of {t['full']:+.2f}"
          for t in m["templates"]),
      "complete_table": report_lib.md_table(
          ["K", "heads", "F(C \\ K)", "F(M \\ K)", "difference"], complete),
      "minimal_table": report_lib.md_table(
          ["v", "class", "K empty", "K the rest of its class"], minimal),
      "backup": backup_text(m["backup"])}


def claim(m: dict) -> str:
  """What one model's numbers allow one to say."""
  label = LABELS.get(m["model"], m["model"])
  f = m["mean"]["fraction"]
  r = m["random"]
  if f["ci95"][0] >= MOST:
    faith = (f"{label}'s circuit of {m['size']} heads keeps most of the "
             f"model's logit difference ({f['value']:.2f} of it)")
  else:
    faith = (f"{label}'s circuit of {m['size']} heads is not faithful: "
             f"alone it keeps {f['value']:.2f} of the model's logit "
             f"difference (interval {report_lib.interval(f['ci95'], spec='.2f')})")
  baseline = (f", against {r['fraction_mean']:.2f} for random sets of its "
              f"size ({r['at_or_above_circuit']} of {len(r['draws'])} at or "
              "above it)")
  w = m["completeness_worst"]
  worst = (f" It is not complete by Wang et al.'s test: over the subsets K "
           f"tried, F(C \\ K) and F(M \\ K) differ by up to "
           f"{w['fraction']:.2f} of F(M) ({w['k']}), so heads outside the "
           "circuit carry part of what is lost when K goes.")
  b = m["backup"][0] if m["backup"] else None
  repair = "" if b is None else (
      f" Knocking out its output heads (direct effect "
      f"{b['knocked_direct_before']['mean']:+.2f}) raises the other heads' "
      f"summed direct effect by {b['others_change']['mean']:+.2f}, most in "
      f"{head(b['heads'][0]['head'])} "
      f"({b['heads'][0]['change']['mean']:+.2f} on held-out prompts).")
  return faith + baseline + "." + worst + repair


# Where the circuit's classes come from, and what its output heads are,
# by `experiment.circuit_source`.
SOURCE = {
    "held_out": (
        "The circuits are the classes chosen on one half of 128 prompts "
        "(8 templates, ABBA and BABA, names drawn with seed 0) and "
        "confirmed on the other half against random groups: the output "
        "heads and negative output heads of the ioi_output_heads run "
        "(docs/results/ioi_output_heads), the S-inhibition, induction / "
        "duplicate-token and previous-token heads of the ioi_classes run "
        "(docs/results/ioi_classes); a group or round not confirmed there "
        "is left out.",
        "the name movers and S suppressors that ioi_output_heads confirmed "
        "on the direct path to the logits"),
    "ioi": (
        "The circuits are the heads that the ioi experiment named in each "
        "class (docs/results/ioi), chosen there on 16 patching prompts.",
        "the class the ioi run separated on the direct path to the logits: "
        "in SmolLM2 an S suppressor and a copying head, in Gemma an S "
        "suppressor")}


def values(saved: dict, command: str | None = None) -> dict:
  e = saved["config"]["experiment"]
  source, output_heads = SOURCE[e["circuit_source"]]
  models = saved["models"]
  first = next(iter(models.values()))
  return {
      "command": report_lib.command("experiments.ioi_circuit", command),
      "wall": report_lib.wall_time(saved["wall_s"], False),
      "cpu": f"; {saved['cpu_s'] / 60:.1f} CPU-minutes of the process",
      "backend": saved["backend"], "num_prompts": first["num_prompts"],
      "source": source, "output_heads": output_heads,
      "per_template_order": e["per_template_order"],
      "prompt_seed": e["prompt_seed"], "resamples": e["resamples"],
      "random_circuits": e["random_circuits"],
      "random_subsets": e["random_subsets"], "backup_top": e["backup_top"],
      "model_sections": "\n\n".join(
          report_lib.fill(MODEL_TEMPLATE, model_values(m))
          for m in models.values()),
      "claims": "\n\n".join(claim(m) for m in models.values())}


def render(saved: dict, command: str | None = None) -> str:
  return report_lib.fill(TEMPLATE, values(saved, command))


def write(config, results, workdir, command: str | None = None) -> dict:
  """results.json, then report.md; returns what results.json holds."""
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config)
