"""Pretrained heads: which heads the sentence embedding needs.

Shape letters: N triples, L layers, H heads, K points of the pruning
curve.

The ranking task (anchor, its next sentence, a sentence of another
document) on single-sentence inputs, each head ablated alone (zero and
mean), and the pruning curve: heads removed least harmful first against
random orders. Intervals resample the anchors' documents.
"""

from __future__ import annotations

import numpy as np

from experiments.pretrained_heads import corpus
from experiments.pretrained_heads import embedding
from experiments.pretrained_heads import intervals
from mha_jax import pretrained


def ranking_inputs(tok, pairs_, e, doc_index):
  """Two halves of triples (rank, test): `(ids, mask, idx [N, 3], groups
  [N])` each, a triple's group the document of its anchor."""
  triples = corpus.ranking_triples(pairs_, 2 * e.triples, seed=e.seed)
  halves = []
  for half in (triples[:e.triples], triples[e.triples:]):
    sents = [s for t in half for s in (t["anchor"], t["positive"],
                                       t["negative"])]
    ids, mask = pretrained.encode(tok, sents, max_len=e.max_len)
    halves.append((ids, mask, np.arange(len(sents)).reshape(-1, 3),
                   np.asarray([doc_index[t["doc"]] for t in half])))
  return halves


def ablation(model, half, e) -> dict:
  """Each head's zero- and mean-ablation effect on the rank half: the
  change in margin and accuracy per triple, with intervals."""
  ids, mask, idx, groups = half
  c = model.config
  clean_margin, clean_acc = embedding.ranking(embedding.embed(model, ids,
                                                              mask), idx)
  fills = {"zero": None, "mean": embedding.mean_z(model, ids, mask)}
  out = {"clean": {"margin": intervals.summary(clean_margin, e, groups),
                   "accuracy": intervals.summary(clean_acc, e, groups)}}
  for kind, fill in fills.items():
    dm = np.zeros((idx.shape[0], c.num_layers, c.num_heads))
    da = np.zeros_like(dm)
    for l in range(c.num_layers):
      for h in range(c.num_heads):
        gates = np.ones((c.num_layers, c.num_heads), np.float32)
        gates[l, h] = 0.0
        m, a = embedding.ranking(embedding.embed(model, ids, mask,
                                                 gates=gates, fill=fill), idx)
        dm[:, l, h], da[:, l, h] = m - clean_margin, a - clean_acc
    out[kind] = {"margin": intervals.summary(dm, e, groups),
                 "accuracy": intervals.summary(da, e, groups)}
  return out


def _curve(model, half, order, removed):
  """Per-triple (margin, accuracy) `[K, N]` with `order[:k]` heads zeroed."""
  ids, mask, idx, _ = half
  c = model.config
  margins, accs = [], []
  for k in removed:
    gates = np.ones(c.num_layers * c.num_heads, np.float32)
    gates[np.asarray(order[:k], int)] = 0.0
    m, a = embedding.ranking(embedding.embed(
        model, ids, mask, gates=gates.reshape(c.num_layers, c.num_heads)),
        idx)
    margins.append(m)
    accs.append(a)
  return np.asarray(margins), np.asarray(accs)


def _first_degraded(acc_curve, removed, degrade_by):
  """The fewest heads removed at which accuracy falls `degrade_by` below
  the clean accuracy (None: never on the curve)."""
  clean = acc_curve[0]
  low = [k for k, a in zip(removed, acc_curve) if a < clean - degrade_by]
  return low[0] if low else None


def pruning(model, half, ablation, e) -> dict:
  """Heads removed least harmful first (zero ablation on the rank half),
  scored on the test half, against random orders."""
  n_heads = model.config.num_layers * model.config.num_heads
  removed = list(range(0, n_heads + 1, e.prune_step))
  if removed[-1] != n_heads:
    removed.append(n_heads)
  # Least harmful first: the smallest drop in margin when removed alone.
  ranked = np.argsort(-ablation["zero"]["margin"]["mean"].ravel(),
                      kind="stable")
  m_rank, a_rank = _curve(model, half, ranked, removed)
  rng = np.random.default_rng(e.seed + 1)
  rand = [_curve(model, half, rng.permutation(n_heads), removed)
          for _ in range(e.random_orders)]
  m_rand = np.mean([r[0] for r in rand], 0)  # [K, N]
  acc_rand = np.asarray([r[1].mean(1) for r in rand])  # [orders, K]
  return {
      "removed": removed, "order": ranked,
      "ranked": {"accuracy": a_rank.mean(1), "margin": m_rank.mean(1),
                 "first_degraded": _first_degraded(a_rank.mean(1), removed,
                                                   e.degrade_by)},
      "random": {"accuracy": acc_rand.mean(0),
                 "accuracy_std": acc_rand.std(0, ddof=1),
                 "margin": m_rand.mean(1),
                 "first_degraded": [_first_degraded(a, removed, e.degrade_by)
                                    for a in acc_rand]},
      # Paired over test triples: ranked minus the random orders' mean.
      "margin_difference": intervals.summary((m_rank - m_rand).T, e, half[3]),
      "accuracy_difference": intervals.summary(
          (a_rank - np.mean([r[1] for r in rand], 0)).T, e, half[3])}
