"""Pretrained heads, the findings: each of Clark et al. (2019)'s claims
set beside this model's numbers, from the results dict alone.

Heads are named L<layer>.<head> (layers from 1, heads from 0, as the
explorer numbers them). Each claim cites the section or figure of the
paper it tests; where the paper's exact number is not quoted here, its
finding is described in words.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import report as report_lib


def ablation_counts(r):
  """How many heads' zero / mean-ablation margin interval lies below 0."""
  return {k: int((np.asarray(r["ablation"][k]["margin"]["ci95"])[..., 1]
                  < 0).sum()) for k in ("zero", "mean")}


def _layer_of_max(r, key):
  """(layer, value) of the layer with the largest mean `key`."""
  m = np.asarray(r["heads"][key]["layer_trained"]["mean"])
  return int(np.argmax(m)), float(np.max(m))


def _above(r, key, level=0.5):
  """Heads (L<l>H<h>) whose mean `key` share exceeds `level`."""
  m = np.asarray(r["heads"][key]["trained"]["mean"])
  return [report_lib.head_name(l, h)
          for l, h in zip(*np.nonzero(m > level))]


def _positional_claim(r):
  prev = ", ".join(_above(r, "previous")) or "none"
  nxt = ", ".join(_above(r, "next")) or "none"
  u = r["heads"]["previous"]["uniform"]["mean"]
  self_max = float(np.max(r["heads"]["self"]["trained"]["mean"]))
  return (
      "**Previous and next token.** Clark et al. (Sec. 3.1) found heads that "
      "put most of their attention on the previous or the next token, "
      "mostly in the earlier layers, and that most heads put little "
      "attention on the token itself. Here the heads with more than half "
      f"their weight on the previous token are: {prev}; on the next token: "
      f"{nxt} (uniform attention gives {report_lib.fmt(u)}). The largest "
      f"share on the token itself is {report_lib.fmt(self_max)}.")


def _sep_claim(r):
  sep_l, sep_v = _layer_of_max(r, "sep")
  cls_l, cls_v = _layer_of_max(r, "cls")
  h = r["heads"]
  return (
      "**[SEP], [CLS] and punctuation.** Clark et al. (Sec. 3.2, Fig. 2) "
      "found much of BERT-base's attention on a few tokens, with over half "
      "of the attention in layers 6-10 on [SEP] (the paper counts layers "
      "from 1, this report from 0). In this model the largest "
      f"layer mean on [SEP] is {report_lib.fmt(sep_v)} (layer {sep_l}; "
      f"uniform {report_lib.fmt(h['sep']['uniform']['mean'])}), while "
      f"[CLS] takes up to {report_lib.fmt(cls_v)} of a layer's attention "
      f"(layer {cls_l}; uniform "
      f"{report_lib.fmt(h['cls']['uniform']['mean'])})"
      + (": where BERT-base parks attention on [SEP], this model parks it "
         "on [CLS]. " if cls_v > 0.5 * sep_v + 0.25 else ". ") +
      f"{len(_above(r, 'cls'))} heads put more than half their weight on "
      f"[CLS], {len(_above(r, 'sep'))} on [SEP] and "
      f"{len(_above(r, 'punct'))} on punctuation.")


def _gradient_claim(r):
  g = r["gradient"]
  ratio = np.asarray(g["sep_over_other"]["mean"])
  share = float(np.max(g["sep_share"]["mean"]))
  cells = ", ".join(f"{v:.2f}" for v in ratio)
  return (
      "**[SEP] as a no-op.** Clark et al. (Sec. 3.2, Fig. 3) saw the "
      "gradient of the masked-LM loss with respect to attention on [SEP] "
      "become very small from (their) layer 5 on, while attention to [SEP] "
      "stayed high, and read attending to [SEP] as a no-op. Here the gradient per "
      "weight on [SEP] keys over that on other keys is, layer by layer, "
      f"{cells}, beside a layer share on [SEP] of at most "
      f"{report_lib.fmt(share)}. Per weight, the embedding is "
      f"{'less' if ratio[-1] < 1 else 'more'} sensitive to attention on "
      f"[SEP] than elsewhere in the last layer"
      + (", but with so little attention on [SEP] there is little parked "
         "attention for a no-op reading to explain" if share < 0.1 else "")
      + "; the table gives the intervals.")


def _entropy_claim(r):
  h = r["heads"]["entropy"]
  lt = np.asarray(h["layer_trained"]["mean"])
  low, high = int(np.argmin(lt)), int(np.argmax(lt))
  return (
      "**Broad and focused heads.** Clark et al. (Sec. 3.3, Fig. 4) found "
      "broad heads in the lower layers (entropy close to uniform) and "
      "focused heads after them. Here the broadest layer is layer "
      f"{high} (mean entropy {report_lib.fmt(float(lt.max()))} nats), the "
      f"most focused layer {low} ({report_lib.fmt(float(lt.min()))}); "
      "uniform attention "
      f"over the same tokens gives {report_lib.fmt(h['uniform']['mean'])} "
      "and the re-initialised model's layers "
      f"{report_lib.fmt(float(np.min(h['layer_init']['mean'])))} to "
      f"{report_lib.fmt(float(np.max(h['layer_init']['mean'])))}.")


def _cluster_claim(r):
  j, i = r["js"]["trained"], r["js"]["init"]
  return (
      "**Clustering by layer.** Clark et al. (Sec. 6, Fig. 6) found heads "
      "of one layer often close to each other. Here the mean JS distance "
      f"within a layer is {report_lib.fmt(j['within_layer'])} against "
      f"{report_lib.fmt(j['across_layer'])} across layers (permutation p "
      f"{report_lib.fmt(j['p_value'])}); the re-initialised model gives "
      f"{report_lib.fmt(i['within_layer'])} and "
      f"{report_lib.fmt(i['across_layer'])} (p "
      f"{report_lib.fmt(i['p_value'])}).")


def _pruning_claim(config, r):
  p = r["pruning"]
  counts = ablation_counts(r)
  n = r["model"]["layers"] * r["model"]["heads"]
  return (
      "**Few heads matter?** Michel et al. (2019) removed many of BERT's "
      "heads at test time with little loss, and Voita et al. (2019) found "
      "a few specialised heads doing most of the work. Here "
      f"{counts['zero']} of {n} heads lower the ranking margin, alone and "
      "with an interval below 0, under zero ablation; removing heads least "
      "harmful first, accuracy " + degraded_text(config, r) + " The task "
      "is partly solved without attention: with every head removed "
      f"accuracy is {report_lib.fmt(p['ranked']['accuracy'][-1])} against "
      f"{report_lib.fmt(p['ranked']['accuracy'][0])} with all, so the "
      "margin is the more telling column.")


def degraded_text(config, r):
  """When the ranked and random pruning curves first lose `degrade_by`."""
  p, e = r["pruning"], config.experiment
  ranked = p["ranked"]["first_degraded"]
  rand = [k for k in p["random"]["first_degraded"] if k is not None]
  return (
      f"{'never' if ranked is None else 'first'} falls more than "
      f"{e.degrade_by} below the clean model's"
      + ("" if ranked is None else f" at {ranked} heads removed")
      + " on the ranked curve; on the random orders it does at "
      + (", ".join(str(k) for k in rand) or "none") + " heads removed "
      f"({len(rand)} of {len(p['random']['first_degraded'])} orders).")


def _differences(r):
  return (
      "**Where this model differs from BERT-base.** all-MiniLM-L6-v2 has 6 "
      "layers of 12 heads of width 32 (BERT-base: 12 layers of 12 heads of "
      "width 64), was distilled from a larger model and then trained "
      "contrastively on sentence pairs for mean-pooled embeddings, not for "
      "masked-LM on [CLS] a [SEP] b [SEP] inputs (a bi-encoder reads one "
      "sentence at a time), so a pair with [SEP] in the middle is less like "
      "its training inputs than like BERT's. Clark et al.'s numbers are from 1000 Wikipedia segments of "
      "two paragraphs; these are sentence pairs of technical "
      "documentation.")


def comparison(config, r):
  return ["## Against Clark et al. (2019) on BERT-base",
          _sep_claim(r), _gradient_claim(r), _entropy_claim(r),
          _positional_claim(r), _cluster_claim(r),
          _pruning_claim(config, r), _differences(r)]
