"""Blockwise ("flash") attention, the algorithm: an online softmax over
key/value blocks, forward and backward, under the score rules.

Shape letters: B batch, Tq / Tk query / key length, K key/value heads,
G query heads per kv head, Tq' / Tk' the lengths padded to whole blocks,
Dh query/key width, Dv value width, Bq / Bk query / key block lengths,
Nq / Nk block counts.

The reference paths build the whole score matrix `[B, H, Tq, Tk]`: the
source's "O(h n^2)" memory. Here the keys are visited one block at a
time while a running row maximum `m`, row sum `l` and unnormalised
output `acc` are kept per query (the online softmax):

    m' = max(m, rowmax(S_j))       p = exp(S_j - m')     a = exp(m - m')
    l' = a l + rowsum(p)           acc' = a acc + p V_j
    out = acc / l                  lse = m + log(l)

so live memory is O(Bq Bk) per head and O(T) overall. The backward pass
keeps only `out` and `lse`, recomputes each block's probabilities as
exp(S - lse) and accumulates the gradients of q, k, v, a bias, ALiBi
slopes, sinks and a score_mod's tables in float32: O(T) memory for
training too.

Read top to bottom: one block's scores under the score rules
(`block_scores`: the rules per block, from the positions
`flash_visit.py` gives); the forward (`initial_state`, `accumulate`,
`forward_blocks`, `finish`); the backward (`row_terms`,
`backward_walk`, `backward`). What a call is given, its block
configuration (`BlockConfig`) and per-call arrays (`Extras`), is
`flash_config.py`; cutting a block out of a broadcast mask or bias and
summing a gradient back to it, `flash_broadcast.py`. Which key blocks a
query block visits is `flash_visit.py`; how the blocks are chosen and
walked on each backend (block lengths, one head at a time, spans) is
`flash_schedule.py`; the custom VJP and the entry point are `flash.py`.

Semantics match the reference path: boolean masks are -inf before the
softmax, `is_causal` is bottom-right aligned, a query row with no
allowed key gives output 0 with finite gradients, GQA reads each kv
head once for its G query heads, and scores, softmax and all
accumulators are float32 whatever the input dtype.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.core.kernels.flash_broadcast import add_bias_block
from mha_jax.core.kernels.flash_broadcast import reduce_to
from mha_jax.core.kernels.flash_broadcast import slice_block
from mha_jax.core.kernels.flash_config import backward_cfg
from mha_jax.core.kernels.flash_config import Extras
from mha_jax.core.kernels.flash_visit import block_k_pos
from mha_jax.core.kernels.flash_visit import block_q_pos
from mha_jax.core.kernels.flash_visit import full_or_not
from mha_jax.core.kernels.flash_visit import key_blocks
from mha_jax.core.kernels.flash_visit import key_start
from mha_jax.core.kernels.flash_visit import visit_block


# One block's scores under the score rules.


def _user(ex, cfg, full=False, with_score=True):
  """The block's `score_rules.User` (None without user rules): the
  converted rules bound to their arrays. `full`: a block the block mask
  found full, whose mask_mod work is skipped."""
  bind = lambda f, consts: None if f is None else (
      lambda *a: f(*a, *consts))
  score = (bind(cfg.score_mod, ex.score_consts + ex.fixed_consts[0])
           if with_score else None)
  keep = None if full is True else bind(cfg.mask_mod, ex.fixed_consts[1])
  if score is None and keep is None:
    return None
  return score_rules.User(ex.b_ids, ex.h_ids, score, keep)


def block_scores(qb, kb, mask, bias, ex, qs, ks, cfg, full=False,
                 with_score=True):
  """float32 scores of one block `[B, K, G, Bq, Bk]`, -inf where forbidden,
  and the soft cap's derivative (None without one): `score_rules.scores`
  on the block. `full`: skip mask_mod (the block mask says it allows
  every key of the block); `with_score=False`: the scores before
  score_mod, not masked (the backward differentiates score_mod itself),
  returned with the mask."""
  qk = precision.einsum("bkgqd,bksd->bkgqs", qb, kb,
                        preferred_element_type=jnp.float32)
  q_pos = block_q_pos(ex, qs, cfg)
  k_pos = block_k_pos(ex, ks, cfg)
  cut_q = lambda x: lax.dynamic_slice_in_dim(x, qs, cfg.bq, axis=1)[
      :, None, None]
  cut_k = lambda x: lax.dynamic_slice_in_dim(x, ks, cfg.bk, axis=1)[
      :, None, None]
  segs = ex.q_seg is not None
  user = _user(ex, cfg, full, with_score)
  ok = score_rules.allowed(
      q_pos, k_pos, mask=slice_block(mask, qs, ks, cfg),
      is_causal=cfg.is_causal, rules=cfg.rules,
      q_seg=cut_q(ex.q_seg) if segs else None,
      k_seg=cut_k(ex.k_seg) if segs else None,
      # Keys added by padding are never real.
      kv_len=key_start(ex) + cfg.tk if cfg.padded_keys else None,
      user=user)
  s, dcap = score_rules.scores(
      qk, q_pos, k_pos, scale=cfg.scale, rules=cfg.rules,
      bias=slice_block(bias, qs, ks, cfg), slopes=ex.slopes,
      ok=ok if with_score else None, user=user)
  return (s, dcap) if with_score else (s, dcap, ok)


def score_mod_vjp(s, ex, qs, ks, cfg):
  """`score_mod` on a block of unmasked scores `s`, and its vjp to `s`
  and to the arrays it closes over."""
  q_pos, k_pos = block_q_pos(ex, qs, cfg), block_k_pos(ex, ks, cfg)
  def apply(s, consts):
    user = score_rules.User(ex.b_ids, ex.h_ids,
                            lambda *a: cfg.score_mod(*a, *consts,
                                                     *ex.fixed_consts[0]),
                            None)
    return score_rules.user_scores(user, s, q_pos, k_pos)
  return jax.vjp(apply, s, ex.score_consts)


# The forward.


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


def accumulate(s, vb, carry):
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


def _online_step(qb, k, v, mask, bias, ex, qs, ks, cfg, full, carry):
  """The online softmax's `carry` (m, l, acc of the cfg.bq query rows at
  qs: `[B,K,G,Bq]`, `[B,K,G,Bq]`, `[B,K,G,Bq,Dv]`) after the cfg.bk keys
  at ks; qb `[B,K,G,Bq,Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]`."""
  kb = lax.dynamic_slice_in_dim(k, ks, cfg.bk, axis=2)  # [B,K,Bk,Dh]
  vb = lax.dynamic_slice_in_dim(v, ks, cfg.bk, axis=2)  # [B,K,Bk,Dv]
  s, _ = block_scores(qb, kb, mask, bias, ex, qs, ks, cfg, full)
  return accumulate(s, vb, carry)


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


# The backward.


def row_terms(out, lse, d_out):
  """The backward's per-row inputs: `delta [B,K,G,Tq']` = dO . O (the
  softmax Jacobian's row term, sum_j P_ij dP_ij) and lse made finite
  (empty rows have lse = -inf; any finite shift gives exp(-inf) = 0)."""
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1)
  return delta, jnp.where(jnp.isfinite(lse), lse, 0.0)


def sink_grad(sinks, lse, delta):
  """d loss / d sink `[1, K, G, 1]` from the rows' finite lse and delta.

  The sink column's probability is exp(sink - lse) and its dP is 0 (it has
  no value), so d sink = -sum over rows of P_sink * delta."""
  p_sink = jnp.exp(sinks - lse)  # [B, K, G, Tq']
  return -jnp.sum(p_sink * delta, axis=(0, 3), keepdims=True)


def zero_grads(q, k, v, bias, ex):
  """float32 zeros for `backward_blocks`' `(dq, dk, dv, dbias, dslopes)`."""
  f32 = functools.partial(jnp.zeros, dtype=jnp.float32)
  return (f32(q.shape), f32(k.shape), f32(v.shape),
          None if bias is None else f32(bias.shape),
          None if ex.slopes is None else f32(ex.slopes.shape))


def backward_blocks(cfg, q, k, v, mask, bias, ex, lse, delta, d_out, grads):
  """`backward_walk` without user rules (the context-parallel paths,
  which refuse them): `grads` `(dq, dk, dv, dbias, dslopes)` float32."""
  return backward_walk(cfg, q, k, v, mask, bias, ex, lse, delta, d_out,
                       grads, ())[:5]


def backward_walk(cfg, q, k, v, mask, bias, ex, lse, delta, d_out, grads,
                  dconsts):
  """Add the gradients through the key blocks of k, v to `grads`.

  Recomputes each block's probabilities as exp(S - lse) from the rows'
  final (finite) `lse` and `delta` (`row_terms`), so the keys may be any
  slice of the sequence (`ex.k_start`), visited in any order: context
  parallelism calls this once per slice that reaches a device. `cfg`:
  `backward_cfg(...)`; `grads`: `(dq, dk, dv, dbias, dslopes)` float32
  (`zero_grads`), dk and dv those of this k and v; `dconsts`: those of
  `ex.score_consts` (zeros like them). Returns the six.
  """
  nq, nk = q.shape[3] // cfg.bq, k.shape[2] // cfg.bk

  def query_block(i, grads):
    dq, dk, dv, dbias, dslopes, dconsts = grads
    qs = i * cfg.bq
    cut = functools.partial(lax.dynamic_slice_in_dim, start_index=qs,
                            slice_size=cfg.bq, axis=3)
    qb, dob, lseb, deltab = cut(q), cut(d_out), cut(lse), cut(delta)

    def key_block(j, full, carry):
      ks = j * cfg.bk

      def visit(carry, full):
        dqb, dk, dv, dbias, dslopes, dconsts = carry
        kb = lax.dynamic_slice_in_dim(k, ks, cfg.bk, axis=2)
        vb = lax.dynamic_slice_in_dim(v, ks, cfg.bk, axis=2)
        if cfg.score_mod is None:
          s, dcap = block_scores(qb, kb, mask, bias, ex, qs, ks, cfg, full)
        else:  # differentiate score_mod on the unmasked scores
          s, dcap, ok = block_scores(qb, kb, mask, bias, ex, qs, ks, cfg,
                                     full, with_score=False)
          s, user_vjp = score_mod_vjp(s, ex, qs, ks, cfg)
          s = s if ok is None else score_rules.forbid(s, ok)
        p = jnp.exp(s - lseb[..., None])  # [B, K, G, Bq, Bk], exact softmax
        dp = precision.einsum("bkgqd,bksd->bkgqs", dob, vb,
                              preferred_element_type=jnp.float32)
        ds = p * (dp - deltab[..., None])  # d loss / d (softmax input)
        if cfg.score_mod is not None:  # through score_mod (p and so ds
          ds, dc = user_vjp(ds)  # are 0 on masked keys: they add nothing)
          dconsts = jax.tree.map(jnp.add, dconsts, dc)
        if dcap is not None:  # through c * tanh(x / c)
          ds = ds * dcap
        # The G query heads of a group share k and v: sum their gradients.
        dv_j = precision.einsum("bkgqs,bkgqd->bksd", p.astype(dob.dtype),
                                dob, preferred_element_type=jnp.float32)
        dk_j = precision.einsum("bkgqs,bkgqd->bksd", ds,
                                qb.astype(jnp.float32))
        dqb = dqb + precision.einsum("bkgqs,bksd->bkgqd", ds,
                                     kb.astype(jnp.float32)) * cfg.scale
        add = lambda acc, x: lax.dynamic_update_slice_in_dim(
            acc, lax.dynamic_slice_in_dim(acc, ks, cfg.bk, axis=2) + x, ks, 2)
        dk, dv = add(dk, dk_j * cfg.scale), add(dv, dv_j)
        if dbias is not None:
          dbias = add_bias_block(dbias, reduce_to(ds, bias.shape), qs, ks,
                                  cfg)
        if dslopes is not None:  # s -= slope * |pos_q - pos_k|
          dist = score_rules.distance(block_q_pos(ex, qs, cfg),
                                      block_k_pos(ex, ks, cfg))
          dslopes = dslopes - reduce_to(ds * dist, dslopes.shape)
        return dqb, dk, dv, dbias, dslopes, dconsts

      return visit_block(ex, qs, ks, cfg, full_or_not(visit, full), carry)

    init = (cut(dq), dk, dv, dbias, dslopes, dconsts)
    dqb, dk, dv, dbias, dslopes, dconsts = key_blocks(
        i, nk, ex, cfg, key_block, init)
    dq = lax.dynamic_update_slice_in_dim(dq, dqb, qs, axis=3)
    return dq, dk, dv, dbias, dslopes, dconsts

  return lax.fori_loop(0, nq, query_block, grads + (dconsts,))


def backward(cfg, residuals, d_out):
  """The custom VJP's backward: the cotangents of `(q, k, v, mask, bias,
  ex)` from the forward's `residuals` (those inputs, out and lse) and
  d_out `[B,K,G,Tq',Dv]`. Recomputes each block's probabilities from
  lse; accumulates in float32."""
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
  d_ex = Extras(q_pos=None, q_seg=None, k_seg=None, slopes=dslopes,
                sinks=dsinks, score_consts=dconsts,
                fixed_consts=jax.tree.map(lambda _: None, ex.fixed_consts))
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None,
          dbias, d_ex)
