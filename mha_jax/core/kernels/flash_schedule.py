"""The blockwise kernel's schedule: how its blocks are chosen and walked.

Shape letters: B batch, K key/value heads, G query heads per kv head,
Tq' / Tk' padded query / key lengths, Dh query/key width, Dv value
width, Bq / Bk query / key block lengths, Nq / Nk block counts, L key
blocks per span.

The algorithm (`flash_kernel.py`) gives the same result on any blocks,
in any order of key blocks; what is fast differs by backend and size,
and every choice here was measured (on CPU; docs/performance.md,
docs/score_rules.md): the block lengths (`default_blocks`,
`backward_block`, `block_config`), whether the heads run one (batch, kv
head) at a time (`runs_head_loop`), and whether a banded block mask is
walked as spans of key blocks (`span_walk`, `span_plan`,
`span_blocks`). Whether q is scaled once beforehand (`prescaled`) is
here too. None of it changes which scores a query sees.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import score_rules
from mha_jax.core.kernels.flash_config import BlockConfig
from mha_jax.core.kernels.flash_kernel import accumulate
from mha_jax.core.kernels.flash_kernel import block_scores
from mha_jax.core.kernels.flash_kernel import initial_state


# 128 x 128 blocks ([B, H, 128, 128] float32 = 512 KiB for B=1, H=8) stay in
# cache on CPU; a sweep over 128..1024 (CPU time, B=8 n=512 and B=1 n=4096
# causal) found them cheapest or within noise of the cheapest.
DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 128
# The backward pass does five block matmuls per block pair and keeps more
# blocks live ([Bq, Bk] probabilities and their gradient), so it runs on
# halved blocks: at the standard CPU shape (B=8 n=512 D=256 h=8) forward
# 128 / backward 64 took 0.63x flax.linen's forward+backward CPU time
# against 0.76x for 128 throughout and 0.68x for 64 throughout (one
# interleaved run, 7 rounds; docs/performance.md).
BACKWARD_BLOCK = 64
# On CPU the kernel runs one (batch, kv head) at a time (`head_loop`), on
# blocks of 512 forward and backward. XLA's CPU backend runs a batched dot
# over the B*K heads of small blocks at 32-50 GFLOP/s, against 115-143 for
# a large matmul, while one head's plain 2-d block matmuls run near the
# latter. Forward+backward of the attention alone at B=8 n=512 h=8 Dh=32:
# 0.43x the batched kernel's time; at B=1 n=2048 h=8 Dh=64, 0.74x (0.97x
# causal). Backward blocks of 128 or 256 kept less of the gain (0.62x and
# 0.70x at n=512); docs/performance.md.
HEAD_LOOP_BLOCK = 512


def backward_block(block):
  """The backward's block length for a forward block: `BACKWARD_BLOCK`
  where it divides the forward block (the arrays are padded to whole
  forward blocks), else the forward block itself."""
  return BACKWARD_BLOCK if block % BACKWARD_BLOCK == 0 else block


def default_blocks(head_loop: bool) -> tuple[int, int]:
  """`(block_q, block_k)` the kernel takes when none is given: one head at
  a time (CPU) `HEAD_LOOP_BLOCK`, batched `DEFAULT_BLOCK_Q/K`."""
  if head_loop:
    return HEAD_LOOP_BLOCK, HEAD_LOOP_BLOCK
  return DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K


def prescaled(dtype) -> bool:
  """In float32 the scale is folded into q once ([Tq, Dh]) instead of into
  every score block ([Tq, Tk], forward and backward again): 7% less CPU
  time for forward+backward at the standard shape. Lower precisions keep
  the product in float32 on the scores, where it does not round q."""
  return dtype == jnp.float32


def block_config(dtype, head_dim, rules, is_causal, tq, tk, block_q, block_k,
                 *, halve_backward=True) -> BlockConfig:
  """The kernel's static facts for queries of length `tq` against keys of
  length `tk` (one call's, which may be one device's slice), on blocks of
  at most `block_q` x `block_k`. `halve_backward`: the batched kernel's
  backward runs on halved blocks (BACKWARD_BLOCK); one head at a time it
  keeps the forward's. With `prescaled(dtype)` the caller multiplies q by
  the scale. Only the static rules (window, soft cap, scale) are kept;
  user rules are `flash.flash_attention`'s to add (the context-parallel
  callers refuse them: their records, `parallel.context.RULES`)."""
  bq, bk = min(block_q, tq), min(block_k, tk)
  tk_pad = -(-tk // bk) * bk
  return BlockConfig(tq=tq, tk=tk, bq=bq, bk=bk,
                     bwd_bq=backward_block(bq) if halve_backward else bq,
                     bwd_bk=backward_block(bk) if halve_backward else bk,
                     padded_keys=tk_pad != tk,
                     is_causal=bool(is_causal),
                     rules=score_rules.builtin_static(rules),
                     scale=(1.0 if prescaled(dtype)
                            else score_rules.scale_of(rules, head_dim)))


# Under a block mask shared by every row and head, the CPU kernel runs the
# heads batched while one block of all their float32 scores (B H Bq Bk x 4
# bytes) takes at most this; `runs_head_loop` gives the measurements.
BATCHED_BLOCK_BYTES = 8 * 2 ** 20


def runs_head_loop(backend: str, bm, batch_heads: int) -> bool:
  """Whether the kernel runs one (batch, kv head) at a time by default, for
  a call of `batch_heads` = B x H query rows of heads.

  On CPU it does (`HEAD_LOOP_BLOCK` says why), except under a block mask
  that is the same for every batch row and head (`bm.state` of shape
  `[1, 1, Nq, Nk]`) whose batched score block fits `BATCHED_BLOCK_BYTES`:
  there the batched kernel skips the same blocks, and its block ops, B H
  times as large, keep both cores busier than one head's. Forward time,
  batched over one-at-a-time, blocks of 512, Dh 64 (docs/score_rules.md):
  causal window or documents at B H = 2, n = 32768, 0.75-0.82x (fresh
  processes, five alternations); causal, interleaved in one process,
  0.80-0.93x at B H = 2 to 8 (n 512-8192), 1.09-1.13x at 16, 1.41x at 32
  and 2.16x at B 8, H 8, n 512 (Dh 32), where the 64 MiB score block no
  longer stays in cache. A block mask that differs by row or head keeps
  the loop, whose lists skip each one's own blocks. Elsewhere (GPU, TPU)
  the batched kernel keeps the device busy.
  """
  if backend != "cpu":
    return False
  if bm is None or bm.state.shape[:2] != (1, 1):
    return True
  return 4 * batch_heads * bm.q_block * bm.kv_block > BATCHED_BLOCK_BYTES


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
  at most `SPAN_AREA` scores and one query block's fit `SPAN_BYTES`.
  Forward time of a causal 512-key window, B 1, H 2, Dh 64, over seven
  benchmark runs (docs/score_rules.md): spans of
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


def span_walk(backend: str, bm, batch_heads: int, head_loop=None,
              lists=None):
  """The span walk (`Span`) the kernel takes for block mask `bm` on a
  call of `batch_heads` = B x H, or None (the block walk): on CPU, with
  the heads batched (`head_loop` False; None: by `runs_head_loop`) and a
  banded mask (`span_plan`; its docstring has the measurements).
  Elsewhere the batched block walk already keeps the device busy on
  small blocks. `lists`: the call's
  `(num, idx)`, cut by its built-in rules (None: the mask's own)."""
  if head_loop is None:
    head_loop = runs_head_loop(backend, bm, batch_heads)
  if backend != "cpu" or head_loop:
    return None
  if lists is None:
    lists = bm.kernel_lists(1, per_head=False)[:2]
  return span_plan(*lists, -(-bm.kv_len // bm.kv_block), bm.q_block,
                   bm.kv_block, batch_heads)


def span_blocks(q, k, v, mask, bias, ex, cfg):
  """`flash_kernel.forward_blocks` from the start on the spans of a
  banded block mask (`span_plan`): query block i against the
  cfg.span_len key blocks from `ex.span_first[i]` in one online-softmax
  step, masked to its listed blocks (`ex.span_keep`), cfg.span_group
  query blocks run together (a vmap). Every score rule applies as in the
  block walk; the one difference is that a block the mask calls full
  still gets the mask_mod (exact for the rule the mask was built
  from)."""
  nq, group = q.shape[3] // cfg.bq, cfg.span_group
  span_cfg = cfg._replace(bk=cfg.span_len * cfg.bk)
  # Each step starts from one query block's initial state (no [Tq, Dv]
  # state to read: there is one step per query block).
  start = initial_state(ex, cfg, q.shape[:3] + (cfg.bq, q.shape[4]),
                        v.shape[-1])

  # Keys as [B, K, Dh, Tk']: a span's slice is then the layout its score
  # matmul reads (sliced [L Bk, Dh], XLA copied each span to this layout:
  # 6.5 of 75 ms at n = 32768).
  k_t = jnp.swapaxes(k, 2, 3)

  def one(i, ks, keep):
    qs = i * cfg.bq
    qb = lax.dynamic_slice_in_dim(q, qs, cfg.bq, axis=3)  # [B,K,G,Bq,Dh]
    kb = jnp.swapaxes(lax.dynamic_slice_in_dim(
        k_t, ks, span_cfg.bk, axis=3), 2, 3)  # [B,K,L Bk,Dh]
    vb = lax.dynamic_slice_in_dim(v, ks, span_cfg.bk, axis=2)
    s, _ = block_scores(qb, kb, mask, bias, ex, qs, ks, span_cfg)
    return accumulate(jnp.where(keep, s, -jnp.inf), vb,
                      tuple(x[0] for x in start))

  by_step = lambda x: x.reshape(nq // group, group, *x.shape[1:])
  out = lax.map(lambda xs: jax.vmap(one)(*xs), tuple(map(by_step, (
      jnp.arange(nq), ex.span_first, ex.span_keep))))
  return tuple(x.reshape(nq, *x.shape[2:]) for x in out)
