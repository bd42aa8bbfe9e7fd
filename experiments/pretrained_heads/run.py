"""Pretrained heads, measuring: every head of an encoder on real sentence
pairs, beside its floors, and what removing heads does to the embedding.

`measure` returns the results dict that report.py lays out: the survey
(survey.py), the single-sentence and clustering controls (controls.py) and
the ranking ablation and pruning (ablation.py), every interval over the
source documents (intervals.py). Shape letters: N pairs, L layers, H
heads.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from experiments import stdlib_prose
from experiments.pretrained_heads import ablation as ablation_lib
from experiments.pretrained_heads import controls
from experiments.pretrained_heads import corpus
from experiments.pretrained_heads import embedding
from experiments.pretrained_heads import intervals
from experiments.pretrained_heads import models
from experiments.pretrained_heads import survey
from mha_jax import pretrained
from mha_jax.interp import explorer
from mha_jax.interp import survey as survey_lib


def _classes(tok) -> dict:
  """The token classes as ids: [CLS], [SEP] and punctuation ("." ",")."""
  ids = {"cls": ["[CLS]"], "sep": ["[SEP]"], "punct": [".", ","]}
  out = {k: [tok.token_to_id(t) for t in v] for k, v in ids.items()}
  missing = [t for k, v in ids.items() for t, i in zip(v, out[k])
             if i is None]
  if missing:
    raise ValueError(f"the tokenizer has no token for {missing}")
  return out


def _heads(trained, init, uniform, e, groups) -> dict:
  """measure -> per head (trained, init: mean/std/ci95 `[L, H]`) and per
  layer (the layer's mean over heads `[L]`), uniform as one number."""
  out = {}
  for name in survey.MEASURES:
    t, i, u = trained[name], init[name], uniform[name][:, 0, 0]
    s = lambda x: intervals.summary(x, e, groups)
    out[name] = {
        "trained": s(t), "init": s(i), "uniform": s(u),
        "layer_trained": s(t.mean(-1)), "layer_init": s(i.mean(-1))}
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
  gaps = np.asarray(gaps)
  # p sits at its floor 1 / (1 + permutations) for any strong gap; z (the
  # gap in the null's standard deviations) still ranks two models. None
  # where every relabelling gives the same gap.
  std = float(gaps.std(ddof=1))
  return {**split, "gap": gap, "p_value": float(
      (1 + np.sum(gaps >= gap)) / (1 + permutations)),
      "null_mean": float(gaps.mean()), "null_std": std,
      "z": None if std == 0 else float((gap - gaps.mean()) / std)}


def _js(model, init_model, ids, mask, types, classes, e, groups) -> dict:
  """JS distances between heads, the MDS embedding, the clustering, and
  the clustering against the re-initialised model's over documents."""
  n = min(e.js_pairs, ids.shape[0])
  out, per_pair = {}, {}
  for name, m in (("trained", model), ("init", init_model)):
    _, kept = survey.scores(m, ids[:n], mask[:n], types[:n], classes,
                            chunk=e.chunk, keep_patterns=n)
    dists, rows, which = survey.js_per_pair(kept)
    per_pair[name] = (dists, rows)
    js = np.tensordot(rows, dists, 1) / rows.sum()
    out[name] = layer_clustering(js, m.config.num_layers, permutations=1000,
                                 seed=e.seed)
    out[name]["distance"] = js
    out[name]["mds"] = survey.classical_mds(js)
  out["against_init"] = controls.clustering_against_init(
      per_pair, np.asarray(groups)[which], model.config.num_layers,
      resamples=e.resamples, seed=e.seed)
  out["pairs"] = n
  return out


def _gradient(model, tok, ids, mask, types, classes, trained, e, groups
              ) -> dict:
  """Clark et al.'s no-op test: |d cos / d attention| on [SEP] keys and on
  [CLS] keys against other keys, per layer, beside the attention share on
  that token of the same pairs ("other" and "cls_other": each test's
  other keys)."""
  n = min(e.gradient_pairs, ids.shape[0])
  s = lambda x: intervals.summary(x, e, groups[:n])
  ref = embedding.embed(model, *pretrained.encode(tok, [e.reference],
                                                  max_len=e.max_len))[0]
  out = {"pairs": n, "reference": e.reference}
  for name, other in (("sep", "other"), ("cls", "cls_other")):
    g = embedding.class_gradient(model, ids[:n], mask[:n], types[:n],
                                 classes[name][0], ref)
    ratio = g["class"].mean(-1) / np.maximum(g["other"].mean(-1), 1e-30)
    out.update({name: s(g["class"].mean(-1)), other: s(g["other"].mean(-1)),
                f"{name}_over_other": s(ratio),
                f"{name}_share": s(trained[name][:n].mean(-1))})
  return out


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
  docs = stdlib_prose.documents()
  pairs_ = corpus.pairs(docs)
  sents = [s for paras in docs.values() for para in paras for s in para]
  model, tok, info = models.load(config, sents)
  init_model = models.reinitialised(model, e.init_seed)
  classes = _classes(tok)
  rng = np.random.default_rng(e.seed)
  chosen = [pairs_[i] for i in np.sort(rng.permutation(len(pairs_))[:e.pairs])]
  ids, mask, types = pretrained.encode_pairs(
      tok, [(p["a"], p["b"]) for p in chosen], max_len=e.max_len)
  # Each pair's document: every interval over pairs resamples documents.
  doc_index = {name: i for i, name in enumerate(docs)}
  groups = np.asarray([doc_index[p["doc"]] for p in chosen])
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
  heads = _heads(trained, init, uniform, e, groups)
  halves = ablation_lib.ranking_inputs(tok, pairs_, e, doc_index)
  ablation = timed("ablation", ablation_lib.ablation, model, halves[0], e)
  init_margin, init_acc = embedding.ranking(
      embedding.embed(init_model, *halves[1][:2]), halves[1][2])
  single = timed("single", controls.single_sentences, model, init_model, tok,
                 [p["a"] for p in chosen], classes, e,
                 lambda x: intervals.summary(x, e, groups))
  results = {
      "model": info,
      "corpus": {"documents": len(docs), "sentences": len(sents),
                 "pairs": len(pairs_), "pairs_used": len(chosen),
                 "documents_used": len(set(groups.tolist())),
                 "tokens_per_pair": intervals.summary(mask.sum(1), e, groups),
                 "truncated": int((mask.sum(1) >= e.max_len).sum())},
      "classes": classes,
      "heads": heads,
      "top": {k: _top(heads, k, e.top) for k in ("previous", "next", "self")},
      "js": timed("js", _js, model, init_model, ids, mask, types, classes, e,
                  groups),
      "gradient": timed("gradient", _gradient, model, tok, ids, mask, types,
                        classes, trained, e, groups),
      "single_sentences": single,
      "ablation": ablation,
      "pruning": timed("pruning", ablation_lib.pruning, model, halves[1],
                       ablation, e),
      "ranking_floors": {"init_accuracy": intervals.summary(
                             init_acc, e, halves[1][3]),
                         "init_margin": intervals.summary(
                             init_margin, e, halves[1][3]),
                         "chance_accuracy": 0.5},
      "explorer_pairs": _explorer(model, init_model, tok, chosen, workdir,
                                  e, info),
      "stage_s": stage_s,
  }
  results["wall_s"] = time.monotonic() - t0
  return results
