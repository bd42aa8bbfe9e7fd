"""Pretrained heads, measuring: every head of an encoder on real sentence
pairs, beside its floors, and what removing heads does to the embedding.

`measure` returns the results dict that report.py lays out. Shape letters:
N pairs or triples, L layers, H heads, R bootstrap resamples, K points of
the pruning curve.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from experiments.pretrained_heads import corpus
from experiments.pretrained_heads import embedding
from experiments.pretrained_heads import models
from experiments.pretrained_heads import survey
from mha_jax import pretrained
from mha_jax.interp import explorer
from mha_jax.interp import survey as survey_lib


def bootstrap_means(values, *, resamples: int, seed: int) -> np.ndarray:
  """`[..., 2]` percentile-bootstrap 95% intervals of the mean over axis 0
  of `values [N, ...]`, every entry on the same draws of the N units."""
  v = np.asarray(values, np.float64)
  n = v.shape[0]
  rng = np.random.default_rng(seed)
  # A resample's mean is (its counts of each unit) @ values / N.
  counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # [R, N]
  means = (counts @ v.reshape(n, -1) / n).reshape((resamples,) + v.shape[1:])
  return np.moveaxis(np.quantile(means, [0.025, 0.975], axis=0), 0, -1)


def _summary(values, e) -> dict:
  """{"mean", "std" (ddof 1, over units), "ci95"} of `values [N, ...]`."""
  v = np.asarray(values, np.float64)
  return {"mean": v.mean(0), "std": v.std(0, ddof=1),
          "ci95": bootstrap_means(v, resamples=e.resamples, seed=e.seed)}


def _classes(tok) -> dict:
  """The token classes as ids: [CLS], [SEP] and punctuation ("." ",")."""
  ids = {"cls": ["[CLS]"], "sep": ["[SEP]"], "punct": [".", ","]}
  out = {k: [tok.token_to_id(t) for t in v] for k, v in ids.items()}
  missing = [t for k, v in ids.items() for t, i in zip(v, out[k])
             if i is None]
  if missing:
    raise ValueError(f"the tokenizer has no token for {missing}")
  return out


def _heads(trained, init, uniform, e) -> dict:
  """measure -> per head (trained, init: mean/std/ci95 `[L, H]`) and per
  layer (the layer's mean over heads `[L]`), uniform as one number."""
  out = {}
  for name in survey.MEASURES:
    t, i, u = trained[name], init[name], uniform[name][:, 0, 0]
    out[name] = {
        "trained": _summary(t, e), "init": _summary(i, e),
        "uniform": _summary(u, e),
        "layer_trained": _summary(t.mean(-1), e),
        "layer_init": _summary(i.mean(-1), e)}
  return out


def _top(heads, name: str, k: int) -> list[dict]:
  """The `k` heads with the largest mean `name` score."""
  t = heads[name]["trained"]
  order = np.argsort(t["mean"].ravel())[::-1][:k]
  nh = t["mean"].shape[1]
  return [{"layer": int(f // nh), "head": int(f % nh),
           "mean": float(t["mean"].ravel()[f]),
           "ci95": t["ci95"].reshape(-1, 2)[f].tolist(),
           "init": float(heads[name]["init"]["mean"].ravel()[f]),
           "uniform": float(heads[name]["uniform"]["mean"])}
          for f in order]


def layer_clustering(js, num_layers: int, *, permutations: int, seed: int
                     ) -> dict:
  """Within- and across-layer mean JS distance and a permutation test of
  "heads of one layer are closer": the share of random relabellings of
  heads to layers whose across-minus-within gap is at least the real one."""
  split = survey_lib.js_by_layer(js, num_layers)
  gap = split["across_layer"] - split["within_layer"]
  n = js.shape[0]
  labels = np.repeat(np.arange(num_layers), n // num_layers)
  off = ~np.eye(n, dtype=bool)
  rng = np.random.default_rng(seed)
  gaps = []
  for _ in range(permutations):
    p = rng.permutation(labels)
    same = p[:, None] == p[None, :]
    gaps.append(js[~same].mean() - js[same & off].mean())
  return {**split, "gap": gap, "p_value": float(
      (1 + np.sum(np.asarray(gaps) >= gap)) / (1 + permutations))}


def _js(model, init_model, ids, mask, types, classes, e) -> dict:
  """JS distances between heads, the MDS embedding, and the clustering."""
  n = min(e.js_pairs, ids.shape[0])
  out = {}
  for name, m in (("trained", model), ("init", init_model)):
    _, kept = survey.scores(m, ids[:n], mask[:n], types[:n], classes,
                            chunk=e.chunk, keep_patterns=n)
    js = survey.js_between_heads(kept)
    out[name] = layer_clustering(js, m.config.num_layers, permutations=1000,
                                 seed=e.seed)
    out[name]["distance"] = js
    out[name]["mds"] = survey.classical_mds(js)
  out["pairs"] = n
  return out


def _gradient(model, tok, ids, mask, types, classes, trained, e) -> dict:
  """Item 4: |d cos / d attention| on [SEP] vs other keys, per layer, beside
  the attention share on [SEP] of the same pairs."""
  n = min(e.gradient_pairs, ids.shape[0])
  ref = embedding.embed(model, *pretrained.encode(tok, [e.reference],
                                                  max_len=e.max_len))[0]
  g = embedding.sep_gradient(model, ids[:n], mask[:n], types[:n],
                             classes["sep"][0], ref)
  ratio = g["sep"].mean(-1) / np.maximum(g["other"].mean(-1), 1e-30)
  return {"pairs": n, "reference": e.reference,
          "sep": _summary(g["sep"].mean(-1), e),
          "other": _summary(g["other"].mean(-1), e),
          "sep_over_other": _summary(ratio, e),
          "sep_share": _summary(trained["sep"][:n].mean(-1), e)}


def _ranking_inputs(tok, pairs_, e):
  """Two halves of triples (rank, test): `(ids, mask, idx [N, 3])` each."""
  triples = corpus.ranking_triples(pairs_, 2 * e.triples, seed=e.seed)
  halves = []
  for half in (triples[:e.triples], triples[e.triples:]):
    sents = [s for t in half for s in (t["anchor"], t["positive"],
                                       t["negative"])]
    ids, mask = pretrained.encode(tok, sents, max_len=e.max_len)
    halves.append((ids, mask, np.arange(len(sents)).reshape(-1, 3)))
  return halves


def _ablation(model, half, e) -> dict:
  """Each head's zero- and mean-ablation effect on the rank half: the
  change in margin and accuracy per triple, with intervals."""
  ids, mask, idx = half
  c = model.config
  clean_margin, clean_acc = embedding.ranking(embedding.embed(model, ids,
                                                              mask), idx)
  fills = {"zero": None, "mean": embedding.mean_z(model, ids, mask)}
  out = {"clean": {"margin": _summary(clean_margin, e),
                   "accuracy": _summary(clean_acc, e)}}
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
    out[kind] = {"margin": _summary(dm, e), "accuracy": _summary(da, e)}
  return out


def _curve(model, half, order, removed):
  """Per-triple (margin, accuracy) `[K, N]` with `order[:k]` heads zeroed."""
  ids, mask, idx = half
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


def _pruning(model, half, ablation, e) -> dict:
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
      "margin_difference": _summary((m_rank - m_rand).T, e),
      "accuracy_difference": _summary(
          (a_rank - np.mean([r[1] for r in rand], 0)).T, e)}


def _explorer(model, init_model, tok, pairs_, workdir, e, info):
  """The explorer page of a few short pairs (real tokens as labels)."""
  # The shortest pairs: the page stores L * H * T^2 weights.
  chosen = sorted(pairs_, key=lambda p: len(p["a"]) + len(p["b"]))[
      :e.explorer_pairs]
  ids, _, _ = pretrained.encode_pairs(tok, [(p["a"], p["b"]) for p in chosen],
                                      max_len=e.max_len)
  explorer.write_explorer(
      model, {"inputs": ids}, pathlib.Path(workdir) / "explorer.html",
      init_model=init_model, labels={"inputs": pretrained.labels(tok, ids[0])},
      specials=False, raw_arrays=False,
      title=f"Attention explorer: {info['name']}",
      info=[("model", info["name"]), ("input", f"{len(chosen)} pairs "
                                      "[CLS] a [SEP] b [SEP]")])
  return [f"{p['a']} | {p['b']}" for p in chosen]


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Every number of the report (`reuse` has nothing to reuse: no
  training)."""
  del reuse
  t0 = time.monotonic()
  e = config.experiment
  docs = corpus.documents()
  pairs_ = corpus.pairs(docs)
  sents = [s for paras in docs.values() for para in paras for s in para]
  model, tok, info = models.load(config, sents)
  init_model = models.reinitialised(model, e.init_seed)
  classes = _classes(tok)
  rng = np.random.default_rng(e.seed)
  chosen = [pairs_[i] for i in np.sort(rng.permutation(len(pairs_))[:e.pairs])]
  ids, mask, types = pretrained.encode_pairs(
      tok, [(p["a"], p["b"]) for p in chosen], max_len=e.max_len)
  c = model.config
  stage_s = {}

  def timed(name, fn, *args):
    """fn(*args), its wall seconds recorded under `name`."""
    t = time.monotonic()
    out = fn(*args)
    stage_s[name] = time.monotonic() - t
    print(f"{name}: {stage_s[name]:.1f} s", flush=True)
    return out

  trained, _ = timed("survey", lambda m: survey.scores(
      m, ids, mask, types, classes, chunk=e.chunk), model)
  init, _ = timed("survey_init", lambda m: survey.scores(
      m, ids, mask, types, classes, chunk=e.chunk), init_model)
  uniform = survey.uniform_scores(ids, mask, classes, c.num_layers,
                                  c.num_heads)
  heads = _heads(trained, init, uniform, e)
  halves = _ranking_inputs(tok, pairs_, e)
  ablation = timed("ablation", _ablation, model, halves[0], e)
  init_margin, init_acc = embedding.ranking(
      embedding.embed(init_model, *halves[1][:2]), halves[1][2])
  results = {
      "model": info,
      "corpus": {"documents": len(docs), "sentences": len(sents),
                 "pairs": len(pairs_), "pairs_used": len(chosen),
                 "tokens_per_pair": _summary(mask.sum(1), e),
                 "truncated": int((mask.sum(1) >= e.max_len).sum())},
      "classes": classes,
      "heads": heads,
      "top": {k: _top(heads, k, e.top) for k in ("previous", "next", "self")},
      "js": timed("js", _js, model, init_model, ids, mask, types, classes, e),
      "gradient": timed("gradient", _gradient, model, tok, ids, mask, types,
                        classes, trained, e),
      "ablation": ablation,
      "pruning": timed("pruning", _pruning, model, halves[1], ablation, e),
      "ranking_floors": {"init_accuracy": _summary(init_acc, e),
                         "init_margin": _summary(init_margin, e),
                         "chance_accuracy": 0.5},
      "explorer_pairs": _explorer(model, init_model, tok, chosen, workdir,
                                  e, info),
      "stage_s": stage_s,
  }
  results["wall_s"] = time.monotonic() - t0
  return results
