"""Pretrained heads, reporting: tables, figures and findings from the
results dict of `run.measure`.

Shape letters: L layers, H heads. Every cell goes through
`mha_jax.measure.report`; the comparison with Clark et al. is in
claims.py, the figures in figures.py.
"""

from __future__ import annotations

import numpy as np

from experiments.pretrained_heads import claims
from experiments.pretrained_heads import figures
from mha_jax.measure import report as report_lib

_NAMES = {"cls": "[CLS]", "sep": "[SEP]", "punct": 'punctuation ("." ",")',
          "previous": "previous token", "next": "next token",
          "self": "the token itself", "entropy": "entropy (nats)"}
# Kept out of results.json: the 72 x 72 distances are in the figure.
_DROP = ("distance",)


def _ci(s, index=(), digits=3):
  """`mean [lo, hi]` of a results summary, at `index` of its arrays."""
  mean = np.asarray(s["mean"])[index]
  ci = np.asarray(s["ci95"])[index]
  return f"{report_lib.fmt(float(mean), digits=digits)} " + (
      report_lib.interval(ci.tolist(), digits))


def _layer_table(r):
  h = r["heads"]
  keys = ("cls", "sep", "punct", "entropy")
  rows = []
  for l in range(r["model"]["layers"]):
    rows.append([l] + [c for k in keys for c in (
        _ci(h[k]["layer_trained"], l), _ci(h[k]["layer_init"], l))])
  rows.append(["uniform"] + [c for k in keys for c in (
      _ci(h[k]["uniform"]), "")])
  return report_lib.md_table(
      ["layer"] + [c for k in keys for c in (_NAMES[k], "re-initialised")],
      rows)


def _extreme_table(r):
  """Per measure: the head with the largest mean (smallest entropy)."""
  rows = []
  for k in ("cls", "sep", "punct", "previous", "next", "self", "entropy"):
    h = r["heads"][k]
    m = np.asarray(h["trained"]["mean"])
    flat = int(np.argmin(m) if k == "entropy" else np.argmax(m))
    idx = np.unravel_index(flat, m.shape)
    above = int((m > 0.5).sum()) if k != "entropy" else "-"
    rows.append([_NAMES[k], report_lib.head_name(*idx), _ci(h["trained"], idx),
                 _ci(h["init"], idx),
                 report_lib.fmt(float(np.max(h["init"]["mean"])
                                      if k != "entropy" else
                                      np.min(h["init"]["mean"]))),
                 _ci(h["uniform"]), above])
  return report_lib.md_table(
      ["measure", "most extreme head", "its score", "same head "
       "re-initialised", "most extreme re-initialised head", "uniform",
       "heads above 0.5"], rows)


def _top_table(r):
  rows = []
  for k in ("previous", "next", "self"):
    for t in r["top"][k]:
      rows.append([_NAMES[k], report_lib.head_name(t['layer'], t['head']),
                   f"{report_lib.fmt(t['mean'])} "
                   f"{report_lib.interval(t['ci95'])}",
                   report_lib.fmt(t["init"]), report_lib.fmt(t["uniform"])])
  return report_lib.md_table(
      ["focus on", "head", "share", "same head re-initialised", "uniform"],
      rows)


def _js_table(r):
  rows = []
  for name, label in (("trained", "pretrained"), ("init", "re-initialised")):
    j = r["js"][name]
    rows.append([label, report_lib.fmt(j["within_layer"]),
                 report_lib.fmt(j["across_layer"]), report_lib.signed(
                     j["gap"]), report_lib.fmt(j["p_value"])])
  return report_lib.md_table(
      ["model", "JS distance within a layer", "across layers",
       "gap (across - within)", "permutation p"], rows)


def _gradient_table(r):
  g = r["gradient"]
  return report_lib.md_table(
      ["layer", "share on [SEP]", "mean abs. gradient, [SEP] keys",
       "mean abs. gradient, other keys", "[SEP] / other"],
      [[l, _ci(g["sep_share"], l), _ci(g["sep"], l, 6),
        _ci(g["other"], l, 6), _ci(g["sep_over_other"], l)]
       for l in range(r["model"]["layers"])])


def _ranking_table(r):
  a, f = r["ablation"]["clean"], r["ranking_floors"]
  return report_lib.md_table(
      ["model", "accuracy", "margin"],
      [["pretrained (rank half)", _ci(a["accuracy"]), _ci(a["margin"])],
       ["re-initialised (test half)", _ci(f["init_accuracy"]),
        _ci(f["init_margin"])],
       ["chance", report_lib.fmt(f["chance_accuracy"]), "0"]])


def _ablation_rows(r, n):
  """The `n` heads whose zero ablation lowers the margin most."""
  z, m = r["ablation"]["zero"], r["ablation"]["mean"]
  dm = np.asarray(z["margin"]["mean"])
  order = np.argsort(dm.ravel())[:n]
  rows = []
  for f in order:
    idx = np.unravel_index(int(f), dm.shape)
    rows.append([report_lib.head_name(*idx), _ci(z["margin"], idx),
                 _ci(z["accuracy"], idx), _ci(m["margin"], idx),
                 _ci(m["accuracy"], idx)])
  return rows


def _ablation_table(r, n=5):
  return report_lib.md_table(
      ["head", "zero: Δmargin", "zero: Δaccuracy", "mean: Δmargin",
       "mean: Δaccuracy"], _ablation_rows(r, n))


def _pruning_table(r):
  p = r["pruning"]
  rows = []
  for i, k in enumerate(p["removed"]):
    rows.append([k, report_lib.fmt(p["ranked"]["accuracy"][i]),
                 report_lib.fmt(p["random"]["accuracy"][i],
                                p["random"]["accuracy_std"][i]),
                 _ci(p["accuracy_difference"], i),
                 _ci(p["margin_difference"], i)])
  return report_lib.md_table(
      ["heads removed", "least harmful first: accuracy",
       "random orders: accuracy", "difference in accuracy",
       "difference in margin"], rows)


def _setup(config, r):
  e, c, m = config.experiment, r["corpus"], r["model"]
  return f"""## Set-up

Model: {m['name']} ({m['layers']} layers x {m['heads']} heads, d_model
{m['d_model']}), loaded with `mha_jax.load_pretrained` and its
tokenizer.json. Corpus: {c['documents']} documents of the Python standard
library's English prose (each `pydoc_data.topics` help page, and the
docstrings of each top-level stdlib module read with `ast`), split into
paragraphs at blank lines (indented paragraphs, which hold grammar and code,
dropped) and into sentences after ".", "!" or "?" followed by a space and
a capital letter; a sentence is kept with 5 to 40 words, a capital first
letter and a final full stop: {c['sentences']} sentences. Two neighbouring
sentences of one paragraph make a pair, `[CLS] a [SEP] b [SEP]` with token
type 1 on b, as BERT was pre-trained and Clark et al. (2019) fed it (they
used two consecutive Wikipedia paragraphs; these are two sentences):
{c['pairs']} pairs, of which {c['pairs_used']} drawn with seed {e.seed},
{_ci(c['tokens_per_pair'], digits=1)} tokens each (mean [95% interval of
the mean]), {c['truncated']} cut at {e.max_len} tokens.

Every per-head score is each pair's mean over its real query tokens, then
the mean over pairs, with a 95% percentile-bootstrap interval over pairs
({e.resamples} resamples; spreads are sample std, ddof 1). Floors:
**uniform** attention over the same pair's real tokens, and the
**re-initialised** model (the same `ModelConfig` with mha_jax's own
initialisation, seed {e.init_seed}). Token classes are data: the ids of
[CLS] {r['classes']['cls']}, [SEP] {r['classes']['sep']} and "." ","
{r['classes']['punct']} passed to `head_metrics.class_share`."""


def _sections(config, r):
  e = config.experiment
  counts = claims.ablation_counts(r)
  n_heads = r["model"]["layers"] * r["model"]["heads"]
  js = r["js"]
  g = r["gradient"]
  return [
      "## Where attention goes, by layer (Clark et al. Fig. 2 and 4)",
      _layer_table(r),
      "![shares per layer](layer_shares.png) ![entropy per layer]"
      "(entropy.png)",
      "## The most extreme head per measure",
      _extreme_table(r),
      "## Positional heads: previous, next and own token",
      _top_table(r),
      f"## Do heads cluster by layer? (Clark et al. Fig. 6)\n\n"
      f"Mean Jensen-Shannon distance (bits, square root per row, "
      f"`head_metrics.js_distance`) between every two heads' patterns on "
      f"{js['pairs']} pairs; the permutation p is the share of 1000 random "
      f"relabellings of heads to layers with a gap at least as large. The "
      f"figure places the heads in 2-D by classical multidimensional scaling "
      f"of these distances.",
      _js_table(r),
      "![heads by JS distance](heads_mds.png)",
      f"## [SEP] as a no-op? (Clark et al. Fig. 3)\n\n"
      f"The scalar is the cosine between the pair's pooled embedding (mean "
      f"of the last hidden states over real tokens, normalised: how "
      f"all-MiniLM-L6-v2 is used) and that of the fixed sentence "
      f"\"{g['reference']}\"; its gradient with respect to every attention "
      f"weight (a zero patch added at each layer's `pattern` site), as a "
      f"mean |gradient| per weight over real queries, split by the weight's "
      f"key, on {g['pairs']} pairs.",
      _gradient_table(r),
      "![gradient at SEP](sep_gradient.png)",
      f"## Which heads the embedding needs\n\n"
      f"The task the model was trained for is ranking related sentences "
      f"above unrelated ones. Offline proxy: {e.triples} triples (anchor; "
      f"the next sentence of its paragraph; a sentence of another "
      f"document) per half, two halves drawn with seed {e.seed}. "
      f"Accuracy is the share of triples with cos(anchor, neighbour) > "
      f"cos(anchor, other) on single-sentence inputs `[CLS] s [SEP]`; the "
      f"margin is the mean difference of the two cosines. Each head is "
      f"ablated alone on the rank half (zero: its `z` set to 0; mean: its "
      f"`z` set to its mean over every real token of the half), paired "
      f"differences with bootstrap intervals over triples.",
      _ranking_table(r),
      f"The five heads whose zero ablation costs the most margin; "
      f"{counts['zero']} of {n_heads} heads have a zero-ablation margin "
      f"interval below 0, {counts['mean']} under mean ablation.",
      _ablation_table(r),
      f"## Pruning curve\n\n"
      f"Heads removed cumulatively (zero ablation), least harmful first by "
      f"the rank half's single-head margin drop, scored on the test half, "
      f"against {e.random_orders} random orders; differences are ranked "
      f"minus the random orders' mean, paired per test triple. Accuracy "
      f"{claims.degraded_text(config, r)}",
      _pruning_table(r),
      "![pruning](pruning.png)",
  ]


def write(config, results, workdir) -> dict:
  """report.md, results.json and the figures into `workdir`; returns what
  results.json holds."""
  figures.draw(workdir, results)
  r = results
  text = "\n\n".join(
      [f"# What a pretrained transformer's heads look at: {r['model']['name']}",
       f"Command: {report_lib.command('experiments.pretrained_heads')} "
       f"({report_lib.wall_time(r['wall_s'], False)}; the model's explorer "
       f"page: [explorer.html](explorer.html), {len(r['explorer_pairs'])} "
       f"short pairs, patterns of the first; token types are 0 there, as "
       f"`experiments.explore --pretrained` runs it).",
       _setup(config, r)] + _sections(config, r)
      + claims.comparison(config, r))
  return report_lib.write_outputs(workdir, results, text, drop=_DROP,
                                  config=config)
