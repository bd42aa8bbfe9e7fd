"""Boolean attention masks: True means "this query may attend to this key".

Shape letters: B batch, H query heads, Tq query length, Tk key/value length.

Masks are boolean everywhere in mha_jax. The core turns them into an additive
-inf before the softmax (the source's rule: masking after the softmax would leave
probability on forbidden keys). A float "additive mask" belongs in `bias=`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def causal_mask(q_len: int, kv_len: int | None = None) -> jax.Array:
  """Causal mask `[q_len, kv_len]`, aligned bottom-right.

  Query i sits at absolute position `kv_len - q_len + i`, so when the keys run
  ahead of the queries (decoding with a cache) the last query sees every key.
  Key j is visible to query i iff `j <= kv_len - q_len + i`.
  """
  kv_len = q_len if kv_len is None else kv_len
  if q_len < 0 or kv_len < 0:
    raise ValueError(f"causal_mask: lengths must be >= 0, got q_len={q_len}, "
                     f"kv_len={kv_len}")
  q_pos = jnp.arange(q_len)[:, None] + (kv_len - q_len)  # [Tq, 1]
  k_pos = jnp.arange(kv_len)[None, :]  # [1, Tk]
  return k_pos <= q_pos


def padding_mask(lengths: jax.Array, length: int) -> jax.Array:
  """Key-padding mask `[B, 1, 1, length]`: key j is valid where j < lengths[b]."""
  lengths = jnp.asarray(lengths)
  if lengths.ndim != 1:
    raise ValueError(f"padding_mask: `lengths` must have shape [B], got shape "
                     f"{lengths.shape}")
  if not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise TypeError(f"padding_mask: `lengths` must be integer, got "
                    f"{lengths.dtype}")
  valid = jnp.arange(length)[None, :] < lengths[:, None]  # [B, Tk]
  return valid[:, None, None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of boolean masks, skipping None; None if all are None."""
  present = [m for m in masks if m is not None]
  if not present:
    return None
  for i, m in enumerate(present):
    if jnp.asarray(m).dtype != jnp.bool_:
      raise TypeError(f"combine_masks: mask {i} must be boolean, got "
                      f"{jnp.asarray(m).dtype}")
  # Left-pad ranks explicitly (padding [B,1,1,Tk] with causal [Tq,Tk] is the
  # common case) so that this works under jax_numpy_rank_promotion="raise".
  rank = max(jnp.ndim(m) for m in present)
  present = [jnp.reshape(m, (1,) * (rank - jnp.ndim(m)) + jnp.shape(m))
             for m in present]
  out = present[0]
  for m in present[1:]:
    out = jnp.logical_and(out, m)
  return out
