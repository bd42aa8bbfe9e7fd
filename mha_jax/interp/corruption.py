"""Clean and corrupted inputs of the induction task, for patching.

Shape letters: B batch, T length (`task.seq_len`), N symbols.

A clean example of `tasks.induction_batch` holds one segment of random
symbols twice: at `first` and again at `second`. Prediction j of the
second copy (input position second + j, j = 0 .. segment - 2) is what an
induction head makes of three things: its QUERY, the token at second + j;
the KEY at first + j + 1, which finds it through that key's previous
token (first + j); and the VALUE there, the token at first + j + 1, which
is copied. Each corruption (`KINDS`) breaks one of them, replacing tokens
by other symbols drawn uniformly, so the corrupted input is still a
sequence of uniform random symbols with the clean layout:

  "first_copy"   the whole first copy: keys AND values at once (no path
                 is seen alone; the queries are untouched, so no query
                 path can be seen).
  "second_copy"  the second copy (the queries): keys and values intact.
  "key"          the first copy's tokens at even offsets j, and only the
                 predictions with even j are scored: their key's previous
                 token is gone, their value token (odd offset) is intact.
  "value"        the first copy's tokens at odd offsets, the same
                 predictions scored: their key is intact, the token it
                 would copy is not.
  "no_match"     every token before the second copy that occurs in the
                 second copy, replaced by a symbol that does not: no
                 earlier occurrence, real or by chance, is left to copy
                 from, so a model cannot be confidently wrong by copying
                 one: the candidate for a corrupted run near chance (a
                 model wrong with confidence even without a match stays
                 below it).
                 (Those symbols are then absent from the prefix: the one
                 corruption whose token statistics differ from clean.)

The targets are the clean ones in every kind; "key" and "value" return
the loss mask of their scored predictions, the others the task's.
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


KINDS = ("first_copy", "second_copy", "key", "value", "no_match")


def _check_kind(kind, fn):
  if kind not in KINDS:
    raise ValueError(f"{fn}: `kind` must be one of {KINDS}, got {kind!r}")


def _other_symbol(key, x, n):
  """A symbol other than `x [B, T]`, uniform over the other n - 1: add
  1..n-1 modulo the n symbols."""
  shift = jax.random.randint(key, x.shape, 1, n)
  return (x - tasks.NUM_SPECIAL + shift) % n + tasks.NUM_SPECIAL


def _outside_set(key, x, in_set, n):
  """`[B, T]` symbols drawn uniformly, per row, from the symbols whose
  `in_set [B, N]` is False (each row must have one)."""
  # Stable sort: the allowed symbols first, in order; draw a rank among
  # the row's count of them.
  allowed = jnp.argsort(in_set, axis=-1, stable=True)  # [B, N]
  count = n - jnp.sum(in_set, axis=-1, keepdims=True)  # [B, 1]
  u = jax.random.uniform(key, x.shape)
  rank = jnp.minimum(jnp.floor(u * count), count - 1).astype(jnp.int32)
  return jnp.take_along_axis(allowed, rank, axis=-1) + tasks.NUM_SPECIAL


def _no_match(key, x, second, segment, n):
  """`x` with every token before `second` that occurs in the second copy
  replaced by a symbol that does not occur there."""
  pos = jnp.arange(x.shape[1])[None, :]  # [1, T]
  in_second = (pos >= second[:, None]) & (pos < (second + segment)[:, None])
  symbols = (jnp.arange(n) + tasks.NUM_SPECIAL)[None, None, :]  # [1, 1, N]
  hit = (x[:, :, None] == symbols) & in_second[:, :, None]  # [B, T, N]
  in_set = jnp.any(hit, axis=1)  # [B, N]: the second copy's symbols
  used = jnp.take_along_axis(in_set, x - tasks.NUM_SPECIAL, axis=1)  # [B, T]
  redraw = used & (pos < second[:, None])
  return jnp.where(redraw, _outside_set(key, x, in_set, n), x)


def corrupt(key, batch, segment, first, second, *, kind: str, vocab_size: int
            ) -> dict:
  """The `kind` corruption (`KINDS`, module docstring) of a clean batch.

  Args:
    key: PRNG key of the corrupting draws.
    batch: `inputs`, `targets`, `loss_mask`, all `[B, T]`.
    segment, first, second: each example's layout, `[B]`.
    kind: one of `KINDS`.
    vocab_size: the task's vocabulary (symbols from `tasks.NUM_SPECIAL`).

  Returns:
    `{"corrupted": [B, T], "loss_mask": [B, T]}`: the corrupted inputs and
    the predictions the metric scores.
  """
  _check_kind(kind, "corrupt")
  x, mask = batch["inputs"], batch["loss_mask"]
  n = vocab_size - tasks.NUM_SPECIAL
  if kind == "no_match":
    return {"corrupted": _no_match(key, x, second, segment, n),
            "loss_mask": mask}
  pos = jnp.arange(x.shape[1])[None, :]  # [1, T]
  start = second if kind == "second_copy" else first
  offset = pos - start[:, None]  # [B, T]
  redraw = (offset >= 0) & (offset < segment[:, None])
  if kind in ("key", "value"):
    # Even offsets hold the keys' previous tokens of the even predictions,
    # odd offsets their values; only the even predictions are scored.
    redraw &= offset % 2 == (0 if kind == "key" else 1)
    mask = mask * ((pos - second[:, None]) % 2 == 0)
  return {"corrupted": jnp.where(redraw, _other_symbol(key, x, n), x),
          "loss_mask": mask}


def induction_pairs(key, cfg, *, layout=None, kind: str = "first_copy"
                    ) -> dict:
  """Clean induction sequences and their corrupted twins.

  Args:
    key: PRNG key.
    cfg: the task config (`batch_size`, `seq_len`, `vocab_size`,
      `min_segment`, `max_segment`).
    layout: None: every example has its own random layout, and the clean
      half is exactly `tasks.induction_batch(key, cfg)`; or `(segment,
      first, second)` ints shared by every example (to line positions up
      across examples).
    kind: which tokens are corrupted (`KINDS`, module docstring).

  Returns:
    The clean batch (`inputs`, `targets`, `loss_mask`, all `[B, T]`; for
    "key" and "value" the mask keeps only the scored predictions), plus
    `corrupted [B, T]` and `segment`, `first`, `second` `[B]`.
  """
  _check_kind(kind, "induction_pairs")  # before any drawing
  b = cfg.batch_size
  if layout is None:
    batch = tasks.induction_batch(key, cfg)
    seg, s1, s2 = _layouts(key, cfg)
  else:
    batch = _fixed_batch(key, cfg, *layout)
    seg, s1, s2 = (jnp.full((b,), v, jnp.int32) for v in layout)
  out = corrupt(jax.random.fold_in(key, _CORRUPT_STREAM), batch, seg, s1, s2,
                kind=kind, vocab_size=cfg.vocab_size)
  return dict(batch, **out, segment=seg, first=s1, second=s2)
