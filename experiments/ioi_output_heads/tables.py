"""The output-head report's values: tables and the wording that depends
on the numbers, each from results.json's contents (`saved`) alone."""

from __future__ import annotations

from experiments.ioi_task import formats
from experiments.ioi_task import prompts
from experiments.ioi_output_heads import figures
from mha_jax.measure import report as report_lib

KIND = figures.LABEL


def task_table(models: dict) -> str:
  rows = [[formats.model(n), r["num_prompts"], r["num_names"],
           f"{len(r['selection'])}: {formats.both(r['task']['selection'])}",
           f"{len(r['held_out'])}: {formats.both(r['task']['held_out'])}"]
          for n, r in models.items()]
  return report_lib.md_table(
      ["model", "prompts", "names", "selection half: prompts, logit diff.",
       "held-out half: prompts, logit diff."], rows)


def ranked_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for h in r["top_positive"][:6] + r["top_negative"][:3]:
      rows.append([formats.model(n), formats.head(h["head"]),
                   formats.triple(h["effect"]), formats.triple(h["io"]),
                   formats.triple(h["s"]), formats.triple(h["other"]),
                   formats.triple(h["attention"]), formats.triple(h["copy"]),
                   f"{h['held_out_effect']:+.2f}"])
  return report_lib.md_table(
      ["model", "head", "direct effect", "on logit(IO)", "on logit(S)",
       "on other names", "attention IO - S", "copy score",
       "held-out effect"], rows)


def group_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for kind, g in r["groups"].items():
      if not g["size"]:
        rows.append([formats.model(n), KIND[kind], "none", "", "", "", "",
                     "", ""])
        continue
      j, rnd, t = g["joint"], g["random"], g["test"]
      rows.append([
          formats.model(n), KIND[kind], formats.heads(g["heads"]),
          formats.both(j["effect"]),
          f"{j['io']['mean']:+.2f} / {j['s']['mean']:+.2f} / "
          f"{j['other']['mean']:+.2f}",
          f"{rnd['mean']:+.2f} {report_lib.interval(rnd['range95'], spec='+.2f')}",
          formats.both(g["minus_random"]),
          f"{t['as_far']} of {len(rnd['per_group'])} (p = {t['p']:.2f})",
          "yes" if g["confirmed"] else "no"])
  return report_lib.md_table(
      ["model", "group", "heads (chosen on the selection half)",
       "held-out joint direct effect", "its parts: IO / S / other names",
       "random groups: mean [2.5%, 97.5% of groups]",
       "group - mean of random groups", "random groups as far",
       "confirmed"], rows)


def ablation_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for kind, g in r["groups"].items():
      if not g["size"] or "ablation" not in g:
        continue
      a = g["ablation"]
      rows.append([formats.model(n), KIND[kind], formats.heads(g["heads"]),
                   formats.both(a["joint"]),
                   f"{a['random']['mean']:+.2f} "
                   f"{report_lib.interval(a['random']['range95'], spec='+.2f')}",
                   formats.both(a["minus_random"]),
                   f"{a['test']['as_far']} of {len(a['random']['per_group'])}"
                   f" (p = {a['test']['p']:.2f})"])
  if not rows:
    return "No group was ablated."
  return report_lib.md_table(
      ["model", "group", "heads", "logit difference lost (clean - ablated)",
       "random groups: mean [2.5%, 97.5%]", "group - mean of random",
       "random groups as far"], rows)


def member_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    for kind, g in r["groups"].items():
      for mem in g.get("members", []):
        s = mem["selection"]
        rows.append([formats.model(n), KIND[kind], formats.head(mem["head"]),
                     formats.triple(s["effect"]),
                     formats.triple(s["attention"]),
                     formats.triple(s["copy"]), formats.triple(s["s_specific"]),
                     formats.both(mem["held_out"])])
  if not rows:
    return "No group has a member."
  return report_lib.md_table(
      ["model", "group", "head", "selection: direct effect",
       "attention IO - S", "copy score", "logit(S) - other names",
       "held-out direct effect"], rows)


def template_table(models: dict) -> str:
  n_t = len(prompts.TEMPLATES)
  rows = []
  for n, r in models.items():
    rows.append([formats.model(n), "task (logit difference)"] + [
        f"{x:+.2f}" for x in r["task"]["held_out_by_template"]])
    for kind, g in r["groups"].items():
      if g["size"]:
        rows.append([formats.model(n), f"{KIND[kind]}: direct"] + [
            f"{x:+.2f}" for x in g["by_template"]])
        if "ablation" in g:
          rows.append([formats.model(n), f"{KIND[kind]}: ablation"] + [
              f"{x:+.2f}" for x in g["ablation"]["by_template"]])
  return report_lib.md_table(["model", "held-out mean"]
                             + [f"T{t}" for t in range(n_t)], rows)


def _group_of(r, head) -> str:
  for kind, g in r["groups"].items():
    if head in g.get("heads", []):
      return KIND[kind]
  return ""


def cs_table(models: dict) -> str:
  rows = []
  for n, r in models.items():
    cs = r["copy_suppression"]
    b = cs["baseline"]
    k = cs["criterion"]["top_k"]
    for h in cs["heads"]:
      rows.append([
          formats.model(n), formats.head(h["head"]), _group_of(r, h["head"]),
          formats.both(h["context"], sign=""),
          f"{b['agree_median']:.2f} / {b['agree_p95']:.2f}",
          f"{h['ov_top_k_share'][0]:.2f} "
          f"{report_lib.interval(h['ov_top_k_share'][1:], spec='.2f')}",
          f"{b['ov_share_median']:.2f} / {b['ov_share_max']:.2f}",
          f"{h['ov_median_rank']:.0f} ({report_lib.percent(h['ov_median_percentile'], 2)})",
          f"{h['ov_median_name_rank']:.0f}",
          "pass" if h["passes"] else
          "fail (" + ", ".join(x for x, ok in (
              ("context", h["context_pass"]), ("OV", h["ov_pass"]))
              if not ok) + ")"])
  if not rows:
    return "No head was tested (no group has a member)."
  return report_lib.md_table(
      ["model", "head", "group", "in context: attended name is the most "
       "lowered", "other heads: median / 95th pct", f"OV: own logit in the "
       f"{k} most suppressed", "other heads: median / max",
       "OV: median rank in the vocabulary", "median rank among the names",
       "copy suppression"], rows)


def cs_template_table(models: dict) -> str:
  rows = [[formats.model(n), formats.head(h["head"])] + [
      f"{x:.2f}" for x in h["context_by_template"]]
          for n, r in models.items()
          for h in r["copy_suppression"]["heads"]]
  if not rows:
    return ""
  return report_lib.md_table(
      ["model", "head"] + [f"T{t}" for t in range(len(prompts.TEMPLATES))],
      rows)


def _ablation_clause(g, max_p: float) -> str:
  if "ablation" not in g:
    return ""
  a = g["ablation"]
  where = ("beyond the random groups" if a["test"]["p"] <= max_p else
           "no further than random groups reach")
  return (f"; mean-ablating it loses {formats.summ(a['joint'])} of the logit "
          f"difference, {where} (random groups {a['random']['mean']:+.2f}, "
          f"{a['test']['as_far']} of {len(a['random']['per_group'])} as "
          "far)")


def _group_sentence(kind, g, max_p: float) -> str:
  """What the held-out half says of one group."""
  if not g["size"]:
    return (f"No head qualifies as one of the {KIND[kind]} on the "
            "selection half.")
  j = g["joint"]
  verdict = ("holds on the held-out prompts" if g["confirmed"] else
             "is not confirmed on the held-out prompts")
  return (
      f"The group of {KIND[kind]} ({formats.heads(g['heads'])}) {verdict}: "
      "joint "
      f"direct effect {formats.summ(j['effect'])} against random groups' "
      f"{g['random']['mean']:+.2f}, {g['test']['as_far']} of "
      f"{len(g['random']['per_group'])} as far; on logit(IO) "
      f"{j['io']['mean']:+.2f}, on logit(S) {j['s']['mean']:+.2f}, on the "
      f"other names {j['other']['mean']:+.2f}" + _ablation_clause(g, max_p) + ".")


def _cs_sentence(cs) -> str:
  """Which tested heads pass copy suppression, and which test the others
  fail."""
  if not cs:
    return ""
  passed = [formats.head(h["head"]) for h in cs if h["passes"]]
  why = {(True, False): "the OV test only", (False, True):
         "the in-context test only", (False, False): "both tests"}
  failed = {}
  for h in cs:
    if not h["passes"]:
      failed.setdefault(why[h["context_pass"], h["ov_pass"]], []).append(
          formats.head(h["head"]))
  text = ("Copy suppression (both tests, criterion above): "
          + (f"{', '.join(passed)} pass" if passed else
             "no tested head passes"))
  if failed:
    text += "; failing " + "; ".join(
        f"{reason}: {', '.join(heads)}" for reason, heads in failed.items())
  return text + "."


def claims(models: dict, config: dict) -> str:
  """One paragraph per model: which groups hold on held-out prompts,
  where each group's effect lands, and which heads copy-suppress."""
  e = config["experiment"]
  out = []
  for n, r in models.items():
    said = [_group_sentence(kind, g, e["max_p"])
            for kind, g in r["groups"].items()]
    said.append(_cs_sentence(r["copy_suppression"]["heads"]))
    out.append(f"**{formats.model(n)}.** " + " ".join(x for x in said if x))
  out.append(
      f"Each group was chosen on {e['selection_share']:.0%} of the prompts "
      "and tested on the rest; a group of heads that each carry a small "
      "share is tested as a whole, which the one-head-at-a-time rule of "
      f"the IOI experiment could not do. With {e['random_groups']} random "
      f"groups the smallest permutation share is "
      f"{1 / (1 + e['random_groups']):.2f}: no random group as far.")
  return "\n\n".join(out)


def values(saved: dict, command: str | None = None) -> dict:
  """Every `$name` of report.md.tmpl."""
  e = saved["config"]["experiment"]
  models = saved["models"]
  has_fig = any(g["size"] for r in models.values()
                for g in r["groups"].values())
  return formats.split_values(
      saved, "experiments.ioi_output_heads", command) | {
      "cs_context_floor": f"{e['cs_context_floor']:.2f}",
      "cs_ov_share": f"{e['cs_ov_share']:.2f}",
      "cs_top_k": str(e["cs_top_k"]),
      "task_table": task_table(models),
      "ranked_table": ranked_table(models),
      "group_table": group_table(models),
      "ablation_table": ablation_table(models),
      "member_table": member_table(models),
      "template_table": template_table(models),
      "templates": "\n".join(f"- T{i}: \"{t}\"" for i, t in
                             enumerate(prompts.TEMPLATES)),
      "cs_table": cs_table(models),
      "cs_template_table": cs_template_table(models),
      "figure": (f"![groups against random groups]({figures.NAME})"
                 if has_fig else ""),
      "claims": claims(models, saved["config"]),
  }
