"""Which key blocks a query block of the blockwise kernel visits.

Shape letters: B batch, Tq query length, Tk key length, Bq / Bk query /
key block lengths, Nq / Nk block counts, P parts per block side.

The kernel's forward and backward (`flash_kernel.py`) walk the same key
blocks for a query block, so the walk is written once, here: the blocks
a block mask lists (`key_blocks`), or else the range the built-in causal
rule and local window leave visible (`kv_block_range`; computed
statically, `visited_blocks`), each block skipped where packed segments
rule it out (`visit_block`). The positions of a block's queries and keys
are here too (`block_q_pos`, `block_k_pos`): the range is computed from
them, and the kernel's score rules (`flash_kernel.block_scores`) read
them. Nothing here touches a score. `cfg` and `ex` are
`flash_config.BlockConfig` and `flash_config.Extras`; a banded block
mask's span walk is `flash_schedule.py`'s.
"""

from __future__ import annotations

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
