"""The upstream-class report's values: tables and the wording that
depends on the numbers, each from results.json's contents (`saved`)
alone."""

from __future__ import annotations

from experiments.ioi_task import formats
from experiments.ioi_task import prompts
from mha_jax.measure import report as report_lib

ROUND = {"s_inhibition": "S-inhibition",
         "induction_duplicate": "induction / duplicate-token",
         "previous_token": "previous-token"}
RECEIVES = {"s_inhibition": "the output heads' queries",
            "induction_duplicate": "the S-inhibition heads' keys and values",
            "previous_token": "the induction heads' keys and values"}


def task_table(models: dict) -> str:
  rows = [[formats.model(n), r["num_prompts"],
           formats.heads(r["output_heads"]),
           f"{len(r['selection'])}: {formats.both(r['task']['selection'])}",
           f"{len(r['held_out'])}: {formats.both(r['task']['held_out'])}"]
          for n, r in models.items()]
  return report_lib.md_table(
      ["model", "prompts", "output heads (first receivers)",
       "selection half: prompts, logit diff.",
       "held-out half: prompts, logit diff."], rows)


def ranked_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for name, rd in r["rounds"].items():
      if "skipped" in rd:
        rows.append([formats.model(n), ROUND[name], f"skipped: {rd['skipped']}",
                     "", ""])
        continue
      for t in rd["top"]:
        rows.append([formats.model(n), ROUND[name], formats.head(t["head"]),
                     formats.triple(t["selection"]),
                     "yes" if t["head"] in rd["heads"] else ""])
  return report_lib.md_table(
      ["model", "round", "sender", "selection: path effect",
       "in the class"], rows)


def class_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for name, rd in r["rounds"].items():
      if "skipped" in rd:
        continue
      if not rd["heads"]:
        rows.append([formats.model(n), ROUND[name], str(rd["senders"]), "none",
                     "", "", "", "", "no"])
        continue
      h = rd["held_out"]
      rnd, t = h["random"], h["test"]
      rows.append([
          formats.model(n), ROUND[name], str(rd["senders"]),
          formats.heads(rd["heads"]),
          formats.both(h["joint"]),
          f"{rnd['mean']:+.2f} "
          f"{report_lib.interval(rnd['range95'], spec='+.2f')}",
          formats.both(h["minus_random"]),
          f"{t['as_far']} of {len(rnd['per_group'])} (p = {t['p']:.2f})",
          "yes" if rd["confirmed"] else "no"])
  return report_lib.md_table(
      ["model", "class", "senders ranked", "heads (chosen on the selection "
       "half)", "held-out joint path effect",
       "random sets: mean [2.5%, 97.5% of sets]",
       "class - mean of random sets", "random sets as far", "confirmed"],
      rows)


def member_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for name, rd in r["rounds"].items():
      if "held_out" not in rd:
        continue
      sel = {tuple(t["head"]): t["selection"] for t in rd["top"]}
      for m in rd["held_out"]["members"]:
        s = sel.get(tuple(m["head"]))
        rows.append([formats.model(n), ROUND[name], formats.head(m["head"]),
                     formats.triple(s) if s else "", formats.both(m)])
  if not rows:
    return "No class has a member."
  return report_lib.md_table(
      ["model", "class", "head", "selection: path effect",
       "held-out: its own path effect"], rows)


def pattern_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    rd = r["rounds"].get("induction_duplicate", {})
    for k in rd.get("kinds", []):
      rows.append([formats.model(n), formats.head(k["head"]),
                   "S2 -> S1 minus S2 -> S1+1",
                   formats.triple(k["selection"]["s2_s1_minus_after"]),
                   k["selection"]["kind"],
                   formats.triple(k["held_out"]["s2_s1_minus_after"]),
                   k["held_out"]["kind"]])
    rd = r["rounds"].get("previous_token", {})
    for k in rd.get("previous", []):
      f = k["selection"]["floor"]
      rows.append([formats.model(n), formats.head(k["head"]),
                   f"S1+1 -> S1 (uniform {f:.2f})",
                   formats.triple(k["selection"]["after_s1_s1"]),
                   "above uniform" if k["selection"]["above_floor"] else
                   "not above uniform",
                   formats.triple(k["held_out"]["after_s1_s1"]),
                   "above uniform" if k["held_out"]["above_floor"] else
                   "not above uniform"])
  if not rows:
    return "No class was found whose attention names a kind."
  return report_lib.md_table(
      ["model", "head", "attention", "selection half", "reads as",
       "held-out half", "reads as"], rows)


def template_table(models: dict) -> str:
  n_t = len(prompts.TEMPLATES)
  rows = []
  for n, r in models.items():
    for name, rd in r["rounds"].items():
      if "held_out" in rd:
        rows.append([formats.model(n), ROUND[name]] + [
            f"{x:+.2f}" for x in rd["held_out"]["by_template"]])
  if not rows:
    return "No class was tested on held-out prompts."
  return report_lib.md_table(["model", "class (held-out mean)"]
                             + [f"T{t}" for t in range(n_t)], rows)


def _sentence(name, rd) -> str:
  if "skipped" in rd:
    return f"The {ROUND[name]} round did not run ({rd['skipped']})."
  if not rd["heads"]:
    return (f"No sender into {RECEIVES[name]} qualifies as {ROUND[name]} "
            "on the selection half.")
  h = rd["held_out"]
  verdict = ("holds on the held-out prompts" if rd["confirmed"] else
             "is not confirmed on the held-out prompts")
  return (f"The {ROUND[name]} class ({formats.heads(rd['heads'])}, into "
          f"{RECEIVES[name]}) {verdict}: joint path effect "
          f"{h['joint']['mean']:+.2f} "
          f"{report_lib.interval(h['joint']['ci95'], spec='+.2f')} against "
          f"random sets' {h['random']['mean']:+.2f}, {h['test']['as_far']} of "
          f"{len(h['random']['per_group'])} as far.")


def _kinds_sentence(r) -> str:
  kinds = r["rounds"].get("induction_duplicate", {}).get("kinds", [])
  if not kinds:
    return ""
  same = [k for k in kinds
          if k["selection"]["kind"] == k["held_out"]["kind"]]
  return (f"By attention from S2, {len(same)} of {len(kinds)} members read "
          "as the same kind on both halves ("
          + ", ".join(f"{formats.head(k['head'])} {k['selection']['kind']}"
                      + ("" if k in same else
                         f" / held out {k['held_out']['kind']}")
                      for k in kinds) + ").")


def claims(models: dict, config: dict) -> str:
  """One paragraph per model: which classes hold on held-out prompts."""
  e = config["experiment"]
  out = []
  for n, r in models.items():
    said = [_sentence(name, rd) for name, rd in r["rounds"].items()]
    said.append(_kinds_sentence(r))
    out.append(f"**{formats.model(n)}.** " + " ".join(x for x in said if x))
  out.append(
      f"Each class was chosen on {e['selection_share']:.0%} of the prompts "
      "and tested on the rest, as a whole, against random sets of its size "
      f"drawn from the heads in no class. With {e['random_groups']} random "
      f"sets the smallest permutation share is "
      f"{1 / (1 + e['random_groups']):.2f}: no random set as far. A "
      "confirmed class says that the path from these heads to the "
      "receivers carries more of the logit difference than the path from "
      "other heads of those layers; it does not say that nothing else "
      "does (the ioi_circuit experiment measures completeness).")
  return "\n\n".join(out)


def values(saved: dict, command: str | None = None) -> dict:
  """Every `$name` of report.md.tmpl."""
  e = saved["config"]["experiment"]
  models = saved["models"]
  return formats.split_values(saved, "experiments.ioi_classes", command) | {
      "through": ("directly and through the MLPs between (every other "
                  "head's output frozen at the clean run's)"
                  if e["path_through_mlps"] else "directly only"),
      "task_table": task_table(models),
      "class_table": class_table(models),
      "member_table": member_table(models),
      "pattern_table": pattern_table(models),
      "ranked_table": ranked_table(models),
      "template_table": template_table(models),
      "claims": claims(models, saved["config"]),
  }
