"""Pretrained heads, reporting: tables, figures and findings from the
results dict of `run.measure`.

Shape letters: L layers, H heads. `write` draws the figures (figures.py)
and writes report.md and results.json. The prose is report.md.tmpl beside
this file; `render` fills it from results.json alone (the comparison with
Clark et al.'s numbers from claims.py), so a committed report regenerates
from its results.json.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from experiments.pretrained_heads import claims
from experiments.pretrained_heads import figures
from mha_jax.measure import report as report_lib

_NAMES = {"cls": "[CLS]", "sep": "[SEP]", "punct": 'punctuation ("." ",")',
          "previous": "previous token", "next": "next token",
          "self": "the token itself", "entropy": "entropy (nats)"}
# Kept out of results.json: the 72 x 72 distances are in the figure.
_DROP = ("distance",)
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """report.md, results.json and the figures into `workdir`; returns what
  results.json holds."""
  figures.draw(workdir, results)
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), _DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _ci(s, index=(), digits=3) -> str:
  """`mean [lo, hi]` of a results summary, at `index` of its arrays."""
  mean = np.asarray(s["mean"])[index]
  ci = np.asarray(s["ci95"])[index]
  return f"{report_lib.fmt(float(mean), digits=digits)} " + (
      report_lib.interval(ci.tolist(), digits))


def _layer_table(r) -> str:
  """Per layer, each class's share and the entropy, beside the floors."""
  h = r["heads"]
  keys = ("cls", "sep", "punct", "entropy")
  rows = [[l] + [c for k in keys for c in (
      _ci(h[k]["layer_trained"], l), _ci(h[k]["layer_init"], l))]
          for l in range(r["model"]["layers"])]
  rows.append(["uniform"] + [c for k in keys for c in (
      _ci(h[k]["uniform"]), "")])
  return report_lib.md_table(
      ["layer"] + [c for k in keys for c in (_NAMES[k], "re-initialised")],
      rows)


def _extreme_row(k, h) -> list:
  """The head with the largest mean `k` (smallest entropy), and floors."""
  m = np.asarray(h["trained"]["mean"])
  low = k == "entropy"
  idx = np.unravel_index(int(np.argmin(m) if low else np.argmax(m)), m.shape)
  init = np.asarray(h["init"]["mean"])
  return [_NAMES[k], report_lib.head_name(*idx), _ci(h["trained"], idx),
          _ci(h["init"], idx),
          report_lib.fmt(float(init.min() if low else init.max())),
          _ci(h["uniform"]), "-" if low else int((m > 0.5).sum())]


def _extreme_table(r) -> str:
  """Per measure: the head with the largest mean (smallest entropy)."""
  return report_lib.md_table(
      ["measure", "most extreme head", "its score", "same head "
       "re-initialised", "most extreme re-initialised head", "uniform",
       "heads above 0.5"],
      [_extreme_row(k, r["heads"][k]) for k in (
          "cls", "sep", "punct", "previous", "next", "self", "entropy")])


def _top_table(r) -> str:
  """The heads focused most on the previous, next and own token."""
  rows = [[_NAMES[k], report_lib.head_name(t["layer"], t["head"]),
           f"{report_lib.fmt(t['mean'])} {report_lib.interval(t['ci95'])}",
           report_lib.fmt(t["init"]), report_lib.fmt(t["uniform"])]
          for k in ("previous", "next", "self") for t in r["top"][k]]
  return report_lib.md_table(
      ["focus on", "head", "share", "same head re-initialised", "uniform"],
      rows)


def _js_table(r) -> str:
  """JS distances within and across layers, the permutation test, and the
  gap in units of its permutation null and of the mean distance."""
  a = r["js"]["against_init"]
  rows = [[label, report_lib.fmt(j["within_layer"]),
           report_lib.fmt(j["across_layer"]), report_lib.signed(j["gap"]),
           report_lib.fmt(j["p_value"]), claims.z_text(j),
           report_lib.fmt(share)]
          for j, label, share in (
              (r["js"]["trained"], "pretrained", a["share_trained"]),
              (r["js"]["init"], "re-initialised", a["share_init"]))]
  return report_lib.md_table(
      ["model", "JS distance within a layer", "across layers",
       "gap (across - within)", "permutation p",
       "z (gap in null std)", "gap / mean distance"], rows)


def _gradient_table(r) -> str:
  """Per layer, the gradient at [SEP] keys and at [CLS] keys, each
  against the other keys, beside the share on that token."""
  g = r["gradient"]
  return report_lib.md_table(
      ["layer", "share on [SEP]", "mean abs. gradient, [SEP] keys",
       "mean abs. gradient, other keys", "[SEP] / other", "share on [CLS]",
       "mean abs. gradient, [CLS] keys", "[CLS] / other"],
      [[l, _ci(g["sep_share"], l), _ci(g["sep"], l, 6),
        _ci(g["other"], l, 6), _ci(g["sep_over_other"], l),
        _ci(g["cls_share"], l), _ci(g["cls"], l, 6),
        _ci(g["cls_over_other"], l)]
       for l in range(r["model"]["layers"])])


def _single_table(r) -> str:
  """Per layer, [CLS] and [SEP] shares on sentence pairs against single
  sentences, with the single sentences' floors."""
  h, s = r["heads"], r["single_sentences"]
  rows = [[l, _ci(h["cls"]["layer_trained"], l), _ci(s["trained"]["cls"], l),
           _ci(s["init"]["cls"], l), _ci(h["sep"]["layer_trained"], l),
           _ci(s["trained"]["sep"], l), _ci(s["init"]["sep"], l)]
          for l in range(r["model"]["layers"])]
  rows.append(["uniform", _ci(h["cls"]["uniform"]), _ci(s["uniform"]["cls"]),
               "", _ci(h["sep"]["uniform"]), _ci(s["uniform"]["sep"]), ""])
  return report_lib.md_table(
      ["layer", "[CLS], pairs", "[CLS], single sentences",
       "re-initialised, single", "[SEP], pairs", "[SEP], single sentences",
       "re-initialised, single"], rows)


def _ranking_table(r) -> str:
  """The ranking task: the model, its re-initialised floor, chance."""
  a, f = r["ablation"]["clean"], r["ranking_floors"]
  return report_lib.md_table(
      ["model", "accuracy", "margin"],
      [["pretrained (rank half)", _ci(a["accuracy"]), _ci(a["margin"])],
       ["re-initialised (test half)", _ci(f["init_accuracy"]),
        _ci(f["init_margin"])],
       ["chance", report_lib.fmt(f["chance_accuracy"]), "0"]])


def _ablation_table(r, n=5) -> str:
  """The `n` heads whose zero ablation lowers the margin most: the
  pruning order (least harmful first) read from its end."""
  z, m = r["ablation"]["zero"], r["ablation"]["mean"]
  shape = np.shape(z["margin"]["mean"])
  rows = [[report_lib.head_name(*idx), _ci(z["margin"], idx),
           _ci(z["accuracy"], idx), _ci(m["margin"], idx),
           _ci(m["accuracy"], idx)]
          for idx in (np.unravel_index(int(f), shape)
                      for f in r["pruning"]["order"][::-1][:n])]
  return report_lib.md_table(
      ["head", "zero: Δmargin", "zero: Δaccuracy", "mean: Δmargin",
       "mean: Δaccuracy"], rows)


def _pruning_table(r) -> str:
  """The pruning curve against the random orders, point by point."""
  p = r["pruning"]
  rows = [[k, report_lib.fmt(p["ranked"]["accuracy"][i]),
           report_lib.fmt(p["random"]["accuracy"][i],
                          p["random"]["accuracy_std"][i]),
           _ci(p["accuracy_difference"], i), _ci(p["margin_difference"], i)]
          for i, k in enumerate(p["removed"])]
  return report_lib.md_table(
      ["heads removed", "least harmful first: accuracy",
       "random orders: accuracy", "difference in accuracy",
       "difference in margin"], rows)


def _setup(r) -> dict:
  """The set-up section's values: model, corpus and floors."""
  e, c, m = r["config"]["experiment"], r["corpus"], r["model"]
  return {
      "layers": m["layers"], "heads": m["heads"], "d_model": m["d_model"],
      "documents": c["documents"], "sentences": c["sentences"],
      "pairs": c["pairs"], "pairs_used": c["pairs_used"], "seed": e["seed"],
      "tokens_per_pair": _ci(c["tokens_per_pair"], digits=1),
      "documents_used": c["documents_used"],
      "truncated": c["truncated"], "max_len": e["max_len"],
      "resamples": e["resamples"], "init_seed": e["init_seed"],
      **{f"{k}_ids": r["classes"][k] for k in ("cls", "sep", "punct")}}


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  r, e = saved, saved["config"]["experiment"]
  counts = claims.ablation_counts(r)
  return {
      "model": r["model"]["name"],
      "command": report_lib.command("experiments.pretrained_heads", command),
      "wall_time": report_lib.wall_time(r["wall_s"], False),
      "explorer_pairs": len(r["explorer_pairs"]),
      **_setup(r),
      "layer_table": _layer_table(r), "extreme_table": _extreme_table(r),
      "top_table": _top_table(r),
      "js_pairs": r["js"]["pairs"], "js_table": _js_table(r),
      "reference": r["gradient"]["reference"],
      "gradient_pairs": r["gradient"]["pairs"],
      "gradient_table": _gradient_table(r),
      "single_table": _single_table(r),
      "single_inputs": r["single_sentences"]["inputs"],
      "single_tokens": _ci(r["single_sentences"]["tokens"], digits=1),
      "js_documents": r["js"]["against_init"]["documents"],
      "triples": e["triples"], "ranking_table": _ranking_table(r),
      "zero_below": counts["zero"], "mean_below": counts["mean"],
      "all_heads": r["model"]["layers"] * r["model"]["heads"],
      "ablation_table": _ablation_table(r),
      "random_orders": e["random_orders"], **claims.degraded(r),
      "pruning_table": _pruning_table(r),
      **claims.values(r),
  }
