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
      "parks_on_cls": (": where BERT-base puts its attention on [SEP], this "
                       "model puts it on [CLS]"
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


def _cls_controls(r) -> dict:
  """The [CLS] share on single sentences against pairs, and whether the
  no-op reading holds for [CLS] where the share is large."""
  h, s, g = r["heads"], r["single_sentences"], r["gradient"]
  pairs = np.asarray(h["cls"]["layer_trained"]["mean"])
  single = np.asarray(s["trained"]["cls"]["mean"])
  lo, hi = (np.asarray(s["trained"]["cls"]["ci95"])[:, i] for i in (0, 1))
  big = [l for l in range(len(pairs)) if pairs[l] > 0.25]
  ratio = np.asarray(g["cls_over_other"]["mean"])
  ratio_hi = np.asarray(g["cls_over_other"]["ci95"])[:, 1]
  ratio_lo = np.asarray(g["cls_over_other"]["ci95"])[:, 0]
  below = [l for l in big if ratio_hi[l] < 1]
  above = [l for l in big if ratio_lo[l] > 1]
  layers = lambda ls: ", ".join(str(l) for l in ls) or "none"
  same = all(min(pairs[l], single[l]) > 0.5 * max(pairs[l], single[l])
             for l in big)
  return {
      "big_cls_layers": layers(big),
      "single_cls": ", ".join(f"{single[l]:.3f} [{lo[l]:.3f}, {hi[l]:.3f}]"
                              for l in big),
      "pairs_cls": ", ".join(f"{pairs[l]:.3f}" for l in big),
      "single_verdict": (
          "the [CLS] share is a property of the model, not of the pair "
          "inputs it never saw (within a factor of 2 in every such layer)"
          if same else "the pair inputs change where these layers attend: "
          "the [CLS] share on pairs is NOT what the model does on its own "
          "inputs"),
      "cls_ratios": ", ".join(f"{v:.2f}" for v in ratio),
      "cls_noop_verdict": (
          f"per weight, the embedding is less sensitive to attention on "
          f"[CLS] than elsewhere in layers {layers(below)} (interval below "
          f"1) and more sensitive in layers {layers(above)} (above 1), "
          f"of the layers with a [CLS] share above 0.25 "
          f"({layers(big)})"),
      "cls_noop_reading": (
          "consistent with Clark et al.'s no-op reading, moved from [SEP] "
          "to [CLS]" if big and len(below) == len(big) else
          "so the no-op reading does NOT hold for [CLS] in every such "
          "layer: the attention parked there is not shown to be inert")}


def z_text(j) -> str:
  """A clustering's permutation z, 'n/a' where the null has no spread."""
  return "n/a" if j["z"] is None else f"{j['z']:.1f}"


def _clustering(r) -> dict:
  """Clustering by layer, trained against re-initialised."""
  a, j, i = r["js"]["against_init"], r["js"]["trained"], r["js"]["init"]
  lo, hi = a["ci95"]
  return {
      "js_z": z_text(j), "init_js_z": z_text(i),
      "share_trained": fmt(a["share_trained"]),
      "share_init": fmt(a["share_init"]),
      "share_difference": (f"{report_lib.signed(a['difference'])} "
                           f"{report_lib.interval(a['ci95'])}"),
      "clustering_verdict": (
          "training adds to the layer clustering the architecture already "
          "gives (difference interval above 0)" if lo > 0 else
          "training is NOT separated from the architecture here "
          "(difference interval reaches 0)" if hi > 0 else
          "the re-initialised model clusters more (interval below 0)")}


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
      **_sep_cls(r), **_gradient(r), **_entropy(r), **_cls_controls(r),
      **_clustering(r),
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
