"""Pretrained heads, the controls a skeptical reader asks for.

Shape letters: N inputs, P pairs with JS distances, L layers, H heads, R
bootstrap resamples, G documents.

- `single_sentences`: all-MiniLM-L6-v2 was trained on one sentence at a
  time (`[CLS] s [SEP]`, token type 0); the survey feeds it pairs with
  token type 1 on the second sentence, which it never saw. The same
  measures on single sentences say whether the [CLS] parking belongs to
  the model or to the unfamiliar input.
- `clustering_against_init`: "heads cluster by layer" holds for the
  re-initialised model too (both permutation p at their floor), so the
  permutation test alone does not separate training from architecture.
  Here each model's gap is put in units of its own permutation null (z)
  and as a share of its mean distance (scale-free, since the
  re-initialised heads are all close to uniform), and the trained minus
  re-initialised share gets an interval that resamples documents.
"""

from __future__ import annotations

import numpy as np

from experiments.pretrained_heads import survey
from mha_jax import pretrained
from mha_jax.measure import bootstrap


def single_sentences(model, init_model, tok, sentences, classes, e,
                     summary) -> dict:
  """[CLS] and [SEP] shares per layer (and per head, trained) on
  `[CLS] s [SEP]` inputs of token type 0, beside uniform attention and
  the re-initialised model; `summary(values [N, ...])` is the caller's
  interval over the inputs' documents."""
  ids, mask = pretrained.encode(tok, sentences, max_len=e.max_len)
  types = np.zeros_like(ids)
  c = model.config
  out = {"inputs": len(sentences), "tokens": summary(mask.sum(1))}
  for name, m in (("trained", model), ("init", init_model)):
    s, _ = survey.scores(m, ids, mask, types, classes, chunk=e.chunk)
    out[name] = {k: summary(s[k].mean(-1)) for k in ("cls", "sep")}
    if name == "trained":
      out["cls_heads"] = summary(s["cls"])
  u = survey.uniform_scores(ids, mask, classes, c.num_layers, c.num_heads)
  out["uniform"] = {k: summary(u[k][:, 0, 0]) for k in ("cls", "sep")}
  return out


def _shares(dists, weights, num_layers: int) -> np.ndarray:
  """(across - within) / mean off-diagonal distance of the weighted mean
  distance matrices: `dists [P, n, n]`, `weights [R, P]` -> `[R]`."""
  n = dists.shape[1]
  layer = np.repeat(np.arange(num_layers), n // num_layers)
  same = layer[:, None] == layer[None, :]
  off = ~np.eye(n, dtype=bool)
  mean = (weights @ dists.reshape(len(dists), -1)).reshape(-1, n, n)
  mean = mean / weights.sum(1)[:, None, None]
  within = mean[:, same & off].mean(1)
  across = mean[:, ~same].mean(1)
  return (across - within) / mean[:, off].mean(1)


def clustering_against_init(per_pair: dict, groups, num_layers: int, *,
                            resamples: int, seed: int) -> dict:
  """The layer gap as a share of the mean distance, per model, and the
  trained minus re-initialised difference with a 95% percentile interval
  over documents (`groups [P]`, each drawn document bringing all its
  pairs). `per_pair[name] = (dists [P, n, n], rows [P])`, both models on
  the same pairs."""
  (dt, rows), (di, rows_i) = per_pair["trained"], per_pair["init"]
  if not np.array_equal(rows, rows_i):
    raise ValueError("clustering_against_init: the two models' pairs "
                     f"differ in real rows: {rows.tolist()} vs "
                     f"{rows_i.tolist()}")
  drawn, k = bootstrap.group_weights(groups, resamples=resamples,
                                     seed=seed)
  weights = drawn * rows[None, :]  # [R, P]
  point = rows[None, :].astype(np.float64)
  share_t, share_i = (_shares(d, point, num_layers)[0] for d in (dt, di))
  diff = (_shares(dt, weights, num_layers)
          - _shares(di, weights, num_layers))
  return {"share_trained": float(share_t), "share_init": float(share_i),
          "difference": float(share_t - share_i),
          "ci95": np.quantile(diff, [0.025, 0.975]).tolist(),
          "documents": int(k), "pairs": int(len(rows))}
