"""Clean and corrupted inputs of the induction task, for patching.

Shape letters: B batch, T length (`task.seq_len`).

A clean example of `tasks.induction_batch` holds one segment of random
symbols twice: at `first` and again at `second`. Its corrupted twin is the
same sequence with every token of the FIRST copy replaced by another
symbol (uniform over the other V - 4 symbols). Both are sequences of
uniform random symbols with the same layout, so the corrupted input keeps
the clean one's token and position statistics; it only lacks the earlier
occurrence that an induction head looks up. The second copy, and so every
target the loss counts, is the same in both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.training import tasks

# A separate stream for the corrupting draws: the clean half is
# `tasks.induction_batch(key, cfg)` itself.
_CORRUPT_STREAM = 7


def _layouts(key, cfg):
  """Each example's `(segment, first, second)` `[B]` as
  `tasks.induction_batch` draws them from `key` (same keys, same calls)."""
  total = cfg.seq_len + 1

  def one(k):
    _, k_len, k_s1, k_s2 = jax.random.split(k, 4)
    seg = jax.random.randint(k_len, (), cfg.min_segment, cfg.max_segment + 1)
    s1 = jax.random.randint(k_s1, (), 0, total - 2 * seg + 1)
    s2 = jax.random.randint(k_s2, (), s1 + seg, total - seg + 1)
    return seg, s1, s2

  return jax.vmap(one)(jax.random.split(key, cfg.batch_size))


def _fixed_batch(key, cfg, segment, first, second):
  """The task's batch format with one layout for every example."""
  b, total = cfg.batch_size, cfg.seq_len + 1
  if not (2 <= segment and 0 <= first and first + segment <= second
          and second + segment <= total):
    raise ValueError(f"induction_pairs: `layout`=(segment={segment}, first="
                     f"{first}, second={second}) must have segment >= 2 and "
                     f"0 <= first, first + segment <= second, second + "
                     f"segment <= seq_len + 1 = {total}")
  seq = jax.random.randint(key, (b, total), tasks.NUM_SPECIAL,
                           cfg.vocab_size)
  seq = seq.at[:, second:second + segment].set(seq[:, first:first + segment])
  target_pos = jnp.arange(1, total)
  mask = (target_pos > second) & (target_pos < second + segment)
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:],
          "loss_mask": jnp.broadcast_to(mask, (b, total - 1)).astype(
              jnp.float32)}


def induction_pairs(key, cfg, *, layout=None) -> dict:
  """Clean induction sequences and their corrupted twins.

  Args:
    key: PRNG key.
    cfg: the task config (`batch_size`, `seq_len`, `vocab_size`,
      `min_segment`, `max_segment`).
    layout: None: every example has its own random layout, and the clean
      half is exactly `tasks.induction_batch(key, cfg)`; or `(segment,
      first, second)` ints shared by every example (to line positions up
      across examples).

  Returns:
    The clean batch (`inputs`, `targets`, `loss_mask`, all `[B, T]`),
    plus `corrupted [B, T]` (the inputs with the first copy resampled)
    and `segment`, `first`, `second` `[B]`.
  """
  b = cfg.batch_size
  if layout is None:
    batch = tasks.induction_batch(key, cfg)
    seg, s1, s2 = _layouts(key, cfg)
  else:
    batch = _fixed_batch(key, cfg, *layout)
    seg, s1, s2 = (jnp.full((b,), v, jnp.int32) for v in layout)
  x = batch["inputs"]
  pos = jnp.arange(x.shape[1])[None, :]  # [1, T]
  in_first = (pos >= s1[:, None]) & (pos < (s1 + seg)[:, None])  # [B, T]
  # Add 1..n-1 modulo the n symbols: a different symbol, uniform over the
  # others, so no token of the first copy survives by chance.
  n = cfg.vocab_size - tasks.NUM_SPECIAL
  shift = jax.random.randint(jax.random.fold_in(key, _CORRUPT_STREAM),
                             x.shape, 1, n)
  other = (x - tasks.NUM_SPECIAL + shift) % n + tasks.NUM_SPECIAL
  return dict(batch, corrupted=jnp.where(in_first, other, x), segment=seg,
              first=s1, second=s2)
