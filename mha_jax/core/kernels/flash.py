"""Blockwise ("flash") attention: the entry point and the custom VJP.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads, G = H // K query heads per kv head, Dh query/key width,
Dv value width, Bq / Bk query / key block lengths.

The kernel is in three parts. The algorithm, `flash_kernel.py`: the
online softmax over key blocks, forward and backward, with the score
rules applied per block (read it first). Which key blocks a query block
visits, `flash_visit.py`. The schedule, `flash_schedule.py`: the block
lengths, whether the heads run one at a time and whether a banded block
mask is walked as spans, each chosen by backend and size, none changing
a result. This module lays the inputs out for them (head-major, padded
to whole blocks, the user rules' arrays hoisted by `flash_rules.py`),
wires the forward and backward into a `jax.custom_vjp` that saves only
`out` and `lse`, and is the entry point (`flash_attention`, the path
record `FLASH`).

On CPU the (batch, kv head) pairs run one after another (`head_loop`,
`_flash_by_head`), so that each block product is a plain 2-d matmul,
which XLA's CPU backend runs several times faster than a batch of small
ones; under a block mask shared by every row and head they run batched
where few enough (`runs_head_loop`), and a banded one is walked as
spans (`span_walk`).

Semantics match the reference path (`reference.VMAP`): boolean masks are
-inf before the softmax, `is_causal` is bottom-right aligned like
`masks.causal_mask` (and key blocks it hides entirely are never visited), a
query row with no allowed key gives output 0 with finite gradients, GQA reads
each kv head once for its G query heads, and scores, softmax and all
accumulators are float32 whatever the input dtype. It cannot return weights.
The schedule's names other modules use are importable from here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from mha_jax.core import attention_path
from mha_jax.core import score_rules
from mha_jax.core.kernels.flash_config import Extras
from mha_jax.core.kernels.flash_kernel import backward
from mha_jax.core.kernels.flash_kernel import finish
from mha_jax.core.kernels.flash_kernel import forward_blocks
from mha_jax.core.kernels.flash_kernel import initial_state
from mha_jax.core.kernels.flash_rules import user_rules
from mha_jax.core.kernels.flash_schedule import block_config
from mha_jax.core.kernels.flash_schedule import default_blocks
from mha_jax.core.kernels.flash_schedule import prescaled
from mha_jax.core.kernels.flash_schedule import runs_head_loop
from mha_jax.core.kernels.flash_schedule import span_blocks
from mha_jax.core.kernels.flash_schedule import span_walk
from mha_jax.core.kernels.flash_visit import visited_blocks
# Re-exported: the names the tests, the benchmarks and the block masks
# read from the kernel's entry module.
from mha_jax.core.kernels.flash_config import BlockConfig  # noqa: F401
from mha_jax.core.kernels.flash_schedule import (  # noqa: F401
    BACKWARD_BLOCK, BATCHED_BLOCK_BYTES, DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q,
    HEAD_LOOP_BLOCK)
from mha_jax.core.kernels.flash_visit import kv_block_range  # noqa: F401


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


def _forward(q, k, v, mask, bias, ex, cfg):
  """q `[B,K,G,Tq',Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]` -> out, lse."""
  if cfg.span_len:
    return finish(span_blocks(q, k, v, mask, bias, ex, cfg), v.dtype)
  state = initial_state(ex, cfg, q.shape, v.shape[-1])
  return finish(forward_blocks(q, k, v, mask, bias, ex, cfg, state),
                v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, mask, bias, ex, cfg):
  return _forward(q, k, v, mask, bias, ex, cfg)[0]


def _flash_fwd(q, k, v, mask, bias, ex, cfg):
  out, lse = _forward(q, k, v, mask, bias, ex, cfg)
  # Residuals: the inputs and O(T) statistics, never a [Tq, Tk] array.
  return out, (q, k, v, mask, bias, ex, out, lse)


_flash.defvjp(_flash_fwd, backward)


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
    spans: walk the block mask as spans (`flash_schedule.span_plan`); None:
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
  ex = Extras(q_pos=edge(rules.q_positions, tq_pad),
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
                       "is not banded within flash_schedule.SPAN_SLACK or "
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
