"""Which key blocks a query block of the blockwise kernel visits.

Shape letters: B batch, Tq query length, Tk key length, Bq / Bk query /
key block lengths, Nq / Nk block counts, P parts per block side.

`flash.py`'s forward and backward walk the same key blocks for a query
block, so the walk is written once, here: the blocks a block mask lists
(`key_blocks`), or else the range the built-in causal rule and local
window leave visible (`kv_block_range`; computed statically,
`visited_blocks`), each block skipped where packed segments rule it out
(`visit_block`). The positions of a block's queries and keys are here
too (`block_q_pos`, `block_k_pos`): the range is computed from them, and
the kernel's score rules (`flash_rules.py`) read them. Nothing here
touches a score. `cfg` and `ex` are `flash.BlockConfig` and
`flash.Extras`.
"""

from __future__ import annotations

from typing import NamedTuple

from jax import lax
import jax.numpy as jnp
import numpy as np


def block_q_pos(ex, qs, cfg):
  """Key positions `[B?, 1, 1, Bq]` of the queries of the block at `qs`."""
  if ex.q_pos is None:
    return (qs + jnp.arange(cfg.bq) + (cfg.tk - cfg.tq))[None, None, None]
  return lax.dynamic_slice_in_dim(ex.q_pos, qs, cfg.bq, axis=1)[
      :, None, None]


def key_start(ex):
  """Position of key 0 (a traced int; 0 unless `ex.k_start` says)."""
  return 0 if ex.k_start is None else ex.k_start[0]


def block_k_pos(ex, ks, cfg):
  """Positions `[Bk]` of the keys of the block at `ks`."""
  return key_start(ex) + ks + jnp.arange(cfg.bk)


def key_blocks(i, nk, ex, cfg, body, carry):
  """Run `body(j, full, carry)` over the key blocks query block i visits:
  those of the block mask (`full` from it; its lists already leave out
  the blocks the built-in rules hide, `visited_blocks`) or the built-in
  range (`kv_block_range`, full False)."""
  if not cfg.block_masked:
    return lax.fori_loop(*kv_block_range(i, nk, ex, cfg),
                         lambda j, c: body(j, False, c), carry)
  def step(t, c):
    return body(ex.kv_idx[0, 0, i, t], ex.kv_full[0, 0, i, t], c)
  return lax.fori_loop(0, ex.kv_num[0, 0, i], step, carry)


def _key_range(first_q, last_q, key0, nk, cfg, xp):
  """`(first, end)` key blocks that queries at positions first_q..last_q
  may see under the built-in rules, for keys starting at position `key0`;
  `xp`: jnp (traced positions) or np (static ones)."""
  window = cfg.rules.local_window
  last_key, first_key = last_q, 0
  if window is not None:
    last_key = last_q + window[1]
    first_key = first_q - window[0]
  if cfg.is_causal:
    last_key = xp.minimum(last_key, last_q)
  # From positions to this call's key indices (its keys start at key0).
  first_key, last_key = first_key - key0, last_key - key0
  end = xp.clip(last_key // cfg.bk + 1, 0, nk)
  return xp.clip(first_key // cfg.bk, 0, nk), end


def kv_block_range(i, nk, ex, cfg):
  """`(first, end)` key blocks query block i must visit: the causal rule
  hides the later ones and a local window the earlier ones too, so a
  windowed call costs O(T * window), not O(T^2)."""
  if not cfg.is_causal and cfg.rules.local_window is None:
    return 0, nk
  q_pos = block_q_pos(ex, i * cfg.bq, cfg)
  return _key_range(jnp.min(q_pos), jnp.max(q_pos), key_start(ex), nk, cfg,
                    jnp)


def visited_blocks(cfg, nq, nk):
  """bool `[Nq, Nk]`: the key blocks each query block's built-in rules
  (is_causal, local_window) leave visible, for queries at their default
  positions `Tk - Tq + i` and keys from 0: `kv_block_range` computed once,
  statically. A block mask's lists are cut to these, so the kernel's walk
  over them needs no per-block range test (a `lax.cond` per block)."""
  if not cfg.is_causal and cfg.rules.local_window is None:
    return np.ones((nq, nk), bool)
  first_q = np.arange(nq) * cfg.bq + (cfg.tk - cfg.tq)
  first, end = _key_range(first_q, first_q + cfg.bq - 1, 0, nk, cfg, np)
  first, end = (np.broadcast_to(x, (nq,))[:, None] for x in (first, end))
  j = np.arange(nk)
  return (j >= first) & (j < end)


def full_or_not(visit, full):
  """`visit(carry, full)` as a function of the carry. `full` is False
  without a block mask; with one it is traced, and a block the mask found
  full takes the branch without the mask_mod work."""
  if full is False:
    return lambda c: visit(c, False)
  return lambda c: lax.cond(full, lambda c: visit(c, True),
                            lambda c: visit(c, False), c)


def visit_block(ex, qs, ks, cfg, body, carry):
  """`body(carry)` for the block at (qs, ks), skipped when packed segments
  rule it out: no segment id of the query block lies in the key block's
  range (a sufficient test whatever the ids' order)."""
  if ex.q_seg is None:
    return body(carry)
  q = lax.dynamic_slice_in_dim(ex.q_seg, qs, cfg.bq, axis=1)
  k = lax.dynamic_slice_in_dim(ex.k_seg, ks, cfg.bk, axis=1)
  shared = (jnp.min(q) <= jnp.max(k)) & (jnp.min(k) <= jnp.max(q))
  return lax.cond(shared, body, lambda c: c, carry)


class Span(NamedTuple):
  """A banded block mask's walk (`span_plan`): query block i against the
  `length` key blocks from `first[i]` in one step, `group` query blocks
  at a time; `listed[i, t]`: whether block first[i] + t is on i's list
  (the others in its span are masked, so the result is the lists')."""
  first: np.ndarray  # [Nq] int32
  listed: np.ndarray  # [Nq, length] bool
  length: int
  group: int


# A span is taken while its blocks are at most this many times the listed
# ones (the measurements are in `span_plan`'s docstring).
SPAN_SLACK = 1.25
# Query rows per step of the span walk, and the most float32 score bytes
# one step may hold (all its query blocks, B K G rows each).
SPAN_ROWS = 512
SPAN_BYTES = 8 * 2 ** 20
# The most scores one query block's span may have: one block of the CPU
# block walk (512 x 512). On larger spans the walk was faster (blocks of
# 512, window 512: the span took 1.4x its time).
SPAN_AREA = 512 * 512


def span_plan(num, idx, nk, bq, bk, batch_heads):
  """The walk of a block mask shared by every row and head (`num [1, 1,
  Nq]`, `idx [1, 1, Nq, Nk]` as `BlockMask.kernel_lists` gives them) as
  spans, or None where it is not banded enough.

  Each query block's listed key blocks lie in one contiguous span of at
  most `length` = L blocks (a sliding window: L = window / Bk + 1). The
  walk then computes each query block against its whole span in one
  online-softmax step, `group` query blocks (about `SPAN_ROWS` rows) per
  step, instead of one step per listed block: XLA's CPU backend pays a
  few microseconds per operation, so many small blocks cost more than
  their arithmetic, and a span lets the blocks be small (128: a window of
  512 then computes 640 keys per query instead of the 1024 of blocks of
  512). Taken while Nq L <= `SPAN_SLACK` x the listed blocks, a span has
  at most `SPAN_AREA` scores and one query block's fit `SPAN_BYTES`. Forward time of a causal 512-key window, B 1,
  H 2, Dh 64, over seven benchmark runs (docs/score_rules.md): spans of
  blocks of 128 took 0.51-0.97x the block walk's on blocks of 512 at
  n = 32768 and 0.73-0.94x at n = 8192.
  """
  num, idx = np.asarray(num), np.asarray(idx)
  if num.shape[:2] != (1, 1):
    return None
  num, idx = num[0, 0], idx[0, 0]  # [Nq], [Nq, Nk]
  nq = num.shape[0]
  on_list = np.arange(idx.shape[1]) < num[:, None]
  some = num > 0  # rows with no listed block get a span anyway, all masked
  first = np.where(some, np.where(on_list, idx, nk).min(axis=1), 0)
  last = np.where(some, np.where(on_list, idx, -1).max(axis=1), 0)
  length = int(np.max(last - first + 1))
  if (nq * length > SPAN_SLACK * max(int(num.sum()), 1)
      or bq * length * bk > SPAN_AREA):
    return None
  per_block = 4 * batch_heads * bq * length * bk  # one query block's scores
  if per_block > SPAN_BYTES:
    return None
  group = max(1, min(SPAN_ROWS // bq, SPAN_BYTES // per_block))
  while nq % group:  # steps of equal size
    group -= 1
  first = np.minimum(first, nk - length).astype(np.int32)  # inside the keys
  listed = np.zeros((nq, length), bool)
  for i in np.flatnonzero(some):
    listed[i, idx[i, :num[i]] - first[i]] = True
  return Span(first=first, listed=listed, length=length, group=group)
