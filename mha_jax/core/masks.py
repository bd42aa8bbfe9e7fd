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


# ----------------------------------------------------------------------------
# The built-in masks as `mask_mod` rules (`score_rules.ScoreRules.mask_mod`):
# functions (b, h, q_idx, kv_idx) -> bool, with q_idx the query's position
# (Tk - Tq + i by default) and kv_idx the key's. They are the built-ins'
# one definition: `score_rules.allowed` applies `is_causal`, `local_window`
# and segment ids by calling these same functions on broadcast position
# grids (`grid`), which they accept because they are plain jnp
# comparisons; a user's rule gets them mapped over scalars. The built-in
# arguments stay the convenient names and the faster route in the
# blockwise kernel: it derives their block ranges from positions, without
# the O(Tq Tk) block mask a rule needs for that (docs/score_rules.md).


def grid(q_pos, k_pos):
  """`q_pos [..., Tq]`, `k_pos [Tk]` -> `[..., Tq, 1]`, `[1.., 1, Tk]` of
  equal rank (explicit: the project runs with rank promotion off), the
  q_idx and kv_idx of every (query, key) pair by broadcasting."""
  qp = q_pos[..., :, None]
  return qp, jnp.reshape(k_pos, (1,) * (qp.ndim - 1) + (-1,))


def causal(b, h, q_idx, kv_idx):
  """`is_causal`: key j visible from position p iff j <= p."""
  return kv_idx <= q_idx


def causal_mod():
  """`is_causal` as a rule: `causal` itself, one function object, so
  every call compiles to the same program (rules are compared by
  identity)."""
  return causal


def window_mod(left: int, right: int = 0):
  """`local_window=(left, right)`: keys p - left .. p + right."""
  return lambda b, h, q_idx, kv_idx: (kv_idx >= q_idx - left) & (
      kv_idx <= q_idx + right)


def same_segment(q_seg, k_seg):
  """The segment rule on ids already gathered (any broadcasting shapes):
  a query sees a key of its own segment. Segment ids arrive per query and
  per key (`allowed` compares them as they come); `documents_mod` reads
  them by position from one array."""
  return q_seg == k_seg


def documents_mod(ids):
  """Segment ids as a rule: `ids [B, Tk]` int, the document of each
  position; a query sees only keys of its own document. Indexed by
  position on both sides (self-attention, or decoding with the ids of
  every cached position)."""
  ids = jnp.asarray(ids)
  return lambda b, h, q_idx, kv_idx: same_segment(ids[b, q_idx],
                                                  ids[b, kv_idx])


def prefix_lm_mod(prefix: int):
  """Prefix-LM: the first `prefix` positions are seen by every query
  (bidirectional prefix), the rest causally. A rule only, with no
  built-in argument: a block mask built from it skips the blocks past the
  diagonal as the causal ranges would (docs/score_rules.md)."""
  return lambda b, h, q_idx, kv_idx: causal(b, h, q_idx, kv_idx) | (
      kv_idx < prefix)


def and_mods(*mods):
  """A rule allowing a key where every one of `mods` does."""
  def both(b, h, q_idx, kv_idx):
    ok = mods[0](b, h, q_idx, kv_idx)
    for mod in mods[1:]:
      ok = ok & mod(b, h, q_idx, kv_idx)
    return ok
  return both
