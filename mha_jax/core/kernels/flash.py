"""Blockwise ("flash") attention: an online softmax over key/value blocks.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads, G = H // K query heads per kv head, Dh query/key width,
Dv value width, Bq / Bk query / key block lengths, Nq / Nk block counts.

The reference paths build the whole score matrix `[B, H, Tq, Tk]`: the source's
"O(h n^2)" memory. Here the keys are visited one block at a time while a
running row maximum `m`, row sum `l` and unnormalised output `acc` are kept
per query (the online softmax):

    m' = max(m, rowmax(S_j))       p = exp(S_j - m')     a = exp(m - m')
    l' = a l + rowsum(p)           acc' = a acc + p V_j
    out = acc / l                  lse = m + log(l)

so live memory is O(Bq Bk) per head and O(T) overall. The backward pass
(`jax.custom_vjp`) saves only `out` and `lse` and recomputes each block's
probabilities as `exp(S - lse)`: O(T) memory for training too.
On CPU the (batch, kv head) pairs run one after another (`head_loop`),
so that each block product is a plain 2-d matmul, which XLA's CPU backend
runs several times faster than a batch of small ones; under a block mask
shared by every row and head they run batched where few enough
(`runs_head_loop`), and a banded one is walked as spans: each query
block against its run of key blocks in one step (`span_walk`,
`span_blocks`).

Semantics match `attention._attend_vmap` (the reference): boolean masks are
-inf before the softmax, `is_causal` is bottom-right aligned like
`masks.causal_mask` (and key blocks it hides entirely are never visited), a
query row with no allowed key gives output 0 with finite gradients, GQA reads
each kv head once for its G query heads, and scores, softmax and all
accumulators are float32 whatever the input dtype. It cannot return weights.

This file holds the configuration, the forward pass, the custom VJP's
wiring and the entry points. Which key blocks a query block visits is
`flash_visit.py`, what a block's scores are under the score rules
`flash_rules.py`, and the backward's walk `flash_backward.py`; the names
other modules use from those are importable from here.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from mha_jax.core import attention_path
from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.core.kernels.flash_backward import backward_walk
from mha_jax.core.kernels.flash_rules import block_scores
from mha_jax.core.kernels.flash_rules import user_rules
from mha_jax.core.kernels.flash_visit import full_or_not
from mha_jax.core.kernels.flash_visit import key_blocks
from mha_jax.core.kernels.flash_visit import kv_block_range
from mha_jax.core.kernels.flash_visit import span_plan
from mha_jax.core.kernels.flash_visit import visit_block
from mha_jax.core.kernels.flash_visit import visited_blocks
# Re-exported: context parallelism (`parallel/ring.py`) builds its passes
# from the backward's pieces, with the forward's, reached here.
from mha_jax.core.kernels.flash_backward import backward_blocks  # noqa: F401
from mha_jax.core.kernels.flash_backward import backward_cfg
from mha_jax.core.kernels.flash_backward import row_terms
from mha_jax.core.kernels.flash_backward import sink_grad
from mha_jax.core.kernels.flash_backward import zero_grads

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


class _Config(NamedTuple):
  """Static facts the kernels need (hashable: a nondiff argument)."""
  tq: int  # true query length
  tk: int  # true key length
  bq: int  # query block
  bk: int  # key block
  bwd_bq: int  # the backward's blocks
  bwd_bk: int
  padded_keys: bool  # Tk is padded up to a whole number of forward blocks
  is_causal: bool
  rules: score_rules.ScoreRules  # only its static fields are read here
  scale: float
  # The user rules with the arrays they close over hoisted
  # (`flash_rules.user_rules`): they take them (`_Extras.score_consts`,
  # `fixed_consts`) last.
  score_mod: object = None
  mask_mod: object = None
  block_masked: bool = False  # visit the blocks `_Extras.kv_*` list
  # Walk the block mask as spans (`flash_visit.span_plan`): each query
  # block against `span_len` key blocks in one step, `span_group` query
  # blocks per step (0: the block walk).
  span_len: int = 0
  span_group: int = 1


class _Extras(NamedTuple):
  """Per-call arrays of the score rules, laid out for 5-d blocks."""
  q_pos: jax.Array | None  # [B, Tq'] int, None: Tk - Tq + i
  q_seg: jax.Array | None  # [B, Tq'] int
  k_seg: jax.Array | None  # [B, Tk'] int
  slopes: jax.Array | None  # [1, K, G, 1, 1] float32 (ALiBi)
  sinks: jax.Array | None  # [1, K, G, 1] float32
  # [1] int: the position of key 0 (None: 0). Context parallelism passes
  # one device's slice of the keys, which starts further along.
  k_start: jax.Array | None = None
  # The user rules' inputs: batch rows [B, 1, 1, 1, 1] and query heads
  # [1, K, G, 1, 1] (int32), and the arrays their functions close over,
  # passed as arguments so that gradients reach them
  # (`flash_rules.user_rules`).
  b_ids: jax.Array | None = None
  h_ids: jax.Array | None = None
  score_consts: tuple = ()  # float: differentiated
  fixed_consts: tuple = ((), ())  # score_mod's others, mask_mod's: not
  # A block mask (`block_mask.kernel_lists`): per query block, how many
  # key blocks to visit [B', K', Nq], which [B', K', Nq, Nk] and whether
  # each is full [B', K', Nq, Nk] (its mask_mod work skipped).
  kv_num: jax.Array | None = None
  kv_idx: jax.Array | None = None
  kv_full: jax.Array | None = None
  # The span walk's (`flash_visit.Span`): each query block's first key
  # [Nq] and which keys of its span are in listed blocks [Nq, L Bk].
  span_first: jax.Array | None = None
  span_keep: jax.Array | None = None


# The names context parallelism (a layer above) builds on.
BlockConfig, Extras = _Config, _Extras
# The block range under the name the tests check it by.
_kv_block_range = kv_block_range


def _to_5d(x, h, kh):
  """`[b?, h?, tq?, tk?]` (any rank <= 4) -> `[b?, K?, G?, tq?, tk?]`."""
  if x is None:
    return None
  x = jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)
  if x.shape[1] == h:
    return x.reshape(x.shape[0], kh, h // kh, *x.shape[2:])
  return x[:, :, None]  # one value shared by all heads


def pad_axis(x, axis, size, value):
  """Pad `x` at the end of `axis` up to `size` (no-op if already there)."""
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def initial_state(ex, cfg, q_shape, dv):
  """The online softmax before any key: `(m, l, acc)` of shapes
  `[Nq, B, K, G, Bq]`, `[Nq, B, K, G, Bq]`, `[Nq, B, K, G, Bq, Dv]` for
  q of shape `q_shape [B, K, G, Tq', Dh]` (block-major, as
  `forward_blocks` carries it)."""
  b, kh, g, tq_pad, _ = q_shape
  rows = (tq_pad // cfg.bq, b, kh, g, cfg.bq)
  if ex.sinks is None:
    m0, l0 = jnp.full(rows, -jnp.inf, jnp.float32), jnp.zeros(rows)
  else:
    # The sink is a column with logit `sink` and no value: start the
    # running max there, with its exp(0) = 1 already in the row sum.
    m0, l0 = jnp.broadcast_to(ex.sinks, rows), jnp.ones(rows)
  return (m0, l0.astype(jnp.float32),
          jnp.zeros(rows + (dv,), jnp.float32))


def _online_step(qb, k, v, mask, bias, ex, qs, ks, cfg, full, carry):
  """The online softmax's `carry` (m, l, acc of the cfg.bq query rows at
  qs: `[B,K,G,Bq]`, `[B,K,G,Bq]`, `[B,K,G,Bq,Dv]`) after the cfg.bk keys
  at ks; qb `[B,K,G,Bq,Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]`."""
  kb = lax.dynamic_slice_in_dim(k, ks, cfg.bk, axis=2)  # [B,K,Bk,Dh]
  vb = lax.dynamic_slice_in_dim(v, ks, cfg.bk, axis=2)  # [B,K,Bk,Dv]
  s, _ = block_scores(qb, kb, mask, bias, ex, qs, ks, cfg, full)
  return _accumulate(s, vb, carry)


def _accumulate(s, vb, carry):
  """The online softmax's `carry` after one block of float32 scores
  `s [B,K,G,Bq,Bk]` (-inf where forbidden) with values `vb [B,K,Bk,Dv]`."""
  m, l, acc = carry
  m_new = jnp.maximum(m, jnp.max(s, axis=-1))
  # Rows that have seen no allowed key yet have m = -inf; shifting
  # them by 0 keeps exp() at exactly 0 instead of exp(-inf + inf).
  shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
  p = jnp.exp(s - shift[..., None])
  rescale = jnp.exp(m - shift)  # old rows' correction factor
  l = rescale * l + jnp.sum(p, axis=-1)
  acc = rescale[..., None] * acc + precision.einsum(
      "bkgqs,bksd->bkgqd", p.astype(vb.dtype), vb,
      preferred_element_type=jnp.float32)
  return m_new, l, acc


def forward_blocks(q, k, v, mask, bias, ex, cfg, state):
  """Visit the key blocks of k, v from the online-softmax `state`.

  q `[B,K,G,Tq',Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]`; `state` and the
  result are `(m, l, acc)` as `initial_state` makes them. The keys of one
  call may be any slice of the sequence (`ex.k_start`): calling this on
  slice after slice gives the same state as one call on all of them, which
  is how context parallelism merges the slices that reach a device.
  """
  nk = k.shape[2] // cfg.bk

  def query_block(args):
    i, m, l, acc = args
    qs = i * cfg.bq
    qb = lax.dynamic_slice_in_dim(q, qs, cfg.bq, axis=3)  # [B,K,G,Bq,Dh]

    def key_block(j, full, carry):
      ks = j * cfg.bk
      return visit_block(ex, qs, ks, cfg, full_or_not(
          lambda c, full: _online_step(qb, k, v, mask, bias, ex, qs, ks, cfg,
                                       full, c), full), carry)

    return key_blocks(i, nk, ex, cfg, key_block, (m, l, acc))

  nq = state[0].shape[0]
  return lax.map(query_block, (jnp.arange(nq), *state))


def span_blocks(q, k, v, mask, bias, ex, cfg):
  """`forward_blocks` from the start on the spans of a banded block mask
  (`flash_visit.span_plan`): query block i against the cfg.span_len key
  blocks from `ex.span_first[i]` in one online-softmax step, masked to
  its listed blocks (`ex.span_keep`), cfg.span_group query blocks run
  together (a vmap). Every score rule applies as in the block walk; the
  one difference is that a block the mask calls full still gets the
  mask_mod (exact for the rule the mask was built from)."""
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
    return _accumulate(jnp.where(keep, s, -jnp.inf), vb,
                       tuple(x[0] for x in start))

  by_step = lambda x: x.reshape(nq // group, group, *x.shape[1:])
  out = lax.map(lambda xs: jax.vmap(one)(*xs), tuple(map(by_step, (
      jnp.arange(nq), ex.span_first, ex.span_keep))))
  return tuple(x.reshape(nq, *x.shape[2:]) for x in out)


def finish(state, dtype):
  """`(m, l, acc)` -> out `[B, K, G, Tq', Dv]` in `dtype`, lse
  `[B, K, G, Tq']` float32 (-inf on rows that saw no allowed key)."""
  m, l, acc = state
  # Empty rows have l = 0 and acc = 0: output 0, the reference's policy.
  out = (acc / jnp.where(l > 0, l, 1.0)[..., None]).astype(dtype)
  lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
  nq, b, kh, g, bq, dv = out.shape
  out = jnp.moveaxis(out, 0, 3).reshape(b, kh, g, nq * bq, dv)
  return out, jnp.moveaxis(lse, 0, 3).reshape(b, kh, g, nq * bq)


def _forward(q, k, v, mask, bias, ex, cfg):
  """q `[B,K,G,Tq',Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]` -> out, lse."""
  if cfg.span_len:
    return finish(span_blocks(q, k, v, mask, bias, ex, cfg), v.dtype)
  state = initial_state(ex, cfg, q.shape, v.shape[-1])
  return finish(forward_blocks(q, k, v, mask, bias, ex, cfg, state),
                v.dtype)


def _backward_block(block):
  """The backward's block length for a forward block: `BACKWARD_BLOCK`
  where it divides the forward block (the arrays are padded to whole
  forward blocks), else the forward block itself."""
  return BACKWARD_BLOCK if block % BACKWARD_BLOCK == 0 else block


def _backward(cfg, residuals, d_out):
  """Recompute each block's probabilities from lse; accumulate in float32."""
  cfg = backward_cfg(cfg)
  q, k, v, mask, bias, ex, out, lse = residuals
  delta, lse = row_terms(out, lse, d_out)
  dq, dk, dv, dbias, dslopes, dconsts = backward_walk(
      cfg, q, k, v, mask, bias, ex, lse, delta, d_out,
      zero_grads(q, k, v, bias, ex),
      tuple(jnp.zeros_like(c) for c in ex.score_consts))
  dbias = None if bias is None else dbias.astype(bias.dtype)
  dsinks = None if ex.sinks is None else sink_grad(ex.sinks, lse, delta)
  # Masks, positions, segment ids, indices, the mask rule's arrays and the
  # block lists are not differentiable (None: zero).
  d_ex = _Extras(q_pos=None, q_seg=None, k_seg=None, slopes=dslopes,
                 sinks=dsinks, score_consts=dconsts,
                 fixed_consts=jax.tree.map(lambda _: None, ex.fixed_consts))
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None,
          dbias, d_ex)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, mask, bias, ex, cfg):
  return _forward(q, k, v, mask, bias, ex, cfg)[0]


def _flash_fwd(q, k, v, mask, bias, ex, cfg):
  out, lse = _forward(q, k, v, mask, bias, ex, cfg)
  # Residuals: the inputs and O(T) statistics, never a [Tq, Tk] array.
  return out, (q, k, v, mask, bias, ex, out, lse)


_flash.defvjp(_flash_fwd, _backward)


def _flash_by_head(q, k, v, mask, bias, ex, cfg):
  """`_flash` for one (batch, kv head) at a time, in sequence (`lax.map`).

  Each array is cut to its `[1, 1, ...]` slice where it has the batch or
  kv-head axis at full size; where it broadcasts it passes whole, and the
  map's derivative sums its gradient over the slices.
  """
  b, kh = q.shape[:2]
  if b * kh == 1:
    return _flash(q, k, v, mask, bias, ex, cfg)

  def cut(x, i, j, head_axis=True):
    if x is None:
      return None
    if b > 1 and x.shape[0] == b:
      x = lax.dynamic_slice_in_dim(x, i, 1, axis=0)
    if head_axis and kh > 1 and x.shape[1] == kh:
      x = lax.dynamic_slice_in_dim(x, j, 1, axis=1)
    return x

  def one(index):
    i, j = index // kh, index % kh
    ex_ij = ex._replace(
        q_pos=cut(ex.q_pos, i, j, head_axis=False),
        q_seg=cut(ex.q_seg, i, j, head_axis=False),
        k_seg=cut(ex.k_seg, i, j, head_axis=False),
        slopes=cut(ex.slopes, i, j), sinks=cut(ex.sinks, i, j),
        b_ids=cut(ex.b_ids, i, j), h_ids=cut(ex.h_ids, i, j),
        kv_num=cut(ex.kv_num, i, j), kv_idx=cut(ex.kv_idx, i, j),
        kv_full=cut(ex.kv_full, i, j))
    out = _flash(cut(q, i, j), cut(k, i, j), cut(v, i, j), cut(mask, i, j),
                 cut(bias, i, j), ex_ij, cfg)
    return out[0, 0]  # [G, Tq', Dv]

  out = lax.map(one, jnp.arange(b * kh))  # [B*K, G, Tq', Dv]
  return out.reshape(b, kh, *out.shape[1:])


def prescaled(dtype) -> bool:
  """In float32 the scale is folded into q once ([Tq, Dh]) instead of into
  every score block ([Tq, Tk], forward and backward again): 7% less CPU
  time for forward+backward at the standard shape. Lower precisions keep
  the product in float32 on the scores, where it does not round q."""
  return dtype == jnp.float32


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


def span_walk(backend: str, bm, batch_heads: int, head_loop=None,
              lists=None):
  """The span walk (`flash_visit.Span`) the kernel takes for block mask
  `bm` on a call of `batch_heads` = B x H, or None (the block walk): on
  CPU, with the heads batched (`head_loop` False; None: by
  `runs_head_loop`) and a banded mask (`flash_visit.span_plan`; its
  docstring has the measurements). Elsewhere the batched block walk
  already keeps the device busy on small blocks. `lists`: the call's
  `(num, idx)`, cut by its built-in rules (None: the mask's own)."""
  if head_loop is None:
    head_loop = runs_head_loop(backend, bm, batch_heads)
  if backend != "cpu" or head_loop:
    return None
  if lists is None:
    lists = bm.kernel_lists(1, per_head=False)[:2]
  return span_plan(*lists, -(-bm.kv_len // bm.kv_block), bm.q_block,
                   bm.kv_block, batch_heads)


def default_blocks(head_loop: bool) -> tuple[int, int]:
  """`(block_q, block_k)` the kernel takes when none is given: one head at
  a time (CPU) `HEAD_LOOP_BLOCK`, batched `DEFAULT_BLOCK_Q/K`."""
  if head_loop:
    return HEAD_LOOP_BLOCK, HEAD_LOOP_BLOCK
  return DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K


def block_config(dtype, head_dim, rules, is_causal, tq, tk, block_q, block_k,
                 *, halve_backward=True) -> BlockConfig:
  """The kernel's static facts for queries of length `tq` against keys of
  length `tk` (one call's, which may be one device's slice), on blocks of
  at most `block_q` x `block_k`. `halve_backward`: the batched kernel's
  backward runs on halved blocks (BACKWARD_BLOCK); one head at a time it
  keeps the forward's. With `prescaled(dtype)` the caller multiplies q by
  the scale. Only the static rules (window, soft cap, scale) are kept;
  user rules are `flash_attention`'s to add (the context-parallel callers
  refuse them: their records, `parallel.context.RULES`)."""
  bq, bk = min(block_q, tq), min(block_k, tk)
  tk_pad = -(-tk // bk) * bk
  return _Config(tq=tq, tk=tk, bq=bq, bk=bk,
                 bwd_bq=_backward_block(bq) if halve_backward else bq,
                 bwd_bk=_backward_block(bk) if halve_backward else bk,
                 padded_keys=tk_pad != tk,
                 is_causal=bool(is_causal),
                 rules=score_rules.builtin_static(rules),
                 scale=(1.0 if prescaled(dtype)
                        else score_rules.scale_of(rules, head_dim)))


def flash_attention(q, k, v, *, mask=None, bias=None, is_causal=False,
                    rules=score_rules.NO_RULES, block_q=None, block_k=None,
                    head_loop=None, spans=None):
  """Blockwise attention; same contract as `attend` but returns only `out`.

  Args:
    q: `[B, Tq, H, Dh]`; k: `[B, Tk, K, Dh]`; v: `[B, Tk, K, Dv]`, with K
      dividing H. Validate with `attention.check_attend_inputs` (or call
      `attend(..., implementation="flash")`, which does).
    mask: bool broadcastable to `[B, H, Tq, Tk]`, True = may attend.
    bias: float broadcastable to `[B, H, Tq, Tk]` (differentiable).
    is_causal: bottom-right aligned causal rule; hidden key blocks are skipped.
    rules: `score_rules.ScoreRules`; windows, segment ids and positions
      are applied per block from their vectors (no `[Tq, Tk]` array), key
      blocks outside a window are never visited and blocks with no shared
      segment are skipped. User rules (`score_mod`, `mask_mod`) are
      evaluated per block, with the arrays they close over hoisted into
      the custom VJP's arguments (`flash_rules.user_rules`); with
      `rules.block_mask` only its non-empty blocks are visited, on its
      block lengths, and its full blocks skip the mask_mod work.
    block_q, block_k: block lengths (clipped to the sequence lengths). Lengths
      that are not multiples are padded internally and the padding masked.
      None: `HEAD_LOOP_BLOCK` with `head_loop`, else `DEFAULT_BLOCK_Q/K`
      forward and `BACKWARD_BLOCK` backward (where it divides them).
    head_loop: run one (batch, kv head) at a time; None: `runs_head_loop`
      (on CPU, unless a small batch of heads shares one block mask).
    spans: walk the block mask as spans (`flash_visit.span_plan`); None:
      where `span_walk` takes them (CPU, heads batched, a banded mask);
      False: never (the block walk); True: always, or a ValueError where
      the mask or the call allows none.

  Returns:
    out `[B, Tq, H, Dv]` in v's dtype.
  """
  for name, val in (("block_q", block_q), ("block_k", block_k)):
    if val is not None and (not isinstance(val, int) or val < 1):
      raise ValueError(f"flash_attention: `{name}` must be a positive int "
                       f"or None, got {val!r}")
  bm = rules.block_mask
  if spans is not None and (not isinstance(spans, bool) or bm is None):
    raise ValueError("flash_attention: `spans` must be None, or a bool "
                     f"with a block mask, got {spans!r}"
                     + ("" if bm is not None else " without one"))
  if head_loop is None:
    head_loop = runs_head_loop(jax.default_backend(), bm,
                               q.shape[0] * q.shape[2])
  default = default_blocks(head_loop)
  if bm is not None:  # the kernel's blocks are the block mask's
    for name, val, want, length in (
        ("block_q", block_q, bm.q_block, q.shape[1]),
        ("block_k", block_k, bm.kv_block, k.shape[1])):
      if val is not None and min(val, length) != want:
        raise ValueError(f"flash_attention: `{name}`={val} differs from "
                         f"the block mask's {want}")
    block_q, block_k = bm.q_block, bm.kv_block
  block_q = default[0] if block_q is None else block_q
  block_k = default[1] if block_k is None else block_k
  b, tq, h, dh = q.shape
  tk, kh, dv = k.shape[1], k.shape[2], v.shape[3]
  g = h // kh
  cfg = block_config(q.dtype, dh, rules, is_causal, tq, tk, block_q,
                     block_k, halve_backward=not head_loop and bm is None)
  score_fn, mask_fn, score_consts, fixed_consts = user_rules(rules)
  cfg = cfg._replace(score_mod=score_fn, mask_mod=mask_fn,
                     block_masked=bm is not None)
  tq_pad, tk_pad = -(-tq // cfg.bq) * cfg.bq, -(-tk // cfg.bk) * cfg.bk
  if prescaled(q.dtype):
    q = q * score_rules.scale_of(rules, dh)
  # Head-major layout once, so that every block is a contiguous slice of T
  # and each block matmul is batched over (B, K) with G*Bq rows.
  qt = q.reshape(b, tq, kh, g, dh).transpose(0, 2, 3, 1, 4)  # [B,K,G,Tq,Dh]
  kt = k.transpose(0, 2, 1, 3)  # [B, K, Tk, Dh]
  vt = v.transpose(0, 2, 1, 3)  # [B, K, Tk, Dv]
  qt = pad_axis(qt, 3, tq_pad, 0)
  kt, vt = pad_axis(kt, 2, tk_pad, 0), pad_axis(vt, 2, tk_pad, 0)
  mask, bias = _to_5d(mask, h, kh), _to_5d(bias, h, kh)
  # Padding rows/keys of a full-size mask or bias; padded keys are also
  # excluded by position inside the kernel, so the fill values are moot.
  if mask is not None:
    mask = pad_axis(mask, 3, tq_pad, True) if mask.shape[3] != 1 else mask
    mask = pad_axis(mask, 4, tk_pad, False) if mask.shape[4] != 1 else mask
  if bias is not None:
    bias = pad_axis(bias, 3, tq_pad, 0) if bias.shape[3] != 1 else bias
    bias = pad_axis(bias, 4, tk_pad, 0) if bias.shape[4] != 1 else bias
  # Padded query rows repeat the last real row's position and segment (their
  # output is dropped; the repeat keeps the block ranges tight).
  edge = lambda x, size: None if x is None else jnp.pad(
      jnp.asarray(x, jnp.int32), ((0, 0), (0, size - x.shape[1])),
      mode="edge")
  per_head = lambda x, tail: None if x is None else jnp.asarray(
      x, jnp.float32).reshape((1, kh, g) + tail)
  ex = _Extras(q_pos=edge(rules.q_positions, tq_pad),
               q_seg=edge(rules.q_segment_ids, tq_pad),
               k_seg=edge(rules.kv_segment_ids, tk_pad),
               slopes=per_head(rules.alibi_slopes, (1, 1)),
               sinks=per_head(rules.sinks, (1,)),
               b_ids=jnp.arange(b, dtype=jnp.int32).reshape(b, 1, 1, 1, 1),
               h_ids=jnp.arange(h, dtype=jnp.int32).reshape(1, kh, g, 1, 1),
               score_consts=score_consts, fixed_consts=fixed_consts)
  if bm is not None:
    num, idx, full = bm.kernel_lists(
        kh, per_head=head_loop, visible=lambda p: visited_blocks(
            cfg._replace(bq=cfg.bq // p, bk=cfg.bk // p), tq_pad // cfg.bq * p,
            tk_pad // cfg.bk * p))
    ex = ex._replace(kv_num=jnp.asarray(num), kv_idx=jnp.asarray(idx),
                     kv_full=jnp.asarray(full))
    # spans=True takes them on any backend: ask as the CPU would.
    span = None if spans is False else span_walk(
        "cpu" if spans else jax.default_backend(), bm, b * h, head_loop,
        (num, idx))
    if spans and span is None:
      raise ValueError("flash_attention: `spans`=True, but this block mask "
                       "is not banded within flash_visit.SPAN_SLACK or "
                       "the heads run one at a time (`head_loop`)")
    if span is not None:
      cfg = cfg._replace(span_len=span.length, span_group=span.group)
      ex = ex._replace(
          span_first=jnp.asarray(span.first * cfg.bk),
          span_keep=jnp.asarray(np.repeat(span.listed, cfg.bk, axis=1)))
  kernel = _flash_by_head if head_loop else _flash
  out = kernel(qt, kt, vt, mask, bias, ex, cfg)  # [B, K, G, Tq', Dv]
  out = out[:, :, :, :tq].transpose(0, 3, 1, 2, 4)  # [B, Tq, K, G, Dv]
  return out.reshape(b, tq, h, dv)


def attend_flash(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                 rules=score_rules.NO_RULES):
  """The path "flash": the kernel's output, weights None."""
  del dropout_rate, keep  # keep is None: the record refuses dropout
  return flash_attention(q, k, v, mask=mask, bias=bias,
                         is_causal=is_causal, rules=rules), None


FLASH = attention_path.AttentionPath(
    name="flash", fn=attend_flash,
    computes="blockwise online softmax: O(T) memory, any shape, mask, bias "
    "and GQA")
