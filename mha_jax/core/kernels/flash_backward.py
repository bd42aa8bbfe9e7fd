"""The blockwise kernel's backward pass: gradients block by block.

Shape letters: B batch, K key/value heads, G query heads per kv head,
Tq' / Tk' padded query / key lengths, Dh query/key width, Dv value
width, Bq / Bk the backward's query / key block lengths.

The forward saves only `out` and the rows' `lse`; here each block's
probabilities are recomputed as exp(S - lse) and the gradients of q, k,
v, a bias, ALiBi slopes, sinks and a score_mod's tables accumulated in
float32, so training also keeps O(T) memory. The walk (`backward_walk`)
takes the rows' final terms (`row_terms`) rather than a forward state,
so it may visit any slice of the keys in any order: context parallelism
calls it (as `backward_blocks`) once per slice that reaches a device.
It is apart from `flash.py`, which wires it into the custom VJP, because
it is the longest piece of the kernel and shares nothing with the
forward but the blocks visited (`flash_visit.py`) and their scores
(`flash_rules.py`). `cfg` and `ex` are `flash.BlockConfig` and
`flash.Extras`.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.core.kernels.flash_rules import block_scores
from mha_jax.core.kernels.flash_rules import score_mod_vjp
from mha_jax.core.kernels.flash_visit import block_k_pos
from mha_jax.core.kernels.flash_visit import block_q_pos
from mha_jax.core.kernels.flash_visit import full_or_not
from mha_jax.core.kernels.flash_visit import key_blocks
from mha_jax.core.kernels.flash_visit import visit_block


def _reduce_to(x, shape):
  """Sum `x` over the axes where `shape` broadcasts (size 1), keeping them."""
  axes = tuple(a for a, (n, s) in enumerate(zip(shape, x.shape))
               if n == 1 and s != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def backward_cfg(cfg):
  """`cfg` with the backward's block lengths."""
  return cfg._replace(bq=cfg.bwd_bq, bk=cfg.bwd_bk)


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
          dbias = _add_bias_block(dbias, _reduce_to(ds, bias.shape), qs, ks,
                                  cfg)
        if dslopes is not None:  # s -= slope * |pos_q - pos_k|
          dist = score_rules.distance(block_q_pos(ex, qs, cfg),
                                      block_k_pos(ex, ks, cfg))
          dslopes = dslopes - _reduce_to(ds * dist, dslopes.shape)
        return dqb, dk, dv, dbias, dslopes, dconsts

      return visit_block(ex, qs, ks, cfg, full_or_not(visit, full), carry)

    init = (cut(dq), dk, dv, dbias, dslopes, dconsts)
    dqb, dk, dv, dbias, dslopes, dconsts = key_blocks(
        i, nk, ex, cfg, key_block, init)
    dq = lax.dynamic_update_slice_in_dim(dq, dqb, qs, axis=3)
    return dq, dk, dv, dbias, dslopes, dconsts

  return lax.fori_loop(0, nq, query_block, grads + (dconsts,))


def _add_bias_block(dbias, block, qs, ks, cfg):
  """dbias[.., qs:qs+Bq, ks:ks+Bk] += block, on the axes bias does not share."""
  starts = [0, 0, 0, qs if dbias.shape[3] != 1 else 0,
            ks if dbias.shape[4] != 1 else 0]
  current = lax.dynamic_slice(dbias, starts, block.shape)
  return lax.dynamic_update_slice(dbias, current + block, starts)
