"""The SAE report's threshold sweep and controls sections, from
results.json (`report.py` fills the rest). Runs written before the
controls existed (SmolLM2's) have neither; their report says so.
"""

from __future__ import annotations

from mha_jax.measure import report as report_lib

KIND_NAMES = {"relu": "ReLU + L1", "topk": "TopK", "batchtopk": "BatchTopK",
              "jumprelu": "JumpReLU"}
CONTROL_NAMES = {"layer0": "layer 0 of the trained model",
                 "reinit": "re-initialised model, untrained",
                 "untrained": "SAEs before training"}
SWEEP_NAMES = {"second_rate": "second-copy firing rate >=",
               "second_ratio": "second/first ratio >=",
               "dfa_share": "DFA shares (heads, source) >="}


def settings(saved) -> list:
  """`(label, sweep by kind, runs)` of the claim and each control."""
  out = [(f"claim (layer {saved['model']['layer']})", saved["sweep"],
          saved["runs"])]
  for name, c in saved.get("controls", {}).items():
    out.append((CONTROL_NAMES[name], c["sweep"], c["runs"]))
  return out


def _cell(summ) -> str:
  """`85.7 ± 0.6 (85, 86, 86)`: mean ± sample std and each seed's."""
  per = ", ".join(f"{v:g}" for v in summ["values"])
  std = "" if summ["std"] is None else f" ± {summ['std']:.1f}"
  return f"{summ['mean']:.1f}{std} ({per})"


def sweep_tables(saved) -> str:
  """One table per count (induction, copying): a row per threshold value,
  a column per setting and kind."""
  if "sweep" not in saved:
    return ("Not run: this run's results predate the sweep (and the "
            "controls), so its counts are at the criterion's thresholds "
            "only.")
  # A column per setting and kind it has (the trained controls may have
  # fewer kinds than the claim).
  cols = [(label, sweep, k) for label, sweep, _ in settings(saved)
          for k in saved["sweep"] if k in sweep]
  head = ["threshold varied", "value"] + [
      f"{label}: {KIND_NAMES[k]}" for label, _, k in cols]
  out = []
  for count in ("induction", "copying"):
    rows = []
    for i, row in enumerate(next(iter(saved["sweep"].values()))):
      rows.append([SWEEP_NAMES[row["threshold"]], f"{row['value']:g}"] + [
          _cell(sweep[k][i][count]) for _, sweep, k in cols])
    out.append(f"{count.capitalize()} features per SAE (mean ± sample std "
               "over seeds, each seed's count in brackets):\n\n"
               + report_lib.md_table(head, rows))
  return "\n\n".join(out)


def separated(saved, count: str = "copying") -> list:
  """`(threshold, value, kind)` where every seed of the claim counts more
  `count` features ("copying" or "induction") than every seed of every
  control that has SAEs of that kind."""
  sets = settings(saved)
  if len(sets) < 2:
    return []
  out = []
  for kind, rows in saved["sweep"].items():
    others = [sw[kind] for _, sw, _ in sets[1:] if kind in sw]
    if not others:
      continue
    for i, row in enumerate(rows):
      low = min(row[count]["values"])
      high = max(max(sw[i][count]["values"]) for sw in others)
      if low > high:
        out.append((row["threshold"], row["value"], kind))
  return out


def same_settings(saved) -> str:
  """What the controls share with the claim: "kinds, seeds, size, steps",
  then each trained control that has fewer kinds or seeds, with its own
  (the untrained control always has the claim's)."""
  claim = (list(saved["summary"]), sorted({r["seed"] for r in saved["runs"]}))
  fewer = []
  for n, c in saved["controls"].items():
    kinds = [k for k in saved["summary"] if k in c["summary"]]
    seeds = sorted({r["seed"] for r in c["runs"]})
    if n == "untrained" or (kinds, seeds) == claim:
      continue
    names = " and ".join(KIND_NAMES[k] for k in kinds)
    seed_list = f"seed(s) {', '.join(map(str, seeds))}"
    fewer.append(f"{CONTROL_NAMES[n]}: " + (
        f"{names} with {seed_list} only" if seeds != claim[1] and
        kinds != claim[0] else f"{names} only" if kinds != claim[0]
        else f"{seed_list} only"))
  return "kinds, seeds, size, steps" + "".join(f"; {f}" for f in fewer)


def controls_section(saved) -> str:
  """What each control is, its layer's induction scores, its SAEs'
  sparsity and counts at the criterion's thresholds."""
  ctrl = saved.get("controls")
  if not ctrl:
    return ("No controls were run for this model: its induction-feature "
            "counts have no layer without "
            "induction heads, re-initialised model or untrained SAE beside "
            "them.")
  rows = []
  for name, c in ctrl.items():
    scores = ", ".join(f"{report_lib.head_name(c['layer'], h)} {v:.2f}"
                       for h, v in enumerate(c["induction_scores"]))
    for kind, x in c["summary"].items():
      runs = [r for r in c["runs"] if r["kind"] == kind]
      rows.append([CONTROL_NAMES[name], str(c["layer"]), scores,
                   KIND_NAMES[kind], report_lib.summary(x["l0"], 1),
                   report_lib.summary(x["explained_variance"]),
                   ", ".join(str(r["induction"]["count"]) for r in runs),
                   ", ".join(str(r["induction"]["copying_count"])
                             for r in runs)])
  heads = next(iter(ctrl.values()))["heads_counted"]
  layer = saved["model"]["layer"]
  counted = (f"heads {', '.join(str(h) for h in heads)} of each control's "
             "layer (the indices of the claim's induction heads, "
             + ", ".join(report_lib.head_name(layer, h) for h in heads) + ")"
             if heads else "no head (the claim's layer has no induction "
             "head, so no feature can pass)")
  same = same_settings(saved)
  text = (f"The same criterion, thresholds and SAE settings ({same}) "
          "where no learned induction is: the trained model's "
          f"layer {ctrl.get('layer0', {}).get('layer', 0)}, the claim's layer of the same architecture freshly "
          "initialised and never trained (each with its own SAEs, trained "
          "on its own z from the same token batches), and the claim's own "
          "SAEs before training (a random dictionary on the claim's z). "
          f"The DFA share counts {counted}; the layer's own induction "
          "heads by the threshold would be "
          + "; ".join(f"{CONTROL_NAMES[n]}: "
                      + (", ".join(report_lib.head_name(c["layer"], h)
                                   for h in c["own_induction_heads"])
                         or "none") for n, c in ctrl.items())
          + ". Induction scores are on the same repeated inputs.\n\n")
  return text + report_lib.md_table(
      ["control", "layer", "induction scores", "SAE", "L0",
       "explained var.", "induction features per seed",
       "copying features per seed"], rows)


def controls_findings(saved) -> list:
  """Lines for "What this shows": the controls' counts beside the claim's
  and the thresholds at which each count separates them (a count the
  claim's layer has at no threshold is not tested)."""
  ctrl = saved.get("controls")
  if not ctrl:
    return []
  out = []
  for kind in saved["summary"]:
    mine = [r["induction"] for r in saved["runs"] if r["kind"] == kind]
    parts = []
    for name, c in ctrl.items():
      runs = [r for r in c["runs"] if r["kind"] == kind]
      if not runs:
        continue
      parts.append(f"{CONTROL_NAMES[name]} "
                   f"{', '.join(str(r['induction']['copying_count']) for r in runs)}"
                   f" copying and "
                   f"{', '.join(str(r['induction']['count']) for r in runs)}"
                   " induction")
    out.append(f"- Controls, {KIND_NAMES[kind]}, at the criterion's "
               f"thresholds: the claim's layer has "
               f"{', '.join(str(r['copying_count']) for r in mine)} copying"
               f" and {', '.join(str(r['count']) for r in mine)} induction "
               f"features per seed; {'; '.join(parts)}.")
  tried = sum(len(rows) for rows in saved["sweep"].values())
  # A kind some control has no SAEs of is compared with the others only.
  partial = {k: [CONTROL_NAMES[n] for n, c in ctrl.items() if k in c["sweep"]]
             for k in saved["sweep"]
             if not all(k in c["sweep"] for c in ctrl.values())}
  against = "".join(f" ({KIND_NAMES[k]}: against {', '.join(names)} only)"
                    for k, names in partial.items())
  for count in ("copying", "induction"):
    if not any(row[count]["values"] and max(row[count]["values"]) > 0
               for rows in saved["sweep"].values() for row in rows):
      continue  # the claim has none at any setting: nothing to separate
    sep = separated(saved, count)
    if sep:
      where = ", ".join(f"{SWEEP_NAMES[t]} {v:g} ({KIND_NAMES[k]})"
                        for t, v, k in sep)
      out.append(f"- The {count} count separates the claim's layer from "
                 f"every control (every claim seed above every control "
                 f"seed) at {len(sep)} of the {tried} sweep settings"
                 f"{against}: {where}.")
    else:
      out.append(f"- At no sweep setting does the claim's layer count more "
                 f"{count} features than every control in every seed"
                 f"{against}: the criterion does not separate them.")
  return out


def null_section(saved) -> str:
  """The matched-direction null (`induction.matched_null`) per setting,
  kind and seed: copying and induction features, and how many of each
  read the layer's second-copy output more than `alpha` of random
  directions of their norm on every head do."""
  runs = [r for _, _, rs in settings(saved) for r in rs]
  if not runs or any("null" not in r["induction"] for r in runs):
    return ("Not measured: this run's results predate the matched-direction "
            "null.")
  first = runs[0]["induction"]["null"]
  rows = []
  for label, _, rs in settings(saved):
    for r in rs:
      ind, n = r["induction"], r["induction"]["null"]
      rows.append([label, KIND_NAMES[r["kind"]], str(r["seed"]),
                   str(ind["copying_count"]), str(n["selective"]),
                   str(ind["count"]), str(n["selective_induction"])])
  return (
      "The criterion counts any direction that reads the induction heads' "
      "second-copy output (a random dictionary passes it, below), so each "
      "copying feature is also set against "
      f"{first['draws']} random directions with its own norm on every "
      "head's block of the encoder and its own bias: its second-copy "
      "excess (mean ReLU of the pre-activation on the second copy minus "
      "on the first; TopK's competition left out on both sides) against "
      "theirs, p = (1 + draws at or above it) / (1 + draws). A feature is "
      f"selective at p <= {first['alpha']:g}: it reads what the heads "
      "write on the second copy, on average over the copy, more than a "
      "direction reading the same heads as much does by chance. A random "
      "dictionary's features are draws of this null, so about "
      f"{first['alpha']:.0%} of all of them pass; but the criterion selects "
      "the ones that happen to read the heads' output most, so of those "
      f"many more than {first['alpha']:.0%} can pass. A feature that fires "
      "on few of the copy's tokens (one copied token, say) has a small "
      "mean excess and is not selective by this test.\n\n"
      + report_lib.md_table(
          ["setting", "SAE", "seed", "copying features", "of them selective",
           "induction features", "of them selective"], rows))


def null_findings(saved) -> list:
  """A line per kind: the claim's selective induction and copying
  features per seed beside each control's."""
  sets = settings(saved)
  if any("null" not in r["induction"] for _, _, rs in sets for r in rs):
    return []
  out = []
  for kind in saved["sweep"]:
    parts = []
    for label, _, rs in sets:
      rs = [r for r in rs if r["kind"] == kind]
      if not rs:
        continue
      sel = ", ".join(str(r["induction"]["null"]["selective_induction"])
                      for r in rs)
      cop = ", ".join(str(r["induction"]["null"]["selective"]) for r in rs)
      parts.append(f"{label} {sel} induction and {cop} copying")
    out.append(f"- Matched-direction null, {KIND_NAMES[kind]}: selective "
               f"features per seed: {'; '.join(parts)}.")
  return out
