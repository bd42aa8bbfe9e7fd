"""Which head, and which source token, a feature reads or writes.

Shape letters: B batch, T query positions, S source (key) positions, H
query heads, K kv heads, Dv per-head value width, D = H * Dv, F features,
F' chosen features, N examples.

* Decoder share by head: feature f writes `w_dec[f]`, whose block h
  (columns h * Dv .. (h + 1) * Dv) is what it writes into head h's part
  of z. Rows have unit norm, so the squared block norms are shares that
  sum to 1 (Kissane et al. 2024 attribute features to heads by these
  decoder blocks). Read per head, the same shares rank the features a
  head writes most (`head_top_features`).
* Direct feature attribution (DFA): an attention head's output is a
  weighted sum of values, `z_{h,t} = sum_s pattern_{h,t,s} v_{h,s}`, and
  the encoder is linear before its ReLU, so a feature's pre-activation
  splits exactly over heads and source positions:

    pre_f(t) = sum_{h,s} scale * pattern_{h,t,s} (v_{h,s} . w_enc[h, f])
               + (b_enc_f - b_dec . w_enc[:, f]),

  the last term a constant that depends on no token. With grouped-query
  attention v_{h,s} is the value of kv head h // (H // K).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mha_jax.core import precision
from mha_jax import hooks


def head_shares(w_dec, num_heads: int):
  """`[F, D] -> [F, H]`: each feature's squared decoder norm per head
  block, over its total (rows sum to 1)."""
  f, d = w_dec.shape
  if d % num_heads:
    raise ValueError(f"head_shares: `num_heads`={num_heads} must divide the "
                     f"decoder's width {d}")
  sq = jnp.sum(w_dec.reshape(f, num_heads, -1) ** 2, -1)
  return sq / jnp.sum(sq, -1, keepdims=True)


def head_top_features(shares, *, live=None, k: int = 5
                      ) -> list[list[tuple[int, float]]]:
  """`shares [F, H]` (`head_shares`') -> for each head h (H lists), the
  `k` features among `live` whose decoder writes most into head h's
  block: `[(feature, share)]`, largest share first, ties in `live`'s
  order.

  `live`: feature indices `[F']` (None: all F). A dead feature's decoder
  row is whatever training left it, so a dead feature can top a head
  without ever being written: pass the live ones.
  """
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ValueError(f"head_top_features: `k` must be a positive integer, "
                     f"got {k!r}")
  shares = np.asarray(shares)
  feats = (np.arange(shares.shape[0]) if live is None
           else np.asarray(live, np.int64).reshape(-1))  # [F']
  sub = shares[feats]  # [F', H]
  # Stable on the negated shares: largest first, ties in `feats`' order.
  order = np.argsort(-sub, axis=0, kind="stable")[:k]  # [k', H]
  return [[(int(feats[i]), float(sub[i, h])) for i in order[:, h]]
          for h in range(shares.shape[1])]


def _enc_blocks(params, num_heads: int, features=None):
  """`w_enc` as `[H, Dv, F']`."""
  w = params["w_enc"] if features is None else params["w_enc"][:, features]
  return w.reshape(num_heads, -1, w.shape[-1])


def dfa_bias(params, features=None):
  """`[F']`: the part of the pre-activation that no token contributes."""
  w = params["w_enc"] if features is None else params["w_enc"][:, features]
  b = params["b_enc"] if features is None else params["b_enc"][features]
  return b - precision.matmul(params["b_dec"], w)


def dfa_by_head(params, z, *, scale: float = 1.0):
  """`z [B, T, H, Dv] -> [B, T, H, F]`: each head's share of every
  feature's pre-activation (summed over source positions, it is
  `scale * z_h . w_enc[h]`)."""
  w = _enc_blocks(params, z.shape[2])
  return scale * precision.einsum("bthd,hdf->bthf", z, w)


def dfa_by_source(params, pattern, v, *, features, scale: float = 1.0):
  """`pattern [B, H, T, S]`, `v [B, S, K, Dv]` -> `[B, T, F', H, S]`:
  the contribution of each head and source position to the chosen
  features' pre-activations; with `dfa_bias` it sums to them exactly."""
  num_heads = pattern.shape[1]
  v = hooks.expand_kv(v, num_heads)  # [B, S, H, Dv]
  w = _enc_blocks(params, num_heads, jnp.asarray(features))  # [H, Dv, F']
  vw = precision.einsum("bshd,hdf->bshf", v, w)  # [B, S, H, F']
  return scale * precision.einsum("bhts,bshf->btfhs", pattern, vw)


def dfa_at_source(params, pattern, v, source, *, scale: float = 1.0):
  """The contribution of ONE source per query, `source [T]` (an index, or
  -1 for none), for every feature: `[B, T, H, F]` (0 where source < 0).
  What the induction test reads, without forming `[.., F, H, S]`."""
  num_heads = pattern.shape[1]
  source = jnp.asarray(source)
  src = jnp.maximum(source, 0)
  v = hooks.expand_kv(v, num_heads)[:, src]  # [B, T, H, Dv]
  p = jnp.take_along_axis(pattern, src[None, None, :, None], -1)[..., 0]
  w = _enc_blocks(params, num_heads)
  out = scale * precision.einsum("bht,bthd,hdf->bthf", p, v, w)
  return jnp.where((source >= 0)[None, :, None, None], out, 0.0)


def top_contexts(acts, n: int):
  """`acts [B, T]` of one feature -> the `n` largest as a list of
  `(row, position, value)`, largest first (positive values only)."""
  a = np.asarray(acts)
  flat = np.argsort(-a, axis=None, kind="stable")[:n]
  return [(int(i // a.shape[1]), int(i % a.shape[1]), float(a.flat[i]))
          for i in flat if a.flat[i] > 0]
