"""Experiment 6's tables: every table of the report, from results.json.

`values` returns them as the template's values (Markdown tables, and the
per-seed list of which head feeds which input); the rows read the saved
results only. Shape letters: L layers, H heads.
"""

from __future__ import annotations

import numpy as np

from experiments.circuits import survey as survey_lib
from mha_jax.measure import report as report_lib

# The summary table's quantities, in words.
_LABELS = {
    "eval_loss": "final eval loss (nats)",
    "prev_score": "previous-token score of the layer-0 previous-token head",
    "cur_score": "current-token score of the layer-0 current-token head",
    "induction_l1_mean": "mean induction score of the layer-1 heads",
    "prev_k_noise": "noise: prev-token head -> keys of all layer-1 heads",
    "prev_k_noise_best_single": "noise: prev-token head -> keys of the "
                                "single most affected layer-1 head",
    "prev_k_denoise": "denoise: prev-token head -> keys of all layer-1 heads",
    "cur_v_noise": "noise: current-token head -> values of all layer-1 heads",
    "cur_v_denoise": "denoise: current-token head -> values of all "
                     "layer-1 heads",
    "cur_k_noise": "noise: current-token head -> keys of all layer-1 heads",
    "q_noise_max": "noise: largest path into the layer-1 queries (any "
                   "layer-0 head)",
    "denoise_path_max": "denoise: largest path (any layer-0 head, any input)",
    "prev_k_comp": "K-composition, prev-token head (mean over layer-1 heads)",
    "cur_v_comp": "V-composition, current-token head (mean over layer-1 heads)",
    "prev_act_noise": "noise: the prev-token head's whole output",
    "cur_act_noise": "noise: the current-token head's whole output",
    "copying_l1_mean": "copying score, mean of the layer-1 heads",
    "copying_l0_mean": "copying score, mean of the layer-0 heads",
    "dla_l1_sum": "direct logit attribution, sum of the layer-1 heads",
    "dla_l0_sum": "direct logit attribution, sum of the layer-0 heads",
    "dla_total": "logit difference of the model (sum of all terms)",
    "pos_denoise_resid0": "denoise: one first-copy token (resid entering "
                          "layer 0), per position",
    "pos_denoise_resid1": "denoise: resid entering layer 1 at one "
                          "first-copy position",
    "pos_noise_resid0": "noise: one first-copy token, per position",
    "pos_outside_max": "largest absolute score of resid and layer-0 rows "
                       "outside the first copy",
    "loss_half_step": "step: loss half-way down",
    "prev_half_step": "step: prev-token head's score half-way up",
    "induction_half_step": "step: layer-1 mean induction score half-way up",
}
_STEPS = ("loss_half_step", "prev_half_step", "induction_half_step")

# What each corruption (`corruption.KINDS`) replaces, which paths it can
# reveal and which it cannot (module docstring of `corruption`).
_KINDS = {
    "first_copy": ("the whole first copy",
                   "keys and values together: noising one of them, "
                   "denoising both jointly",
                   "the queries (untouched); keys apart from values"),
    "second_copy": ("the second copy (the queries)",
                    "paths into the queries",
                    "keys and values (intact)"),
    "key": ("first-copy tokens at even offsets (even predictions scored)",
            "paths into the keys (their previous-token information)",
            "values and queries (intact)"),
    "value": ("first-copy tokens at odd offsets (even predictions scored)",
              "paths into the values (the token copied)",
              "keys and queries (intact)"),
    "no_match": ("every earlier occurrence of a second-copy token",
                 "whether the model is wrong with confidence even with no "
                 "match to copy (a candidate run near chance)",
                 "keys apart from values (breaks both, as first_copy)"),
}


def _head(h, layer=0) -> str:
  """A head's name, `L0H2` (layers and heads from 0)."""
  return report_lib.head_name(layer, h)


def _corruption_table(claims) -> str:
  """What each corruption replaces and can see, and its raw metrics."""
  ref = claims["reference"]
  return report_lib.md_table(
      ["corruption", "replaces", "can reveal", "cannot reveal",
       "clean metric", "corrupted metric"],
      [[f"`{k}`", what, can, cannot,
        report_lib.summary(ref[k]["clean"], 2),
        report_lib.summary(ref[k]["corrupted"], 2)]
       for k, (what, can, cannot) in _KINDS.items() if k in ref])


def _claim_row(key, kind, d, spec, c) -> list:
  """One HEADLINES claim: the fraction over seeds with its t interval,
  per seed with its bootstrap interval over examples, the raw patched
  metric, against chance, the floor and the detectable difference."""
  per_seed = "; ".join(f"{v:.2f} {report_lib.interval(b, 2)}"
                       for v, b in zip(c["values"], c["bootstrap"]))
  floor = "-" if c["floor"] is None else report_lib.summary(c["floor"], 2)
  det = "-" if c["detectable"] is None else f"{c['detectable']:.2f}"
  return [key, f"`{kind}`", d, f"`{spec}`", report_lib.summary(c, 3),
          per_seed, report_lib.summary(c["metric"], 2),
          report_lib.summary(c["vs_chance"], 2), floor, det]


def _claim_table(claims) -> str:
  """Every HEADLINES claim, one row each."""
  return report_lib.md_table(
      ["key", "corruption", "way", "set", "fraction",
       "per seed [bootstrap]", "patched metric", "vs chance", "floor",
       "detectable"],
      [_claim_row(*h, claims[h[0]]) for h in survey_lib.HEADLINES])


def _calibration_table(cal) -> str:
  """Attribution against activation patching per direction and layer."""
  rows = []
  for name, c in cal.items():
    if isinstance(c, dict) and "slope" in c:
      d, layer = name.rsplit("_l", 1)
      rows.append([d, f"layer {layer}"] + [
          "n/a" if c[k] is None else report_lib.summary(c[k], 2)
          for k in ("slope", "pearson", "top_k")])
  return report_lib.md_table(
      ["way", "layer", "slope", "Pearson r", "top-1 agreement"], rows)


def _summary_table(saved) -> str:
  """The first-copy numbers over seeds, beside random where there is one."""
  comp, copy = (saved["baselines"]["composition"],
                saved["baselines"]["copying"]["copying"])
  random = {"prev_k_comp": comp["k"], "cur_v_comp": comp["v"],
            "copying_l1_mean": copy, "copying_l0_mean": copy}
  rows = []
  for k, mean_std in saved["summary"].items():
    digits = 0 if k in _STEPS else 3
    label = _LABELS[k] + (f" (random: {report_lib.fmt(*random[k])})"
                          if k in random else "")
    rows.append([k, report_lib.fmt(*mean_std, digits=digits), label,
                 ", ".join(f"{v:.{digits}f}" for v in saved["per_seed"][k]),
                 report_lib.interval(saved["summary_ci95"][k], digits)])
  return report_lib.md_table(
      ["key", "mean ± std", "quantity", "per seed", "95% t interval"], rows)


def _model_row(s, r) -> list:
  """One seed's model: loss, accuracy, its role heads, the layer-1 scores."""
  d, sc = r["derived"], r["scores"]
  return [s, f"{d['eval_loss']:.3f}", f"{r['curve']['accuracy'][-1]:.3f}",
          f"{_head(d['prev_head'])} ({d['prev_score']:.2f})",
          f"{_head(d['cur_head'])} ({d['cur_score']:.2f})",
          ", ".join(f"{v:.2f}" for v in sc["induction"][-1]),
          r["same_as_experiment_1"]]


def _path_rows(s, r) -> list[list]:
  """One seed's layer-0 heads: their scores and paths into layer 1."""
  sc, n, dn = r["scores"], r["heads"]["noise"], r["heads"]["denoise"]
  prev, cur = sc["previous_token"][0], sc["current_token"][0]
  return [[f"{s} {_head(h)}", f"{prev[h]:.2f}", f"{cur[h]:.2f}"]
          + [f"{n['path'][f'{k}_all'][h]:.2f}" for k in "qkv"]
          + [f"{n['path']['logits'][h]:.2f}"]
          + [f"{dn['path'][f'{k}_all'][h]:.2f}" for k in "qkv"]
          + [f"{n['activation'][0][h]:.2f}", f"{dn['activation'][0][h]:.2f}"]
          for h in range(len(prev))]


def _composition_rows(s, r) -> list[list]:
  """One seed's layer-0 heads' composition with the layer-1 heads."""
  c, sc = r["composition_means"], r["scores"]
  prev, cur = sc["previous_token"][0], sc["current_token"][0]
  return [[f"{s} {_head(h)}", f"{prev[h]:.2f} / {cur[h]:.2f}"]
          + [f"{c[k][h]:.3f}" for k in ("q", "k", "v", "k_rotary")]
          for h in range(len(c["q"]))]


def _attribution_rows(s, r) -> list[list]:
  """One seed's heads: activation and attribution patching, both ways."""
  h = r["heads"]
  n_l, n_h = np.shape(h["noise"]["activation"])
  return [[f"{s} {_head(i, l)}"]
          + [f"{h[d][k][l][i]:+.2f}" for d in ("denoise", "noise")
             for k in ("activation", "attribution")]
          for l in range(n_l) for i in range(n_h)]


def _copying_rows(s, r) -> list[list]:
  """One seed's heads: copying score, positive share, direct effect."""
  cp, dla = r["copying"], r["dla"]["heads"]
  n_l, n_h = np.shape(dla)
  return [[f"{s} {_head(i, l)}", f"{cp['copying'][l][i]:.2f}",
           f"{cp['positive_share'][l][i]:.2f}", f"{dla[l][i]:+.2f}"]
          for l in range(n_l) for i in range(n_h)]


def _dynamics_row(s, r) -> list:
  """One seed's training: the steepest drop and the landmark steps."""
  d, pc = r["derived"], r["phase_change"]
  return [s, f"{pc['from_step']}→{pc['to_step']}: "
          f"{pc['loss_before']:.2f}→{pc['loss_after']:.2f}",
          d["loss_half_step"], d["prev_half_step"], d["induction_half_step"],
          d["prev_formed_step"], d["induction_formed_step"]]


def _heads_over(values, threshold) -> str:
  """'L0H2 (0.84), L0H3 (0.35)' for the heads whose value passes."""
  hits = [f"{_head(h)} ({v:.2f})" for h, v in enumerate(values)
          if v >= threshold]
  return ", ".join(hits) if hits else "none"


def _circuit_line(s, r, matters) -> str:
  """Which layer-0 heads feed which layer-1 input in one seed (noising)."""
  d, p = r["derived"], r["heads"]["noise"]["path"]
  return (f"* Seed {s}: keys read {_heads_over(p['k_all'], matters)}; "
          f"values read {_heads_over(p['v_all'], matters)}; queries read "
          f"{_heads_over(p['q_all'], matters)}. Previous-token head "
          f"{_head(d['prev_head'])} (score {d['prev_score']:.2f}), "
          f"current-token head {_head(d['cur_head'])} (score "
          f"{d['cur_score']:.2f}).")


def _per_seed_tables(saved) -> dict:
  """The tables with rows for every seed, in the config's order."""
  e, b = saved["config"]["experiment"], saved["baselines"]
  runs = [(s, saved["runs"][f"seed{s}"]) for s in e["seeds"]]
  rows = lambda row: [x for s, r in runs for x in row(s, r)]
  md = report_lib.md_table
  return {
      "model_table": md(
          ["seed", "eval loss", "accuracy", "layer-0 previous-token head",
           "layer-0 current-token head", "layer-1 induction scores",
           "same as exp. 1"], [_model_row(s, r) for s, r in runs]),
      "path_table": md(
          ["seed, head", "prev-token", "current-token", "noise via q",
           "noise via k", "noise via v", "noise direct", "denoise via q",
           "denoise via k", "denoise via v", "noise z", "denoise z"],
          rows(_path_rows)),
      "circuit_lines": "\n".join(
          _circuit_line(s, r, saved["setup"]["matters"]) for s, r in runs),
      "composition_table": md(
          ["seed, head", "prev / current score", "Q-comp", "K-comp",
           "V-comp", "K-comp, rotary"],
          [["random", "-"] + [report_lib.fmt(*b["composition"][k])
                              for k in "qkv"] + ["-"]]
          + rows(_composition_rows)),
      "attribution_table": md(
          ["seed, head", "activation denoise", "attribution denoise",
           "activation noise", "attribution noise"],
          rows(_attribution_rows)),
      "copying_table": md(
          ["seed, head", "copying score", "positive share",
           "direct logit attribution"],
          [["random", report_lib.fmt(*b["copying"]["copying"]),
            report_lib.fmt(*b["copying"]["positive_share"]), "-"]]
          + rows(_copying_rows)),
      "dynamics_table": md(
          ["seed", "steepest loss drop (steps: loss)", "loss half-way",
           "prev-token half-way", "induction half-way",
           f"prev-token > {e['threshold']}",
           f"induction > {e['threshold']}"],
          [_dynamics_row(s, r) for s, r in runs]),
  }


def values(saved: dict) -> dict:
  """Every table, each as the report shows it."""
  claims = saved["claims"]
  return {"corruption_table": _corruption_table(claims),
          "claim_table": _claim_table(claims),
          "calibration_table": _calibration_table(saved["calibration"]),
          "summary_table": _summary_table(saved),
          **_per_seed_tables(saved)}
