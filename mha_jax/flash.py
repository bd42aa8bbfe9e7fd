"""Blockwise ("flash") attention: an online softmax over key/value blocks.

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads, G = H // K query heads per kv head, Dh query/key width,
Dv value width, Bq / Bk query / key block lengths, Nq / Nk block counts.

The reference paths build the whole score matrix `[B, H, Tq, Tk]`: the seed's
"O(h n^2)" memory. Here the keys are visited one block at a time while a
running row maximum `m`, row sum `l` and unnormalised output `acc` are kept
per query (the online softmax):

    m' = max(m, rowmax(S_j))       p = exp(S_j - m')     a = exp(m - m')
    l' = a l + rowsum(p)           acc' = a acc + p V_j
    out = acc / l                  lse = m + log(l)

so live memory is O(Bq Bk) per head and O(T) overall. The backward pass
(`jax.custom_vjp`) saves only `out` and `lse` and recomputes each block's
probabilities as `exp(S - lse)`: O(T) memory for training too.

Semantics match `attention._attend_vmap` (the reference): boolean masks are
-inf before the softmax, `is_causal` is bottom-right aligned like
`masks.causal_mask` (and key blocks it hides entirely are never visited), a
query row with no allowed key gives output 0 with finite gradients, GQA reads
each kv head once for its G query heads, and scores, softmax and all
accumulators are float32 whatever the input dtype. It cannot return weights.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

# 128 x 128 blocks ([B, H, 128, 128] float32 = 512 KiB for B=1, H=8) stay in
# cache on CPU; a sweep over 128..1024 (CPU time, B=8 n=512 and B=1 n=4096
# causal) found them cheapest or within noise of the cheapest.
DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 128


class _Config(NamedTuple):
  """Static facts the kernels need (hashable: a nondiff argument)."""
  tq: int  # true query length
  tk: int  # true key length
  bq: int  # query block
  bk: int  # key block
  is_causal: bool


def _to_5d(x, h, kh):
  """`[b?, h?, tq?, tk?]` (any rank <= 4) -> `[b?, K?, G?, tq?, tk?]`."""
  if x is None:
    return None
  x = jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)
  if x.shape[1] == h:
    return x.reshape(x.shape[0], kh, h // kh, *x.shape[2:])
  return x[:, :, None]  # one value shared by all heads


def _pad_axis(x, axis, size, value):
  """Pad `x` at the end of `axis` up to `size` (no-op if already there)."""
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def _slice_block(x, qs, ks, cfg):
  """Cut the `[.., Bq, Bk]` block of a 5-d mask or bias (broadcast axes stay)."""
  if x is None:
    return None
  if x.shape[3] != 1:
    x = lax.dynamic_slice_in_dim(x, qs, cfg.bq, axis=3)
  if x.shape[4] != 1:
    x = lax.dynamic_slice_in_dim(x, ks, cfg.bk, axis=4)
  return x


def _block_scores(qb, kb, mask, bias, qs, ks, cfg):
  """float32 scores of one block `[B, K, G, Bq, Bk]`, -inf where forbidden."""
  scale = qb.shape[-1] ** -0.5
  s = jnp.einsum("bkgqd,bksd->bkgqs", qb, kb,
                 preferred_element_type=jnp.float32) * scale
  if bias is not None:
    s = s + _slice_block(bias, qs, ks, cfg).astype(jnp.float32)
  valid = _slice_block(mask, qs, ks, cfg)
  padded_keys = cfg.tk % cfg.bk != 0
  if cfg.is_causal or padded_keys:
    q_pos = qs + jnp.arange(cfg.bq)[:, None]  # [Bq, 1]
    k_pos = ks + jnp.arange(cfg.bk)[None, :]  # [1, Bk]
    ok = k_pos < cfg.tk  # keys added by padding are never real
    if cfg.is_causal:  # bottom-right: query i sits at key position Tk-Tq+i
      ok = ok & (k_pos <= q_pos + (cfg.tk - cfg.tq))
    ok = ok[None, None, None]  # [1, 1, 1, Bq, Bk]
    valid = ok if valid is None else valid & ok
  if valid is not None:
    # -inf (not a large negative number) so that a forbidden key gets exactly
    # zero weight and an empty row is recognisable as max = -inf.
    s = jnp.where(valid, s, -jnp.inf)
  return s


def _num_kv_blocks(i, nk, cfg):
  """Key blocks query block i must visit; causality hides the later ones."""
  if not cfg.is_causal:
    return nk
  last_key = (i + 1) * cfg.bq - 1 + (cfg.tk - cfg.tq)  # last visible key
  return jnp.clip(last_key // cfg.bk + 1, 0, nk)


def _forward(q, k, v, mask, bias, cfg):
  """q `[B,K,G,Tq',Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]` -> out, lse."""
  b, kh, g, tq_pad, _ = q.shape
  dv = v.shape[-1]
  nq, nk = tq_pad // cfg.bq, k.shape[2] // cfg.bk

  def query_block(i):
    qs = i * cfg.bq
    qb = lax.dynamic_slice_in_dim(q, qs, cfg.bq, axis=3)  # [B,K,G,Bq,Dh]

    def key_block(j, carry):
      m, l, acc = carry
      ks = j * cfg.bk
      kb = lax.dynamic_slice_in_dim(k, ks, cfg.bk, axis=2)  # [B,K,Bk,Dh]
      vb = lax.dynamic_slice_in_dim(v, ks, cfg.bk, axis=2)  # [B,K,Bk,Dv]
      s = _block_scores(qb, kb, mask, bias, qs, ks, cfg)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      # Rows that have seen no allowed key yet have m = -inf; shifting them
      # by 0 keeps exp() at exactly 0 instead of exp(-inf + inf) = NaN.
      shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      p = jnp.exp(s - shift[..., None])
      rescale = jnp.exp(m - shift)  # old rows' correction factor
      l = rescale * l + jnp.sum(p, axis=-1)
      acc = rescale[..., None] * acc + jnp.einsum(
          "bkgqs,bksd->bkgqd", p.astype(v.dtype), vb,
          preferred_element_type=jnp.float32)
      return m_new, l, acc

    init = (jnp.full((b, kh, g, cfg.bq), -jnp.inf, jnp.float32),
            jnp.zeros((b, kh, g, cfg.bq), jnp.float32),
            jnp.zeros((b, kh, g, cfg.bq, dv), jnp.float32))
    m, l, acc = lax.fori_loop(0, _num_kv_blocks(i, nk, cfg), key_block, init)
    # Empty rows have l = 0 and acc = 0: output 0, the reference's policy.
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
    return out.astype(v.dtype), lse

  out, lse = lax.map(query_block, jnp.arange(nq))  # [Nq, B, K, G, Bq, ...]
  out = jnp.moveaxis(out, 0, 3).reshape(b, kh, g, tq_pad, dv)
  lse = jnp.moveaxis(lse, 0, 3).reshape(b, kh, g, tq_pad)
  return out, lse


def _reduce_to(x, shape):
  """Sum `x` over the axes where `shape` broadcasts (size 1), keeping them."""
  axes = tuple(a for a, (n, s) in enumerate(zip(shape, x.shape))
               if n == 1 and s != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _backward(cfg, residuals, d_out):
  """Recompute each block's probabilities from lse; accumulate in float32."""
  q, k, v, mask, bias, out, lse = residuals
  nq, nk = q.shape[3] // cfg.bq, k.shape[2] // cfg.bk
  scale = q.shape[-1] ** -0.5
  # delta_i = sum_j P_ij dP_ij = dO_i . O_i (the softmax Jacobian's row term).
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1)
  # Empty rows have lse = -inf; any finite shift gives exp(-inf) = 0 there.
  lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
  f32 = functools.partial(jnp.zeros, dtype=jnp.float32)
  grads = (f32(q.shape), f32(k.shape), f32(v.shape),
           None if bias is None else f32(bias.shape))

  def query_block(i, grads):
    dq, dk, dv, dbias = grads
    qs = i * cfg.bq
    cut = functools.partial(lax.dynamic_slice_in_dim, start_index=qs,
                            slice_size=cfg.bq, axis=3)
    qb, dob, lseb, deltab = cut(q), cut(d_out), cut(lse), cut(delta)

    def key_block(j, carry):
      dqb, dk, dv, dbias = carry
      ks = j * cfg.bk
      kb = lax.dynamic_slice_in_dim(k, ks, cfg.bk, axis=2)
      vb = lax.dynamic_slice_in_dim(v, ks, cfg.bk, axis=2)
      s = _block_scores(qb, kb, mask, bias, qs, ks, cfg)
      p = jnp.exp(s - lseb[..., None])  # [B, K, G, Bq, Bk], exact softmax
      dp = jnp.einsum("bkgqd,bksd->bkgqs", dob, vb,
                      preferred_element_type=jnp.float32)
      ds = p * (dp - deltab[..., None])  # d loss / d (scaled score + bias)
      # The G query heads of a group share k and v: sum their gradients.
      dv_j = jnp.einsum("bkgqs,bkgqd->bksd", p.astype(dob.dtype), dob,
                        preferred_element_type=jnp.float32)
      dk_j = jnp.einsum("bkgqs,bkgqd->bksd", ds, qb.astype(jnp.float32))
      dqb = dqb + jnp.einsum("bkgqs,bksd->bkgqd", ds,
                             kb.astype(jnp.float32)) * scale
      add = lambda acc, x: lax.dynamic_update_slice_in_dim(
          acc, lax.dynamic_slice_in_dim(acc, ks, cfg.bk, axis=2) + x, ks, 2)
      dk, dv = add(dk, dk_j * scale), add(dv, dv_j)
      if dbias is not None:
        dbias = _add_bias_block(dbias, _reduce_to(ds, bias.shape), qs, ks,
                                cfg)
      return dqb, dk, dv, dbias

    init = (jnp.zeros(qb.shape, jnp.float32), dk, dv, dbias)
    dqb, dk, dv, dbias = lax.fori_loop(0, _num_kv_blocks(i, nk, cfg),
                                       key_block, init)
    dq = lax.dynamic_update_slice_in_dim(dq, dqb, qs, axis=3)
    return dq, dk, dv, dbias

  dq, dk, dv, dbias = lax.fori_loop(0, nq, query_block, grads)
  dbias = None if bias is None else dbias.astype(bias.dtype)
  # The mask is boolean: no cotangent (None means zero to custom_vjp).
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None,
          dbias)


def _add_bias_block(dbias, block, qs, ks, cfg):
  """dbias[.., qs:qs+Bq, ks:ks+Bk] += block, on the axes bias does not share."""
  starts = [0, 0, 0, qs if dbias.shape[3] != 1 else 0,
            ks if dbias.shape[4] != 1 else 0]
  current = lax.dynamic_slice(dbias, starts, block.shape)
  return lax.dynamic_update_slice(dbias, current + block, starts)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, mask, bias, cfg):
  return _forward(q, k, v, mask, bias, cfg)[0]


def _flash_fwd(q, k, v, mask, bias, cfg):
  out, lse = _forward(q, k, v, mask, bias, cfg)
  # Residuals: the inputs and O(T) statistics, never a [Tq, Tk] array.
  return out, (q, k, v, mask, bias, out, lse)


_flash.defvjp(_flash_fwd, _backward)


def flash_attention(q, k, v, *, mask=None, bias=None, is_causal=False,
                    block_q=DEFAULT_BLOCK_Q, block_k=DEFAULT_BLOCK_K):
  """Blockwise attention; same contract as `attend` but returns only `out`.

  Args:
    q: `[B, Tq, H, Dh]`; k: `[B, Tk, K, Dh]`; v: `[B, Tk, K, Dv]`, with K
      dividing H. Validate with `attention.check_attend_inputs` (or call
      `attend(..., implementation="flash")`, which does).
    mask: bool broadcastable to `[B, H, Tq, Tk]`, True = may attend.
    bias: float broadcastable to `[B, H, Tq, Tk]` (differentiable).
    is_causal: bottom-right aligned causal rule; hidden key blocks are skipped.
    block_q, block_k: block lengths (clipped to the sequence lengths). Lengths
      that are not multiples are padded internally and the padding masked.

  Returns:
    out `[B, Tq, H, Dv]` in v's dtype.
  """
  for name, val in (("block_q", block_q), ("block_k", block_k)):
    if not isinstance(val, int) or val < 1:
      raise ValueError(f"flash_attention: `{name}` must be a positive int, "
                       f"got {val!r}")
  b, tq, h, dh = q.shape
  tk, kh, dv = k.shape[1], k.shape[2], v.shape[3]
  g = h // kh
  cfg = _Config(tq=tq, tk=tk, bq=min(block_q, tq), bk=min(block_k, tk),
                is_causal=bool(is_causal))
  tq_pad = -(-tq // cfg.bq) * cfg.bq
  tk_pad = -(-tk // cfg.bk) * cfg.bk
  # Head-major layout once, so that every block is a contiguous slice of T
  # and each block matmul is batched over (B, K) with G*Bq rows.
  qt = q.reshape(b, tq, kh, g, dh).transpose(0, 2, 3, 1, 4)  # [B,K,G,Tq,Dh]
  kt = k.transpose(0, 2, 1, 3)  # [B, K, Tk, Dh]
  vt = v.transpose(0, 2, 1, 3)  # [B, K, Tk, Dv]
  qt = _pad_axis(qt, 3, tq_pad, 0)
  kt, vt = _pad_axis(kt, 2, tk_pad, 0), _pad_axis(vt, 2, tk_pad, 0)
  mask, bias = _to_5d(mask, h, kh), _to_5d(bias, h, kh)
  # Padding rows/keys of a full-size mask or bias; padded keys are also
  # excluded by position inside the kernel, so the fill values are moot.
  if mask is not None:
    mask = _pad_axis(mask, 3, tq_pad, True) if mask.shape[3] != 1 else mask
    mask = _pad_axis(mask, 4, tk_pad, False) if mask.shape[4] != 1 else mask
  if bias is not None:
    bias = _pad_axis(bias, 3, tq_pad, 0) if bias.shape[3] != 1 else bias
    bias = _pad_axis(bias, 4, tk_pad, 0) if bias.shape[4] != 1 else bias
  out = _flash(qt, kt, vt, mask, bias, cfg)  # [B, K, G, Tq', Dv]
  out = out[:, :, :, :tq].transpose(0, 3, 1, 2, 4)  # [B, Tq, K, G, Dv]
  return out.reshape(b, tq, h, dv)


def attend_flash(q, k, v, mask, bias, keep, *, is_causal, dropout_rate):
  """`attention.IMPLEMENTATIONS` entry: flash output, weights None."""
  del dropout_rate
  if keep is not None:
    raise ValueError("attend: implementation='flash' does not support "
                     "attention dropout (it never forms the weights to drop);"
                     " use dropout_rate=0 or implementation='einsum'")
  return flash_attention(q, k, v, mask=mask, bias=bias,
                         is_causal=is_causal), None
