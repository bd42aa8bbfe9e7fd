"""Experiment 6's claims: the values of the report's "What this shows".

The sentences are report.md.tmpl's; `values` reads the numbers they quote
from results.json and chooses the wording that depends on them (whether
an interval clears its floor, whether the heads copy), so a claim that
fails reads as failed.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import report as report_lib

# The HEADLINES claims the bullets quote with their per-seed values, and
# those they quote as a summary alone (beside the earlier analysis).
QUOTED = ("key_prev_k_noise", "key_prev_k_denoise", "key_cur_k_noise",
          "val_embed_v_noise", "val_cur_v_noise", "val_all_v_denoise",
          "val_embed_v_denoise", "sc_q_max_noise", "sc_embed_q_noise",
          "sc_all_q_noise", "fc_q_max_noise", "fc_prev_k_denoise",
          "fc_all_v_denoise", "fc_and_denoise", "fc_and_embed_denoise",
          "fc_kv_denoise", "fc_heads_qkv_denoise", "fc_prev_direct_noise",
          "fc_prev_through_noise", "sc_cur_q_noise")
SUMMARISED = ("fc_prev_k_noise", "key_prev_k_noise", "fc_cur_v_noise",
              "val_cur_v_noise", "sc_q_max_noise")


def _per_seed(c, digits=2) -> str:
  """'0.64 ± 0.22 [0.09, 1.20] (per seed 0.84, 0.40, 0.68; vs chance
  1.30 ± 0.40 [0.31, 2.29])': the fraction of the corrupted gap beside
  the same patch read against chance, since every corrupted run here is
  confidently wrong and the gap is inflated."""
  return (f"{report_lib.summary(c, digits)} (per seed "
          f"{', '.join(f'{v:.{digits}f}' for v in c['values'])}; vs chance "
          f"{report_lib.summary(c['vs_chance'], digits)})")


def _with_chance(c, digits=2) -> str:
  """'0.64 ± 0.22 (vs chance 1.30 ± 0.40)', the summary form."""
  return (f"{report_lib.summary(c, digits)} (vs chance "
          f"{report_lib.summary(c['vs_chance'], digits)})")


def _lo(c) -> float:
  """The lower end of a claim's t interval (its mean for one seed)."""
  return c["ci95"][0] if c["ci95"] else c["mean"]


def _hi(c) -> float:
  """The upper end of a claim's t interval (its mean for one seed)."""
  return c["ci95"][1] if c["ci95"] else c["mean"]


def _above(c) -> bool:
  """Whether the claim's t interval lies above its floor's mean."""
  return c["floor"] is not None and _lo(c) > c["floor"]["mean"]


def _floor(c) -> str:
  """The same route's best other layer-0 head, over seeds."""
  return "n/a" if c["floor"] is None else report_lib.summary(c["floor"], 2)


def _queries(claims, matters) -> str:
  """Whether a layer-0 head feeds the queries, from the interval of the
  strongest one's path against `matters`."""
  q = claims["sc_q_max_noise"]
  if _hi(q) < matters:
    return (f"No layer-0 head feeds the queries by as much as {matters} "
            "(upper end of the interval below it): the query reads the "
            "current token from the embedding.")
  if _lo(q) <= matters:
    return (f"Whether a layer-0 head feeds the queries is not resolved (the "
            f"interval spans {matters}).")
  q_cur = sum(a == b for a, b in zip(q["sets"], claims["sc_cur_q_noise"]
                                     ["sets"]))
  return (f"A layer-0 head feeds the queries (lower end of the interval "
          f"above {matters}), and the earlier 'no layer-0 head feeds the "
          "queries' is withdrawn; the strongest is the current-token head "
          f"in {q_cur} of {q['n']} seeds.")


def _paths(claims, matters) -> dict:
  """Keys, values, queries and the AND, each from the corruption that can
  see it."""
  and_more = _lo(claims["fc_and_denoise"]) > max(
      _hi(claims["fc_prev_k_denoise"]), _hi(claims["fc_all_v_denoise"]))
  return {
      **{k: _per_seed(claims[k]) for k in QUOTED},
      **{f"{k}_summary": _with_chance(claims[k]) for k in SUMMARISED},
      "key_prev_k_noise_floor": _floor(claims["key_prev_k_noise"]),
      "val_cur_v_noise_floor": _floor(claims["val_cur_v_noise"]),
      "key_floor_verdict": ("above the floor in the interval"
                            if _above(claims["key_prev_k_noise"])
                            else "NOT separated from the floor"),
      "value_verdict": ("above 0 in the interval"
                        if _lo(claims["val_cur_v_noise"]) > 0
                        else "NOT separated from 0"),
      "queries_verdict": _queries(claims, matters),
      "and_verdict": ("exceeds either alone beyond their intervals, an AND "
                      "measured directly" if and_more
                      else "is NOT separated from the single paths"),
  }


def _earlier(claims, matters) -> dict:
  """What the fixed analysis changes in the earlier one's three claims."""
  cur_v = min(_lo(claims["fc_cur_v_noise"]), _lo(claims["val_cur_v_noise"]))
  return {
      "earlier_key_verdict": (
          "the claim stands, now with an interval above its floor"
          if _above(claims["key_prev_k_noise"])
          else "NOT separated from its floor any more"),
      "earlier_value_verdict": ("the interval now excludes 0" if cur_v > 0
                                else "still not separated from 0"),
      "earlier_queries_verdict": (
          "overturned" if _lo(claims["sc_q_max_noise"]) > matters
          else "not overturned"),
  }


def _normalisation(runs, seeds, claims) -> dict:
  """Raw metrics beside the fractions, and the layer-1 shares' sums."""
  ref, chance = claims["reference"], claims["chance"]
  prev_k = claims["fc_prev_k_noise"]
  raw = lambda k, w: report_lib.summary(ref[k][w], 2)
  near = abs(ref["no_match"]["corrupted"]["mean"] - chance) < 1.0
  sums = [np.sum(runs[f"seed{s}"]["heads"]["denoise"]["activation"][-1])
          for s in seeds]
  return {
      "first_copy_corrupted": raw("first_copy", "corrupted"),
      "first_copy_clean": raw("first_copy", "clean"),
      "no_match_corrupted": raw("no_match", "corrupted"),
      "no_match_verdict": (
          "near chance" if near else
          "NOT near chance either, so the confidence is not planted by a "
          "chance match; the model is confidently wrong whenever it finds "
          "no match. No corruption here gives a corrupted run at chance, so "
          "the table's 'vs chance' column reads each patch against chance "
          "directly"),
      "prev_k_metric": report_lib.summary(prev_k["metric"], 2),
      "prev_k_vs_chance": report_lib.summary(prev_k["vs_chance"], 2),
      "below_chance": (": below chance" if prev_k["metric"]["mean"] < chance
                       else ""),
      "layer1_sums": ", ".join(f"{x:.2f}" for x in sums),
  }


def _versus(value, baseline) -> str:
  """'12.3 random std above': how far `value` is from chance."""
  z = (value - baseline[0]) / baseline[1]
  return f"{abs(z):.1f} random std {'above' if z >= 0 else 'below'}"


def _weights(ds, summary, comp) -> dict:
  """Composition against random, and whether it picks the heads whose
  paths cost most."""
  return {
      "random_k_comp": report_lib.fmt(*comp["k"]),
      "random_v_comp": report_lib.fmt(*comp["v"]),
      "prev_k_comp_versus": _versus(summary["prev_k_comp"][0], comp["k"]),
      "cur_v_comp_versus": _versus(summary["cur_v_comp"][0], comp["v"]),
      "k_comp_match": sum(d["k_comp_top"] == d["k_feeder"] for d in ds),
      "v_comp_match": sum(d["v_comp_top"] == d["v_feeder"] for d in ds),
  }


def way_layer(name: str) -> str:
  """A calibration entry's name as the report writes it: `denoise_l1` ->
  `denoise layer 1`."""
  way, layer = name.rsplit("_l", 1)
  return f"{way} layer {layer}"


def _attribution(calibration) -> dict:
  """Attribution patching per layer and direction, and where it ranks
  heads as patching does or also gets their size."""
  per_layer = {n: c for n, c in calibration.items()
               if isinstance(c, dict) and "slope" in c}
  get = lambda c, k: ("n/a" if c[k] is None else
                      report_lib.summary(c[k], 2))
  parts = [f"{way_layer(n)}: slope {get(c, 'slope')}, r "
           f"{get(c, 'pearson')}, top-1 agreement {get(c, 'top_k')}"
           for n, c in per_layer.items()]
  size_ok = [n for n, c in per_layer.items()
             if c["slope"] and abs(c["slope"]["mean"] - 1) < 0.2]
  rank_ok = [n for n, c in per_layer.items()
             if c["top_k"] and c["top_k"]["mean"] >= 0.8]
  return {"calibration_parts": "; ".join(parts),
          "rank_ok": ", ".join(rank_ok) or "none",
          "size_ok": ", ".join(size_ok) or "none"}


def _copying(summary, copy) -> dict:
  """Whether the layer-1 heads copy, the layer-0 heads anti-copy, and the
  layer-0 heads act on the logits only through layer 1."""
  mean = lambda k: summary[k][0]
  return {
      "random_copying": report_lib.fmt(*copy),
      "copies_verdict": ("copy" if mean("copying_l1_mean")
                         > copy[0] + 2 * copy[1] else "do NOT clearly copy"),
      "l0_copying": (" is below chance (read straight through to the "
                     "logits, their OV circuits would lower the token they "
                     "attend to)" if mean("copying_l0_mean")
                     < copy[0] - 2 * copy[1] else ""),
      "direct_verdict": (": the layer-0 heads act through layer 1, not on "
                         "the logits" if abs(mean("dla_l0_sum"))
                         < 0.1 * abs(mean("dla_total")) else ""),
  }


def _positions(segment, ds) -> dict:
  """What the mechanism predicts per position of the fixed layout."""
  return {"predictions": segment - 1,
          "one_position": f"{1 / (segment - 1):.2f}",
          "one_token": f"{(2 * segment - 3) / (segment - 1) ** 2:.2f}",
          "outside_max": f"{max(d['pos_outside_max'] for d in ds):.2f}"}


def _dynamics(ds, interval) -> dict:
  """In how many seeds the heads form at the loss drop, and the
  previous-token head before the induction heads."""
  near = lambda d, k: abs(d[k] - d["loss_half_step"]) <= interval
  together = sum(near(d, "induction_half_step") and near(d, "prev_half_step")
                 for d in ds)
  prev_first = sum(d["prev_half_step"] < d["induction_half_step"]
                   for d in ds)
  return {
      "eval_every": interval, "together": together, "prev_first": prev_first,
      "together_verdict": (
          ": the heads form at the loss drop" if together == len(ds) else
          ": the heads do NOT form at the loss drop" if together == 0 else
          ""),
      "prev_first_verdict": (": at this resolution the two form together, "
                             "not one after the other" if prev_first == 0
                             else ""),
  }


def values(saved: dict) -> dict:
  """The claims' values, each written as the report shows it."""
  config, runs, summary = saved["config"], saved["runs"], saved["summary"]
  claims, baselines = saved["claims"], saved["baselines"]
  seeds = config["experiment"]["seeds"]
  ds = [runs[f"seed{s}"]["derived"] for s in seeds]
  matters = saved["setup"]["matters"]
  f2 = {k: report_lib.fmt(*summary[k], digits=2)
        for k in ("prev_k_comp", "cur_v_comp", "copying_l1_mean",
                  "copying_l0_mean", "dla_l1_sum", "dla_total", "dla_l0_sum",
                  "pos_denoise_resid0", "pos_denoise_resid1",
                  "pos_noise_resid0")}
  f0 = {k: report_lib.fmt(*summary[k], digits=0)
        for k in ("loss_half_step", "prev_half_step", "induction_half_step")}
  return {**_paths(claims, matters), **_earlier(claims, matters),
          **_normalisation(runs, seeds, claims),
          **_weights(ds, summary, baselines["composition"]),
          **_attribution(saved["calibration"]),
          **_copying(summary, baselines["copying"]["copying"]),
          **_positions(config["experiment"]["segment"], ds),
          **_dynamics(ds, config["train"]["eval_every"]), **f2, **f0}
