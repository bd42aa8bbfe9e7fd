"""Pretrained heads, the findings: the numbers that set each of Clark et
al. (2019)'s claims beside this model's, from results.json alone.

`values` gives the template's values for the comparison section (its
prose is in report.md.tmpl); a wording that depends on a number is chosen
here.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import report as report_lib

fmt = report_lib.fmt


def ablation_counts(r) -> dict:
  """How many heads' zero / mean-ablation margin interval lies below 0."""
  return {k: int((np.asarray(r["ablation"][k]["margin"]["ci95"])[..., 1]
                  < 0).sum()) for k in ("zero", "mean")}


def _layer_of_max(r, key) -> tuple[int, float]:
  """(layer, value) of the layer with the largest mean `key`."""
  m = np.asarray(r["heads"][key]["layer_trained"]["mean"])
  return int(np.argmax(m)), float(np.max(m))


def _above(r, key, level=0.5) -> list[str]:
  """Heads (L<l>H<h>) whose mean `key` share exceeds `level`."""
  m = np.asarray(r["heads"][key]["trained"]["mean"])
  return [report_lib.head_name(l, h)
          for l, h in zip(*np.nonzero(m > level))]


def degraded(saved) -> dict:
  """When the ranked and random pruning curves first lose `degrade_by`."""
  p = saved["pruning"]
  ranked = p["ranked"]["first_degraded"]
  rand = [k for k in p["random"]["first_degraded"] if k is not None]
  return {
      "ranked_falls": "never falls" if ranked is None else "first falls",
      "degrade_by": str(saved["config"]["experiment"]["degrade_by"]),
      "ranked_at": "" if ranked is None else f" at {ranked} heads removed",
      "random_degraded": ", ".join(str(k) for k in rand) or "none",
      "random_degraded_count": len(rand)}


def _sep_cls(r) -> dict:
  """Where the layers park attention: [SEP] against [CLS]."""
  sep_l, sep_v = _layer_of_max(r, "sep")
  cls_l, cls_v = _layer_of_max(r, "cls")
  h = r["heads"]
  return {
      "sep_layer_max": fmt(sep_v), "sep_layer": sep_l,
      "sep_uniform": fmt(h["sep"]["uniform"]["mean"]),
      "cls_layer_max": fmt(cls_v), "cls_layer": cls_l,
      "cls_uniform": fmt(h["cls"]["uniform"]["mean"]),
      "parks_on_cls": (": where BERT-base parks attention on [SEP], this "
                       "model parks it on [CLS]"
                       if cls_v > 0.5 * sep_v + 0.25 else ""),
      **{f"{k}_heads": len(_above(r, k)) for k in ("cls", "sep", "punct")}}


def _gradient(r) -> dict:
  """The gradient at [SEP] keys over other keys, beside the share."""
  g = r["gradient"]
  ratio = np.asarray(g["sep_over_other"]["mean"])
  share = float(np.max(g["sep_share"]["mean"]))
  return {
      "sep_ratios": ", ".join(f"{v:.2f}" for v in ratio),
      "sep_share_max": fmt(share),
      "sep_sensitivity": "less" if ratio[-1] < 1 else "more",
      "little_parked": (", but with so little attention on [SEP] there is "
                        "little parked attention for a no-op reading to "
                        "explain" if share < 0.1 else "")}


def _entropy(r) -> dict:
  """The broadest and most focused layers, beside the floors."""
  h = r["heads"]["entropy"]
  lt = np.asarray(h["layer_trained"]["mean"])
  init = np.asarray(h["layer_init"]["mean"])
  return {"broad_layer": int(np.argmax(lt)), "broad_entropy": fmt(lt.max()),
          "focused_layer": int(np.argmin(lt)),
          "focused_entropy": fmt(lt.min()),
          "uniform_entropy": fmt(h["uniform"]["mean"]),
          "init_entropy_low": fmt(init.min()),
          "init_entropy_high": fmt(init.max())}


def values(saved) -> dict:
  """The comparison section's values, each written as the report shows
  it."""
  r, j, i = saved, saved["js"]["trained"], saved["js"]["init"]
  accuracy = r["pruning"]["ranked"]["accuracy"]
  return {
      **_sep_cls(r), **_gradient(r), **_entropy(r),
      "previous_heads": ", ".join(_above(r, "previous")) or "none",
      "next_heads": ", ".join(_above(r, "next")) or "none",
      "previous_uniform": fmt(r["heads"]["previous"]["uniform"]["mean"]),
      "self_max": fmt(np.max(r["heads"]["self"]["trained"]["mean"])),
      "js_within": fmt(j["within_layer"]),
      "js_across": fmt(j["across_layer"]), "js_p": fmt(j["p_value"]),
      "init_js_within": fmt(i["within_layer"]),
      "init_js_across": fmt(i["across_layer"]),
      "init_js_p": fmt(i["p_value"]),
      "none_kept_accuracy": fmt(accuracy[-1]),
      "all_kept_accuracy": fmt(accuracy[0])}
