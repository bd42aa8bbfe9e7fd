"""The Pallas GPU kernel's bodies: forward, dq and dk/dv (FlashAttention-2).

Shape letters: B batch, H query heads, K key/value heads, G = H // K,
Tq' / Tk' the query / key lengths padded to whole blocks, Dh query/key
width, Dv value width, Bq / Bk query / key block lengths, Nq / Nk block
counts.

Each body is one program of a `pl.pallas_call` grid and sees its refs
already cut by the BlockSpecs of `pallas_gpu.py`:

  forward  grid (Nq, B, H): q `[Bq, Dh]` of query head h, the whole k, v
           `[Tk', Dh]`, `[Tk', Dv]` of kv head h // G (GQA by indexing,
           never by repeating k/v); writes out `[Bq, Dv]`, lse `[Bq]`.
  dq       grid (Nq, B, H): the same walk; writes dq `[Bq, Dh]` and this
           program's share of the gradients to ALiBi slopes and the
           score_mod's float arrays (summed over programs outside).
  dk/dv    grid (Nk, B, K): k, v `[Bk, D]`; for each of the G query heads,
           the query blocks that visit this key block; writes dk, dv.

The key blocks a query block visits come as lists (`plan` in
`pallas_gpu.py`): its partial blocks, on which the user's mask_mod is
evaluated, and its full ones, on which it is not; the built-in rules
(causal, window, segments, the padded keys) are applied on every block,
and a block on no list is never loaded; with packed segments, a block
whose queries and keys share no segment is skipped too (`_walk`). Two loops instead of one loop
with a branch per block: Triton lowers `lax.fori_loop` with a traced
bound, and the full blocks' body then has no mask_mod at all.

The score of one block is `logits`: `score_rules.allowed` and
`score_rules.scores`, the functions every other path calls, on the
block's positions from `lax.broadcasted_iota`, so a rule is written
once. The backward differentiates `logits` with `jax.vjp` inside the
body: the soft cap, ALiBi's slopes and the score_mod's tables all get
their gradients from that one derivative. Scores, softmax statistics and
accumulators are float32; the matmuls follow `precision.dot_precision`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.core import user_rules
from mha_jax.core.kernels import pallas_gpu_tables as tables


class Spec(NamedTuple):
  """The static facts of one call the bodies read (hashable)."""
  tq: int  # true lengths
  tk: int
  bq: int  # block lengths
  bk: int
  groups: int  # G
  is_causal: bool
  rules: score_rules.ScoreRules  # its static built-ins (window, soft cap)
  scale: float
  default_q_pos: bool  # queries at Tk - Tq + i (no q_positions)
  padded_keys: bool
  score_mod: Callable | None  # hoisted: takes its arrays last
  mask_mod: Callable | None
  n_float: int  # score_mod's float arrays (differentiated)
  n_mask: int  # mask_mod's arrays (the last of the hoisted ones)
  const_shapes: tuple  # original shapes of every hoisted array


def _dot(a, b, dims):
  """float32 `a . b` contracting `dims`, at the project's precision. A
  float32 operand (p, ds) meets a bf16/f16 one (v, k, q) in the input
  dtype, as in FlashAttention-2 and FlexAttention: Triton's dot takes
  one dtype, and the float32 accumulation keeps the sum exact."""
  if a.dtype != b.dtype:
    low = a.dtype if a.dtype != jnp.float32 else b.dtype
    a, b = a.astype(low), b.astype(low)
  return lax.dot_general(a, b, (dims, ((), ())),
                         precision=precision.dot_precision(a, b),
                         preferred_element_type=jnp.float32)


def _iota(n):
  return lax.broadcasted_iota(jnp.int32, (n,), 0)


def q_positions(refs, spec, b, qs):
  """int32 `[Bq]` positions of the queries of the block at `qs`."""
  if spec.default_q_pos:
    return qs + _iota(spec.bq) + (spec.tk - spec.tq)
  return refs["q_pos"][pl_ds(qs, spec.bq)]


def pl_ds(start, size):
  # Imported here: the module must import on machines without Pallas GPU.
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.ds(start, size)


def consts_of(refs, spec):
  """The hoisted arrays of the user rules: `(floats, score_mod's others,
  mask_mod's)`, the floats loaded whole in their shapes, the others left
  in memory as `pallas_gpu_tables.Table`s (read per element)."""
  loaded = [r[...].reshape(s) if i < spec.n_float else tables.Table(r, s)
            for i, (r, s) in enumerate(zip(refs["consts"],
                                           spec.const_shapes))]
  n_score_other = len(spec.const_shapes) - spec.n_float - spec.n_mask
  floats = tuple(loaded[:spec.n_float])
  score_other = tuple(loaded[spec.n_float:spec.n_float + n_score_other])
  mask_other = tuple(loaded[spec.n_float + n_score_other:])
  return floats, score_other, mask_other


def logits(qk, slope, floats, *, refs, spec, b, h, qs, ks, q_pos, full,
           fixed):
  """float32 softmax input `[Bq, Bk]` of one block from `qk = q . k`
  (unscaled), and whether each key is allowed: `(s, ok)`. `s` has the
  scale, ALiBi, soft cap and score_mod, not the masks (the backward
  differentiates it alone: the masks are constants of the block); `ok`
  the built-in rules and, on a partial block (`full` False), mask_mod.
  `slope`: head h's ALiBi slope (None: off); `floats`: score_mod's float
  arrays (the differentiated ones); `fixed`: (score_mod's other arrays,
  mask_mod's)."""
  k_pos = ks + _iota(spec.bk)
  # The user rules on the block's grid, their integer arrays read per
  # element from memory (`pallas_gpu_tables`): `user_rules.user_allowed`
  # and `user_scores`, as on every path.
  user_ok = None
  if spec.mask_mod is not None and not full:
    user_ok = tables.on_grid(lambda ts, qp, kp: user_rules.user_allowed(
        score_rules.User(b, h, None, lambda *a: spec.mask_mod(*a, *ts)),
        qp, kp, 2), fixed[1], q_pos, k_pos)
  seg = "q_seg" in refs
  ok = score_rules.allowed(
      q_pos, k_pos, mask=user_ok, is_causal=spec.is_causal,
      rules=spec.rules,
      q_seg=refs["q_seg"][pl_ds(qs, spec.bq)] if seg else None,
      k_seg=refs["k_seg"][pl_ds(ks, spec.bk)] if seg else None,
      kv_len=spec.tk if spec.padded_keys else None)
  s, _ = score_rules.scores(qk, q_pos, k_pos, scale=spec.scale,
                            rules=spec.rules, slopes=slope)
  if spec.score_mod is not None:  # after the built-ins, as in `scores`
    s = tables.on_grid(lambda ts, s, qp, kp: user_rules.user_scores(
        score_rules.User(b, h, lambda *a: spec.score_mod(*a, *floats, *ts),
                         None), s, qp, kp), fixed[0], s, q_pos, k_pos)
  ok = jnp.ones(qk.shape, bool) if ok is None else ok
  return jnp.broadcast_to(s, qk.shape), jnp.broadcast_to(ok, qk.shape)


def masked(s, ok):
  """-inf where a key is not allowed: exp(-inf) is exactly 0."""
  return jnp.where(ok, s, -jnp.inf)


def _slope(refs, h):
  return refs["slopes"][h] if "slopes" in refs else None


def _segments_meet(refs, spec, qs, ks):
  """Whether the query block at qs and the key block at ks may share a
  packed segment: some id of one lies in the other's range (a sufficient
  test whatever the ids' order). True without segments."""
  if "q_seg" not in refs:
    return True
  q = refs["q_seg"][pl_ds(qs, spec.bq)]
  k = refs["k_seg"][pl_ds(ks, spec.bk)]
  return (jnp.min(q) <= jnp.max(k)) & (jnp.min(k) <= jnp.max(q))


def _walk(refs, spec, bi, ki, i, starts, body, carry):
  """`body(j, full, carry)` over the partial blocks of list row i, then
  over its full ones (lists of `pallas_gpu.plan`), skipping a block whose
  queries and keys share no segment: all its scores would be masked.
  `starts(j)`: the (query, key) offsets of the block visited as j."""
  def visit(j, full, c):
    meet = _segments_meet(refs, spec, *starts(j))
    if meet is True:
      return body(j, full, c)
    return lax.cond(meet, lambda c: body(j, full, c), lambda c: c, c)

  for full, num, idx in ((False, "part_num", "part_idx"),
                         (True, "full_num", "full_idx")):
    carry = lax.fori_loop(
        0, refs[num][bi, ki, i],
        lambda t, c, full=full, idx=idx: visit(refs[idx][bi, ki, i, t],
                                               full, c), carry)
  return carry


def forward_kernel(refs, out_ref, lse_ref, *, spec, rows, heads):
  """One query block of one head: the online softmax over its key blocks.
  `rows`, `heads`: B', K' of the block lists (1: shared)."""
  i, b, h = (jax.lax.convert_element_type(pl_program_id(a), jnp.int32)
             for a in range(3))
  bi, ki = (b if rows > 1 else 0), (h // spec.groups if heads > 1 else 0)
  qs = i * spec.bq
  qb = refs["q"][...]  # [Bq, Dh]
  q_pos = q_positions(refs, spec, b, qs)
  floats, *fixed = consts_of(refs, spec)
  slope = _slope(refs, h)

  def body(j, full, carry):
    m, l, acc = carry
    ks = j * spec.bk
    kb = refs["k"][pl_ds(ks, spec.bk), :]  # [Bk, Dh]
    vb = refs["v"][pl_ds(ks, spec.bk), :]  # [Bk, Dv]
    s = masked(*logits(_dot(qb, kb, ((1,), (1,))), slope, floats,
                       refs=refs, spec=spec, b=b, h=h, qs=qs, ks=ks,
                       q_pos=q_pos, full=full, fixed=fixed))
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    # A row that has seen no allowed key yet keeps m = -inf; shifting by
    # 0 keeps exp() at 0 instead of exp(-inf + inf) = NaN.
    shift = jnp.where(m_new > -jnp.inf, m_new, 0.0)
    p = jnp.exp(s - shift[:, None])
    rescale = jnp.exp(m - shift)
    return (m_new, rescale * l + jnp.sum(p, axis=1),
            rescale[:, None] * acc + _dot(p, vb,
                                          ((1,), (0,))))

  if "sinks" in refs:  # a column of logit sink and no value: exp(0) = 1
    m0 = jnp.full((spec.bq,), refs["sinks"][h], jnp.float32)
    l0 = jnp.ones((spec.bq,), jnp.float32)
  else:
    m0 = jnp.full((spec.bq,), -jnp.inf, jnp.float32)
    l0 = jnp.zeros((spec.bq,), jnp.float32)
  acc0 = jnp.zeros((spec.bq, out_ref.shape[-1]), jnp.float32)
  m, l, acc = _walk(refs, spec, bi, ki, i, lambda j: (qs, j * spec.bk),
                    body, (m0, l0, acc0))
  # A row with no allowed key has l = 0 and acc = 0: output 0 (the
  # project's empty-row policy), lse = -inf.
  seen = l > 0
  safe = jnp.where(seen, l, 1.0)
  out_ref[...] = (acc / safe[:, None]).astype(out_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(safe), -jnp.inf)


def pl_program_id(axis):
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.program_id(axis)


def _block_grads(qk, slope, floats, lse, delta, do, vb, **kw):
  """p `[Bq, Bk]` and the gradients of the loss to qk, the slope and the
  score_mod's float arrays for one block: the softmax's rule (ds = p (dp
  - delta)) pulled back through `logits`' scores by `jax.vjp`. ds is 0
  on a masked key (p is), so the mask needs no derivative."""
  s, pull, ok = jax.vjp(lambda qk, slope, floats: logits(
      qk, slope, floats, **kw), qk, slope, floats, has_aux=True)
  # lse is finite: exp(-inf) = 0 on masked keys and on empty rows.
  p = jnp.exp(masked(s, ok) - lse[:, None])
  dp = _dot(do, vb, ((1,), (1,)))  # [Bq, Bk]
  ds = p * (dp - delta[:, None])
  dqk, dslope, dfloats = pull(ds)
  return p, dqk, dslope, dfloats


def dq_kernel(refs, dq_ref, dslope_ref, dfloat_refs, *, spec, rows, heads):
  """dq of one query block of one head, and its share of d slope and of
  d (score_mod's float arrays)."""
  i, b, h = (jax.lax.convert_element_type(pl_program_id(a), jnp.int32)
             for a in range(3))
  bi, ki = (b if rows > 1 else 0), (h // spec.groups if heads > 1 else 0)
  qs = i * spec.bq
  qb, do = refs["q"][...], refs["do"][...]
  lse, delta = refs["lse"][...], refs["delta"][...]
  q_pos = q_positions(refs, spec, b, qs)
  floats, *fixed = consts_of(refs, spec)
  slope = _slope(refs, h)
  zero_slope = None if slope is None else jnp.zeros((), jnp.float32)

  def body(j, full, carry):
    dq, dslope, dfl = carry
    ks = j * spec.bk
    kb = refs["k"][pl_ds(ks, spec.bk), :]
    vb = refs["v"][pl_ds(ks, spec.bk), :]
    _, dqk, ds_, dfl_j = _block_grads(
        _dot(qb, kb, ((1,), (1,))), slope, floats, lse, delta, do, vb,
        refs=refs, spec=spec, b=b, h=h, qs=qs, ks=ks, q_pos=q_pos,
        full=full, fixed=fixed)
    dq = dq + _dot(dqk, kb, ((1,), (0,)))
    dslope = None if dslope is None else dslope + ds_
    return dq, dslope, tuple(a + x for a, x in zip(dfl, dfl_j))

  init = (jnp.zeros(qb.shape, jnp.float32), zero_slope,
          tuple(jnp.zeros_like(f) for f in floats))
  dq, dslope, dfl = _walk(refs, spec, bi, ki, i,
                          lambda j: (qs, j * spec.bk), body, init)
  dq_ref[...] = dq.astype(dq_ref.dtype)
  if dslope_ref is not None:
    dslope_ref[...] = jnp.reshape(dslope, dslope_ref.shape)
  for ref, d in zip(dfloat_refs, dfl):
    ref[...] = jnp.reshape(d, ref.shape)


def dkv_kernel(refs, dk_ref, dv_ref, *, spec, rows, heads):
  """dk, dv of one key block of one kv head: the G query heads that read
  it, each over the query blocks that visit this key block (the
  transposed lists of `pallas_gpu.plan`)."""
  j, b, kh = (jax.lax.convert_element_type(pl_program_id(a), jnp.int32)
              for a in range(3))
  bi, ki = (b if rows > 1 else 0), (kh if heads > 1 else 0)
  ks = j * spec.bk
  kb, vb = refs["k"][...], refs["v"][...]  # [Bk, Dh], [Bk, Dv]
  floats, *fixed = consts_of(refs, spec)

  def head(g, carry):
    h = kh * spec.groups + g
    slope = _slope(refs, h)

    def body(i, full, carry):
      dk, dv = carry
      qs = i * spec.bq
      qb = refs["q"][g, pl_ds(qs, spec.bq), :]  # [Bq, Dh]
      do = refs["do"][g, pl_ds(qs, spec.bq), :]  # [Bq, Dv]
      lse = refs["lse"][g, pl_ds(qs, spec.bq)]
      delta = refs["delta"][g, pl_ds(qs, spec.bq)]
      p, dqk, _, _ = _block_grads(
          _dot(qb, kb, ((1,), (1,))), slope, floats, lse, delta, do, vb,
          refs=refs, spec=spec, b=b, h=h, qs=qs, ks=ks,
          q_pos=q_positions(refs, spec, b, qs), full=full, fixed=fixed)
      return (dk + _dot(dqk, qb, ((0,), (0,))),
              dv + _dot(p, do, ((0,), (0,))))

    return _walk(_transposed(refs), spec, bi, ki, j,
                 lambda i: (i * spec.bq, ks), body, carry)

  init = (jnp.zeros(kb.shape, jnp.float32),
          jnp.zeros(vb.shape, jnp.float32))
  dk, dv = lax.fori_loop(0, spec.groups, head, init)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _transposed(refs):
  """The refs with the key block -> query blocks lists in the places the
  walk reads."""
  return {**refs, "part_num": refs["t_part_num"],
          "part_idx": refs["t_part_idx"], "full_num": refs["t_full_num"],
          "full_idx": refs["t_full_idx"]}
