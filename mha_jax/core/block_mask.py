"""Which (query block, key block) pairs a `mask_mod` empties, fills or cuts.

Shape letters: B batch, H query heads, K key/value heads, Tq / Tk query /
key length, Bq / Bk block lengths, Nq / Nk block counts.

The blockwise kernel (`kernels/flash.py`) walks the scores one `[Bq, Bk]`
block at a time. For a user rule `mask_mod(b, h, q_idx, kv_idx) -> bool`
(`score_rules.ScoreRules`) each block is one of

    empty    no key of the block may be attended: the kernel never visits it
    partial  some may: the kernel evaluates mask_mod on the block
    full     all may: the kernel visits it without the mask_mod work

and each block's P x P sub-blocks (`PARTS`) are recorded as empty or not,
so that a block whose allowed sub-blocks the call's built-in rules
(is_causal, a window) all hide is left off the kernel's lists.

`create` finds the state of every block exactly, by evaluating mask_mod on
every (q, kv) pair; block corners or samples would misjudge a rule such as
"keys in the same document" whose boundary crosses a block between them.
Cost: B' H' Tq Tk evaluations of mask_mod (B' = 1 when `batch` is None,
H' = 1 when `heads` is None: the rule does not depend on them), run as one
compiled program over `CHUNK` pairs at a time, so memory stays bounded
whatever the length (each int32 or bool array the rule makes over a chunk
is 16-64 MiB); it is paid once
per shape and the result is reused by every call of that shape. The
benchmark (experiments/score_rules_bench/) records the time at
Tq = Tk = 8192 and 32768.

Positions follow the kernel: query i sits at `Tk - Tq + i` (bottom-right,
as the causal rule), key j at j. A block mask
is exact for the rule it was built from and the shape it was built for;
passing one built from another rule gives that other rule's skipping (as
in FlexAttention, it is not checked).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import score_rules

EMPTY, PARTIAL, FULL = 0, 1, 2
# Each block is also cut into PARTS x PARTS sub-blocks whose emptiness is
# recorded (`BlockMask.parts`), for `kernel_lists`' cut by the built-in
# rules. (Computing only a block's non-empty quarters in the forward was
# tried and dropped: bit-identical, but 1.08-1.11x the forward time of a
# 512-key window at n = 8192 measured in fresh processes,
# `experiments.speed_ab --cases=window_fwd`, docs/score_rules.md.)
PARTS = 2
# Pairs evaluated per compiled call of `create`: 2^24, so that each int32
# (or bool) array the rule makes over a chunk is 64 (16) MiB.
CHUNK = 2 ** 24


@dataclasses.dataclass(frozen=True, eq=False)
class BlockMask:
  """The block states of one mask_mod at one shape (hashable by identity:
  a static field of `ScoreRules`).

  Attributes:
    state: int8 `[B', H', Nq, Nk]` of EMPTY / PARTIAL / FULL, B' in {1, B},
      H' in {1, H} (1: the same for every row / head).
    q_len, kv_len: Tq, Tk. q_block, kv_block: Bq, Bk (the kernel's blocks).
    q_offset: the position of query 0 (Tk - Tq).
    parts: bool `[B', H', Nq, Nk, P, P]` or None: whether sub-block (row
      part r, key part c) of each block, of Bq/P x Bk/P, has any allowed
      pair (`PARTS`; None: not recorded, every part of a non-empty block
      counts as non-empty).
  """
  state: np.ndarray
  q_len: int
  kv_len: int
  q_block: int
  kv_block: int
  q_offset: int
  parts: np.ndarray | None = None

  def counts(self) -> dict:
    """How many blocks are empty, partial and full (over B' H' Nq Nk)."""
    return {name: int(np.sum(self.state == v)) for name, v in
            (("empty", EMPTY), ("partial", PARTIAL), ("full", FULL))}

  def computed(self) -> int:
    """Blocks the kernel computes (partial + full) over B' H'."""
    return int(np.sum(self.state != EMPTY))

  def check_call(self, rules, *, batch, num_heads, q_len, kv_len, fn):
    """Raise naming `block_mask` unless this mask fits the call."""
    bb, hh = self.state.shape[:2]
    problems = []
    if (q_len, kv_len) != (self.q_len, self.kv_len):
      problems.append(f"it was built for Tq={self.q_len}, Tk={self.kv_len}"
                      f", the call has Tq={q_len}, Tk={kv_len}")
    if bb not in (1, batch) or hh not in (1, num_heads):
      problems.append(f"its batch and heads ({bb}, {hh}) do not broadcast "
                      f"to the call's ({batch}, {num_heads})")
    if rules.mask_mod is None:
      problems.append("the call has no `mask_mod` it was built from")
    if rules.q_positions is not None:
      problems.append("the call passes `q_positions` (a block mask holds "
                      "fixed positions; decode without it)")
    if problems:
      raise ValueError(f"{fn}: `block_mask` does not fit: "
                       + "; ".join(problems))

  def kernel_lists(self, num_kv_heads: int, *, per_head: bool,
                   visible=None):
    """The kernel's visiting lists, NumPy (static): `(num [B',K',Nq],
    idx [B',K',Nq,Nk], full [B',K',Nq,Nk])`: query block i visits key
    blocks idx[.., i, :num] (in order), idx[.., i, t] full where
    full[.., i, t]. The G query heads of a kv head run together, so
    a block is skipped only where all of them are empty and full only
    where all are full; without `per_head` (the batched kernel) the same
    holds over B and K too. `visible(p)`: bool `[Nq p, Nk p]`, False on the
    sub-blocks of Bq/p x Bk/p the call's built-in rules hide, left out of
    the lists (None: none hidden)."""
    st, parts = self.state, self.parts
    if parts is None:
      p = 1
      parts = (st != EMPTY)[..., None, None]
    else:
      p = parts.shape[-1]
    if st.shape[1] > 1:  # [B', H', ..] -> [B', K, G, ..] -> over G
      group = lambda x: x.reshape(x.shape[0], num_kv_heads, -1, *x.shape[2:])
      st, parts = _merge(group(st), axis=2), np.any(group(parts), axis=2)
    if not per_head:
      st = _merge(_merge(st, axis=0)[None], axis=1)[:, None]
      parts = np.any(parts, axis=(0, 1), keepdims=True)
    if visible is not None:
      nq, nk = st.shape[2:]
      seen = np.asarray(visible(p))
      if seen.shape != (nq * p, nk * p):
        raise ValueError(f"kernel_lists: `visible({p})` must have shape "
                         f"{(nq * p, nk * p)}, got {seen.shape}")
      parts = parts & seen.reshape(nq, p, nk, p).transpose(0, 2, 1, 3)
    nonempty = np.any(parts, axis=(-2, -1))
    order = np.argsort(~nonempty, axis=-1, kind="stable")
    take = lambda x: np.take_along_axis(
        x, order.reshape(order.shape + (1,) * (x.ndim - order.ndim)),
        axis=order.ndim - 1)
    full = take(st == FULL)
    return (nonempty.sum(-1).astype(np.int32), order.astype(np.int32),
            full)


def _merge(st, axis):
  """Block states of heads run together: empty if all are, full if all
  are, else partial."""
  empty = np.all(st == EMPTY, axis=axis)
  full = np.all(st == FULL, axis=axis)
  return np.where(empty, EMPTY, np.where(full, FULL, PARTIAL)).astype(
      np.int8)


def create(mask_mod: Callable, batch: int | None, heads: int | None,
           q_len: int, kv_len: int, q_block: int | None = None,
           kv_block: int | None = None) -> BlockMask:
  """The `BlockMask` of `mask_mod(b, h, q_idx, kv_idx) -> bool` for
  queries `[Tq]` against keys `[Tk]` on blocks of `q_block` x `kv_block`
  (None: the blockwise kernel's default for this backend; clipped to the
  lengths, as the kernel clips them).

  `batch`, `heads`: B and H, or None where the rule depends on neither.
  Query i sits at position Tk - Tq + i, as in the kernel. Runs mask_mod on
  all B' H' Tq Tk pairs (module docstring); not under jit (the result is
  NumPy, a static part of the compiled program).
  """
  from mha_jax.core.kernels import flash_schedule  # pylint: disable=g-import-not-at-top
  for name, val, can_be_none in (("batch", batch, True),
                                 ("heads", heads, True),
                                 ("q_len", q_len, False),
                                 ("kv_len", kv_len, False),
                                 ("q_block", q_block, True),
                                 ("kv_block", kv_block, True)):
    if val is None and can_be_none:
      continue
    if not isinstance(val, (int, np.integer)) or isinstance(val, bool) \
        or val < 1:
      raise ValueError(f"block_mask.create: `{name}` must be a positive int"
                       f"{' or None' if can_be_none else ''}, got {val!r}")
  score_rules.check_user(score_rules.ScoreRules(mask_mod=mask_mod),
                         "block_mask.create")
  default = flash_schedule.default_blocks(jax.default_backend() == "cpu")
  bq = min(default[0] if q_block is None else q_block, q_len)
  bk = min(default[1] if kv_block is None else kv_block, kv_len)
  q_offset = kv_len - q_len
  nq, nk = -(-q_len // bq), -(-kv_len // bk)
  rows = max(1, min(nq, CHUNK // (bq * nk * bk)))  # query blocks per call
  p = PARTS if bq % PARTS == 0 and bk % PARTS == 0 else 1
  state = np.empty((batch or 1, heads or 1, nq, nk), np.int8)
  parts = np.empty(state.shape + (p, p), bool)
  run = _chunk_states(mask_mod, rows, bq, bk, nk, q_len, kv_len, q_offset,
                      p)
  for b in range(state.shape[0]):
    for h in range(state.shape[1]):
      for i in range(0, nq, rows):
        got, some = run(jnp.int32(b), jnp.int32(h), jnp.int32(i))
        state[b, h, i:i + rows] = np.asarray(got)[:nq - i]
        parts[b, h, i:i + rows] = np.asarray(some)[:nq - i]
  return BlockMask(state=state, q_len=q_len, kv_len=kv_len, q_block=bq,
                   kv_block=bk, q_offset=q_offset,
                   parts=parts if p > 1 else None)


def _chunk_states(mask_mod, rows, bq, bk, nk, q_len, kv_len, q_offset, p):
  """A compiled `(b, h, first query block) -> (int8 [rows, Nk] states,
  bool [rows, Nk, p, p] non-empty parts)`."""
  @jax.jit
  def run(b, h, i0):
    q = i0 * bq + jnp.arange(rows * bq, dtype=jnp.int32)  # [R Bq]
    kv = jnp.arange(nk * bk, dtype=jnp.int32)  # [Nk Bk]
    ok = score_rules.elementwise(
        mask_mod, (b.reshape(1, 1), h.reshape(1, 1), (q + q_offset)[:, None],
                   kv[None, :]), (rows * bq, nk * bk))
    # Rows and keys past the lengths (the last blocks' padding) count for
    # neither: the kernel masks them itself.
    real = (q < q_len)[:, None] & (kv < kv_len)[None, :]
    cut = (rows, p, bq // p, nk, p, bk // p)
    ok, real = ok.reshape(cut), real.reshape(cut)
    parts = jnp.any(ok & real, axis=(2, 5))  # [rows, p, Nk, p]
    some = jnp.any(parts, axis=(1, 3))
    every = jnp.all(ok | ~real, axis=(1, 2, 4, 5))
    state = jnp.where(some, jnp.where(every, FULL, PARTIAL), EMPTY)
    return state.astype(jnp.int8), parts.transpose(0, 2, 1, 3)
  return run
