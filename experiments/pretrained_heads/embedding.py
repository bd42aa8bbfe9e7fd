"""The sentence embedding the model was trained for, its gradients and the
ranking task the heads are ablated on.

Shape letters: N sentences (or pairs), B one chunk of them, L layers, H
heads, T tokens, Dv head width.

all-MiniLM-L6-v2 was trained (contrastively, on sentence pairs) so that the
mean of the last hidden states over a sentence's real tokens, normalised,
puts related sentences close. `embed` computes that embedding with every
head's output `z` gated: `z <- g z + (1 - g) fill`, so g = 0 with fill 0
is zero ablation and with fill = the head's mean output is mean ablation,
in one compiled program. `class_gradient` is Clark et al.'s no-op test
(their Fig. 3): the gradient of the embedding's cosine with a fixed
reference sentence with respect to every attention weight.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.pretrained_heads import survey


def _pooled(hidden, mask):
  """Mean over real tokens, normalised: `[B, T, D]` -> `[B, D]`."""
  m = mask[..., None].astype(hidden.dtype)
  e = jnp.sum(hidden * m, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)
  return e / jnp.linalg.norm(e, axis=-1, keepdims=True)


def _gate_patches(gates, fill, num_layers):
  """Patches of every layer's `z`: `g z + (1 - g) fill` per head."""
  def patch(l):
    g = gates[l][None, None, :, None]  # [1, 1, H, 1]
    return lambda z: g * z + (1.0 - g) * fill[l][None, None]
  return {f"blocks.{l}.attn.z": patch(l) for l in range(num_layers)}


@functools.partial(jax.jit, static_argnames=("num_layers",))
def _embed_chunk(graphdef, state, ids, mask, gates, fill, num_layers):
  model = nnx.merge(graphdef, state)
  hidden = model(ids, mask=mask, patch=_gate_patches(gates, fill, num_layers))
  return _pooled(hidden, mask)


def embed(model, ids, mask, *, gates=None, fill=None, chunk: int = 64):
  """`[N, D]` pooled, normalised embeddings of single sentences `ids [N,
  T]`; `gates [L, H]` (default 1) and `fill [L, H, Dv]` (default 0)."""
  c = model.config
  dv = c.d_model // c.num_heads
  gates = jnp.ones((c.num_layers, c.num_heads)) if gates is None else gates
  fill = jnp.zeros((c.num_layers, c.num_heads, dv)) if fill is None else fill
  graphdef, state = nnx.split(model)
  out = np.zeros((ids.shape[0], c.d_model), np.float32)
  zeros = np.zeros_like(ids)
  for idx in survey.chunks(mask, chunk):
    i, m, _ = survey.padded(ids, mask, zeros, idx)
    out[idx] = np.asarray(_embed_chunk(graphdef, state, i, m,
                                       jnp.asarray(gates), jnp.asarray(fill),
                                       c.num_layers))
  return out


@functools.partial(jax.jit, static_argnames=("num_layers",))
def _z_sums(graphdef, state, ids, mask, num_layers):
  model = nnx.merge(graphdef, state)
  sites = tuple(f"blocks.{l}.attn.z" for l in range(num_layers))
  _, acts = model(ids, mask=mask, capture=sites)
  m = mask[:, :, None, None].astype(jnp.float32)
  return jnp.stack([jnp.sum(acts[s] * m, (0, 1)) for s in sites])


def mean_z(model, ids, mask, *, chunk: int = 64):
  """`[L, H, Dv]`: each head's output averaged over every real token of
  the sentences (the fill of mean ablation; padded sentences of different
  lengths have no common positions to average per position)."""
  c = model.config
  graphdef, state = nnx.split(model)
  total = 0.0
  zeros = np.zeros_like(ids)
  for idx in survey.chunks(mask, chunk):
    i, m, _ = survey.padded(ids, mask, zeros, idx)
    total = total + np.asarray(_z_sums(graphdef, state, i, m, c.num_layers))
  return total / mask.sum()


def ranking(emb, triples_idx):
  """Per triple: margin cos(anchor, positive) - cos(anchor, negative) and
  whether it is positive (the ranking is right); `triples_idx [N, 3]`
  indexes `emb`."""
  a, p, n = (emb[triples_idx[:, k]] for k in range(3))
  margin = np.sum(a * p, -1) - np.sum(a * n, -1)
  return margin, (margin > 0).astype(np.float64)


@functools.partial(jax.jit, static_argnames=("num_layers",))
def _cos_gradient(graphdef, state, ids, mask, types, ref, num_layers):
  """d cos(embedding, ref) / d pattern, `[L, B, H, T, T]`."""
  b, t = ids.shape
  model = nnx.merge(graphdef, state)
  h = model.config.num_heads

  def cos(delta):
    patch = {f"blocks.{l}.attn.pattern": (lambda d: lambda p: p + d)(delta[l])
             for l in range(num_layers)}
    hidden = model(ids, mask=mask, token_types=types, patch=patch)
    return jnp.sum(_pooled(hidden, mask) @ ref)

  return jax.grad(cos)(jnp.zeros((num_layers, b, h, t, t)))


def class_gradient(model, ids, mask, types, key_id: int, ref, *,
                   chunk: int = 16):
  """Mean |gradient| per attention weight, split by the weight's key:
  `{"class": [N, L, H], "other": [N, L, H]}`, keys equal to `key_id`
  ([SEP], [CLS]) against every other real key, over each input's real
  query rows (the gradient of cos(pooled embedding, `ref [D]`))."""
  c = model.config
  graphdef, state = nnx.split(model)
  out = {k: np.zeros((ids.shape[0], c.num_layers, c.num_heads), np.float32)
         for k in ("class", "other")}
  for idx in survey.chunks(mask, chunk):
    i, m, t = survey.padded(ids, mask, types, idx)
    g = np.abs(np.asarray(_cos_gradient(graphdef, state, i, m, t,
                                        jnp.asarray(ref), c.num_layers)))
    real = m[:, :, None] & m[:, None, :]  # [B, T, T] query and key real
    hit = real & (i == key_id)[:, None, :]
    for name, where in (("class", hit), ("other", real & ~hit)):
      w = where[None, :, None]  # [1, B, 1, T, T]
      out[name][idx] = np.transpose(
          (g * w).sum((-1, -2)) / np.maximum(w.sum((-1, -2)), 1), (1, 0, 2))
  return out
