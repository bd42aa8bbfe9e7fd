"""What each head of an encoder looks at, one score per sentence pair.

Shape letters: N pairs, B pairs of one chunk, L layers, H heads, T tokens
(padded to a multiple of `PAD_TO`), C chunks.

`scores` runs the model over tokenised pairs in chunks of similar length,
captures every layer's pattern and turns it into Clark et al.'s per-head
measures with `head_metrics`: the share of attention on [CLS], on [SEP],
on punctuation ("." and ","), on the previous and the next token and on the
token itself, and the row entropy, each `[N, L, H]` (a pair's mean over its
real query tokens). `uniform_scores` gives the same measures of uniform
attention over each pair's real tokens. `js_between_heads` is the mean
Jensen-Shannon distance between every two of the L * H heads.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.interp import head_metrics

PAD_TO = 16  # lengths rounded up to this, so a few shapes compile
MEASURES = ("cls", "sep", "punct", "previous", "next", "self", "entropy")


def chunks(mask, size: int):
  """Index arrays of at most `size` pairs of similar length (sorted by
  length, so little of a chunk is padding)."""
  order = np.argsort(mask.sum(1), kind="stable")
  return [order[i:i + size] for i in range(0, len(order), size)]


def padded(ids, mask, types, idx):
  """The pairs `idx` cut to their longest, rounded up to `PAD_TO`."""
  t = int(mask[idx].sum(1).max())
  t = min(-(-t // PAD_TO) * PAD_TO, ids.shape[1]) if t < ids.shape[1] else t
  pad = max(0, t - ids.shape[1])
  cut = lambda x: np.pad(x[idx, :t], ((0, 0), (0, pad)))
  return cut(ids), cut(mask), cut(types)


def _measures(w, tokens, mask, classes):
  """name -> `[B, H]` for weights `w [B, H, T, T]` of one layer."""
  share = lambda ids: head_metrics.class_share(
      w, head_metrics.in_class(tokens, ids), mask)
  off = lambda d: head_metrics.offset_share(w, d, mask, keys=mask)
  return {"cls": share(classes["cls"]), "sep": share(classes["sep"]),
          "punct": share(classes["punct"]), "previous": off(1),
          "next": off(-1), "self": off(0),
          "entropy": head_metrics.entropy_per_example(w, mask)}


@functools.partial(jax.jit, static_argnames=("num_layers",))
def _chunk_scores(graphdef, state, ids, mask, types, classes, num_layers):
  """`[len(MEASURES), B, L, H]` of one chunk, and its patterns with padded
  query rows zeroed `[L, B, H, T, T]`."""
  model = nnx.merge(graphdef, state)
  sites = tuple(f"blocks.{l}.attn.pattern" for l in range(num_layers))
  _, acts = model(ids, mask=mask, token_types=types, capture=sites)
  w = jnp.stack([acts[s] for s in sites])  # [L, B, H, T, T]
  # A padded query still attends; zero its row so no metric counts it.
  w = w * mask[None, :, None, :, None]
  per = [_measures(wl, ids, mask, classes) for wl in w]
  out = jnp.stack([jnp.stack([p[n] for p in per], 1) for n in MEASURES])
  return out, w


def scores(model, ids, mask, types, classes, *, chunk: int = 32,
           keep_patterns: int = 0):
  """name -> `[N, L, H]` for every measure, and the first `keep_patterns`
  chunks' (patterns `[L, B, H, T, T]`, their pairs' indices)."""
  graphdef, state = nnx.split(model)
  n_layers = model.config.num_layers
  cls = {k: jnp.asarray(v, jnp.int32) for k, v in classes.items()}
  out = np.zeros((len(MEASURES), ids.shape[0], n_layers,
                  model.config.num_heads), np.float32)
  kept = []
  for c, idx in enumerate(chunks(mask, chunk)):
    i, m, t = padded(ids, mask, types, idx)
    s, w = _chunk_scores(graphdef, state, i, m, t, cls, n_layers)
    out[:, idx] = np.asarray(s)
    if c < keep_patterns:
      kept.append((np.asarray(w), idx))
  return dict(zip(MEASURES, out)), kept


def uniform_scores(ids, mask, classes, num_layers: int, num_heads: int):
  """The measures of uniform attention over each pair's real tokens, in
  the same `[N, L, H]` layout (every head alike)."""
  visible = jnp.broadcast_to(mask[:, None, :], mask.shape + mask.shape[-1:])
  w = head_metrics.uniform_weights(visible)  # [N, 1, T, T]
  w = w * jnp.asarray(mask)[:, None, :, None]
  cls = {k: jnp.asarray(v, jnp.int32) for k, v in classes.items()}
  m = _measures(w, jnp.asarray(ids), jnp.asarray(mask), cls)
  return {k: np.broadcast_to(np.asarray(v)[:, None, :],
                             (ids.shape[0], num_layers, num_heads))
          for k, v in m.items()}


_js = jax.jit(head_metrics.js_distance)


def js_per_pair(kept) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Each kept pair's mean JS distance between heads `[P, L*H, L*H]`
  (layer-major, over its real rows), its count of real rows `[P]` and its
  index among the surveyed pairs `[P]`: per pair, so that intervals can
  resample the pairs' documents. One pair per call: the pairwise terms are
  `[L*H, L*H, T, T]`, 0.7 GB at 72 heads and 128 tokens."""
  dists, rows, which = [], [], []
  for w, idx in kept:
    l, b, h, t, _ = w.shape
    heads = np.transpose(w, (1, 0, 2, 3, 4)).reshape(b, l * h, t, t)
    for i in range(b):
      dists.append(np.asarray(_js(heads[i:i + 1])))
      rows.append(int((heads[i, 0].sum(-1) > 0).sum()))  # real rows
      which.append(int(idx[i]))
  return np.stack(dists), np.asarray(rows), np.asarray(which)


def js_between_heads(kept) -> np.ndarray:
  """`[L*H, L*H]` mean JS distance between heads over the real rows of
  the kept chunks' pairs (`js_per_pair` weighted by rows)."""
  dists, rows, _ = js_per_pair(kept)
  return np.tensordot(rows, dists, 1) / max(rows.sum(), 1)


def classical_mds(d: np.ndarray, dims: int = 2) -> np.ndarray:
  """Points `[n, dims]` whose distances approximate `d [n, n]` (Torgerson's
  classical scaling: the top eigenvectors of the double-centred -d^2/2)."""
  n = d.shape[0]
  j = np.eye(n) - 1.0 / n
  b = -0.5 * j @ (d ** 2) @ j
  vals, vecs = np.linalg.eigh(b)
  top = np.argsort(vals)[::-1][:dims]
  return vecs[:, top] * np.sqrt(np.maximum(vals[top], 0.0))
