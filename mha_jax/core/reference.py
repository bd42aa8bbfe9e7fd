"""The reference paths of stage 3: one head, mapped over heads ("vmap"),
and the same rule as batched einsums ("einsum").

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads (K divides H), G = H // K query heads sharing one kv head,
Dh per-head query/key width, Dv per-head value width.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh) + bias + M) V

and the variants of `mha_jax.core.score_rules` (local windows, packed segments,
soft-capping, sinks, another scale, ALiBi, the user rules), passed as
`rules=`. These two paths form the weights, so they carry the `scores` and
`pattern` hook sites; every other path is tested against "vmap".

Policies that hold on every path:
  * The boolean mask is applied BEFORE the softmax, as -inf on forbidden keys,
    so they get exactly zero weight (after the softmax would leak mass).
  * A query row with no allowed key gets weights 0 and output 0, with finite
    gradients (instead of NaN or the mean of V that some libraries return).
  * Logits and softmax are float32 even for bfloat16/float16 inputs; the
    weights are cast to the value dtype for the weighted sum, which
    accumulates in float32. The weights returned (the `pattern`) are the
    float32 softmax the output was computed from (before dropout).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mha_jax.core import attention_path
from mha_jax.core import batch_chunks
from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.core import softmax
from mha_jax.core.kernels import flash_schedule


def _check_single_head(q, k, v):
  for name, arr in (("q", q), ("k", k), ("v", v)):
    if jnp.ndim(arr) != 2:
      raise ValueError(f"scaled_dot_product_attention: `{name}` must have rank "
                       f"2 ([T, Dh]); got shape {jnp.shape(arr)}. Use "
                       "multi_head_attention or attend for batches and heads")
    if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
      raise TypeError(f"scaled_dot_product_attention: `{name}` must be "
                      f"floating, got {jnp.result_type(arr)}")
  if q.shape[1] != k.shape[1]:
    raise ValueError(f"scaled_dot_product_attention: q and k widths differ: "
                     f"q {q.shape}, k {k.shape}")
  if k.shape[0] != v.shape[0]:
    raise ValueError(f"scaled_dot_product_attention: k and v lengths differ: "
                     f"k {k.shape}, v {v.shape}")


def check_broadcast(name, arr, target, *, boolean, fn):
  """Check that `arr` broadcasts to `target` and has the right dtype."""
  if arr is None:
    return
  dtype = jnp.result_type(arr)
  if boolean and dtype != jnp.bool_:
    hint = (" For an additive float mask (0 / -inf) pass it as `bias=`."
            if jnp.issubdtype(dtype, jnp.floating) else "")
    raise TypeError(f"{fn}: `{name}` must be boolean (True = may attend), got "
                    f"{dtype}.{hint}")
  if not boolean and not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{fn}: `{name}` must be floating, got {dtype}")
  shape = tuple(jnp.shape(arr))
  ok = len(shape) <= len(target) and all(
      s in (1, t) for s, t in zip(shape[::-1], target[::-1]))
  if not ok:
    raise ValueError(f"{fn}: `{name}` of shape {shape} does not broadcast to "
                     f"{list(target)}")


def _head_scores(q, k, mask, bias, slope, q_pos, q_seg, k_seg, b_id=0,
                 h_id=0, *, is_causal, rules):
  """One head: q [Tq,Dh], k [Tk,Dh] -> float32 scores [Tq,Tk].

  Scaled dot products plus `bias` (and ALiBi's `slope` term, soft-capped
  by `rules`), and -inf where `mask`, the causal rule, the window or the
  segments `q_seg [Tq]`, `k_seg [Tk]` forbid a key: the softmax's input,
  as the `scores` hook sees it. `q_pos [Tq]`: the queries' key positions
  (None: bottom-right). `b_id`, `h_id`: this head's batch row and query
  head, the `b` and `h` of the user rules.
  """
  tq, tk = q.shape[0], k.shape[0]
  if q_pos is None:
    q_pos = score_rules.default_q_positions(tq, tk)
  k_pos = jnp.arange(tk)
  q, scale = _fold_scale(q, score_rules.scale_of(rules, q.shape[-1]))
  qk = precision.einsum("qd,kd->qk", q, k,
                        preferred_element_type=jnp.float32)  # [Tq, Tk]
  user = score_rules.user_of(rules, jnp.reshape(b_id, (1, 1)),
                             jnp.reshape(h_id, (1, 1)))
  ok = score_rules.allowed(q_pos, k_pos, mask=mask, is_causal=is_causal,
                           rules=rules, q_seg=q_seg, k_seg=k_seg, user=user)
  s, _ = score_rules.scores(qk, q_pos, k_pos, scale=scale, rules=rules,
                            bias=bias, slopes=slope, ok=ok, user=user)
  return s


def _fold_scale(q, scale):
  """`(q', scale')` with q'.k * scale' = scale * (q.k): in float32 the
  scale multiplies q ([Tq, Dh]) instead of the scores ([Tq, Tk]), as
  flax.linen does, which saves a pass over the scores and lets XLA's CPU
  backend fuse the score product with the softmax; docs/performance.md.
  Lower precisions keep it on the float32 scores, where it does not
  round q (the blockwise kernel's rule, `flash_schedule.prescaled`)."""
  if flash_schedule.prescaled(q.dtype):
    return q * jnp.asarray(scale, q.dtype), 1.0
  return q, scale


def _head_mix(weights, v):
  """One head: weights [Tq,Tk] @ v [Tk,Dv] -> [Tq,Dv], float32 accumulation."""
  return precision.einsum("qk,kd->qd", weights.astype(v.dtype), v,
                          preferred_element_type=jnp.float32).astype(v.dtype)


def scaled_dot_product_attention(q, k, v, *, mask=None, bias=None):
  """Attention for ONE head: q `[Tq, Dh]`, k `[Tk, Dh]`, v `[Tk, Dv]`.

  `mask`: bool broadcastable to `[Tq, Tk]`, True = may attend.
  `bias`: float broadcastable to `[Tq, Tk]`, added to the scaled scores.
  Returns `(out [Tq, Dv], weights [Tq, Tk])`.
  """
  _check_single_head(q, k, v)
  target = (q.shape[0], k.shape[0])
  fn = "scaled_dot_product_attention"
  check_broadcast("mask", mask, target, boolean=True, fn=fn)
  check_broadcast("bias", bias, target, boolean=False, fn=fn)
  as_2d = lambda x: None if x is None else jnp.reshape(
      x, (1,) * (2 - jnp.ndim(x)) + jnp.shape(x))
  weights = softmax.softmax_rows(_head_scores(
      q, k, as_2d(mask), as_2d(bias), None, None, None, None,
      is_causal=False, rules=score_rules.NO_RULES))
  return _head_mix(weights, v), weights


# ----------------------------------------------------------------------------
# All heads at once: q [B,Tq,H,Dh], k [B,Tk,K,Dh], v [B,Tk,K,Dv].


def _to_4d(x):
  """Left-pad an array broadcastable to [B, H, Tq, Tk] to rank 4."""
  return None if x is None else jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)


def _weights(scores, keep, dropout_rate, hooks, sinks=None):
  """scores `[B,H,Tq,Tk]` -> the `pattern` `[B,H,Tq,Tk]` and the weights
  the values are mixed with (the pattern after dropout). `sinks [H]`: each
  head's sink logit, a softmax column that is not part of the pattern.

  The hook sites of stage 3 on the paths that form weights: `scores` may
  be read or replaced before the softmax, `pattern` after it.
  """
  sinks = None if sinks is None else sinks[None, :, None, None]
  pattern = hooks("pattern", softmax.softmax_with_sink(hooks("scores", scores),
                                               sinks))
  if keep is None:
    return pattern, pattern
  return pattern, jnp.where(keep, pattern / (1.0 - dropout_rate), 0.0)


def _attend_vmap(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                 hooks, rules=score_rules.NO_RULES):
  """Reference path: the one-head functions mapped with jax.vmap over G,
  K, then B (scores, then mixing the values); the softmax between them
  is elementwise over rows, so it runs on all heads at once."""
  b, tq, h, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = h // kh
  q = q.reshape(b, tq, kh, g, dh)  # [B, Tq, K, G, Dh]

  def split_heads_axis(x):
    """[b?, h?, ...] -> ([b?, K?, G?, ...], in_axes for B, K, G)."""
    if x is None:
      return None, None, None, None
    bx, hx = x.shape[:2]
    if hx == h:
      x = x.reshape(bx, kh, g, *x.shape[2:])
      ax_k, ax_g = 0, 0
    else:  # shared by all heads: drop the head axis, map nothing over it
      x = x[:, 0]
      ax_k = ax_g = None
    if bx == b:
      ax_b = 0
    else:  # shared by the whole batch
      x, ax_b = x[0], None
    return x, ax_b, ax_k, ax_g

  mask, mb, mk, mg = split_heads_axis(_to_4d(mask))
  bias, bb, bk, bg = split_heads_axis(_to_4d(bias))

  # Per-head and per-row vectors of the score rules, and the axes they map.
  slope = (None if rules.alibi_slopes is None
           else rules.alibi_slopes.reshape(kh, g))  # [K, G]
  sk = sg = None if slope is None else 0
  per_row = lambda x: (None, None) if x is None else (x, 0)  # [B, T]
  q_pos, pb = per_row(rules.q_positions)
  q_seg, qsb = per_row(rules.q_segment_ids)
  k_seg, ksb = per_row(rules.kv_segment_ids)

  # The batch row and query head of each score, for the user rules.
  b_ids, h_ids = jnp.arange(b), jnp.arange(h).reshape(kh, g)  # [B], [K, G]

  head = functools.partial(_head_scores, is_causal=is_causal, rules=rules)
  # Over the G query heads that share one kv head: q is [Tq, G, Dh].
  over_g = jax.vmap(head, in_axes=(1, None, mg, bg, sg, None, None, None,
                                   None, 0))
  # Over the K kv heads: q [Tq, K, G, Dh], k [Tk, K, Dh].
  over_k = jax.vmap(over_g, in_axes=(1, 1, mk, bk, sk, None, None, None,
                                     None, 0))
  over_b = jax.vmap(over_k, in_axes=(0, 0, mb, bb, None, pb, qsb, ksb, 0,
                                     None))
  scores = over_b(q, k, mask, bias, slope, q_pos, q_seg, k_seg, b_ids,
                  h_ids).reshape(b, h, tq, tk)  # from [B, K, G, Tq, Tk]
  pattern, weights = _weights(scores, keep, dropout_rate, hooks, rules.sinks)

  mix_g = jax.vmap(_head_mix, in_axes=(0, None), out_axes=1)  # [Tq, G, Dv]
  mix_k = jax.vmap(mix_g, in_axes=(0, 1), out_axes=1)  # [Tq, K, G, Dv]
  mix_b = jax.vmap(mix_k, in_axes=(0, 0))  # [B, Tq, K, G, Dv]
  out = mix_b(weights.reshape(b, kh, g, tq, tk), v)
  return out.reshape(b, tq, h, v.shape[-1]), pattern


def _attend_einsum(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                   hooks, rules=score_rules.NO_RULES):
  """Fused path: batched einsums; GQA by grouping q, never repeating k/v.
  On CPU with large scores, in independent chunks of the batch
  (`batch_chunks`: the second core works on one while the first works on
  another), each row computed as in the whole batch."""
  b, tq, h, _ = q.shape
  n = batch_chunks.count(b, h, tq, k.shape[1], hooks)
  if n == 1:
    return _einsum_rows(q, k, v, mask, bias, keep, is_causal=is_causal,
                        dropout_rate=dropout_rate, hooks=hooks, rules=rules)
  outs, patterns = [], []
  for start, stop in batch_chunks.bounds(b, n):
    cut = functools.partial(batch_chunks.rows, b=b, start=start, stop=stop)
    out, pattern = _einsum_rows(
        cut(q), cut(k), cut(v), cut(_to_4d(mask)), cut(_to_4d(bias)),
        cut(keep), is_causal=is_causal, dropout_rate=dropout_rate,
        hooks=hooks, rules=batch_chunks.rules_rows(rules, b, start, stop),
        row0=start)
    outs.append(out)
    patterns.append(pattern)
  # The pattern is concatenated only if a caller reads it (XLA drops an
  # unused concatenation); the weight hooks never run here (count()).
  return jnp.concatenate(outs), jnp.concatenate(patterns)


def _einsum_rows(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                 hooks, rules, row0=0):
  """The einsum path on batch rows `row0 : row0 + B` of a call (the user
  rules' `b` counts from `row0`)."""
  b, tq, h, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = h // kh
  # Head-major q and k: the score matmul is then batched over (B, K) and
  # writes [B, K, G, Tq, Tk] directly. With q as [B, Tq, K, G, Dh], XLA on
  # CPU transposed the whole score matrix after the matmul (compiled HLO).
  q, scale = _fold_scale(q, score_rules.scale_of(rules, dh))
  qg = q.reshape(b, tq, kh, g, dh).transpose(0, 2, 3, 1, 4)  # [B,K,G,Tq,Dh]
  kt = k.transpose(0, 2, 1, 3)  # [B, K, Tk, Dh]
  qk = precision.einsum("bkgqd,bksd->bkgqs", qg, kt,
                        preferred_element_type=jnp.float32)

  def to_5d(x):  # [b?, h?, tq?, tk?] -> [b?, K?, G?, tq?, tk?]
    if x is None:
      return None
    if x.shape[1] == h:
      return x.reshape(x.shape[0], kh, g, *x.shape[2:])
    return x[:, :, None]

  rows = lambda x: None if x is None else x[:, None, None]  # [B,1,1,T]
  q_pos = (score_rules.default_q_positions(tq, tk)[None, None, None]
           if rules.q_positions is None else rows(rules.q_positions))
  k_pos = jnp.arange(tk)
  user = score_rules.user_of(  # [B, 1, 1, 1, 1], [1, K, G, 1, 1]
      rules, row0 + jnp.arange(b).reshape(b, 1, 1, 1, 1),
      jnp.arange(h).reshape(1, kh, g, 1, 1))
  ok = score_rules.allowed(
      q_pos, k_pos, mask=to_5d(_to_4d(mask)), is_causal=is_causal,
      rules=rules, q_seg=rows(rules.q_segment_ids),
      k_seg=rows(rules.kv_segment_ids), user=user)
  slopes = (None if rules.alibi_slopes is None else
            rules.alibi_slopes.reshape(1, kh, g, 1, 1))
  logits, _ = score_rules.scores(
      qk, q_pos, k_pos, scale=scale, rules=rules,
      bias=to_5d(_to_4d(bias)), slopes=slopes, ok=ok, user=user)
  pattern, weights = _weights(logits.reshape(b, h, tq, tk), keep,
                              dropout_rate, hooks, rules.sinks)
  weights = weights.reshape(b, kh, g, tq, tk).astype(v.dtype)
  # Weights on the left, output [B, K, G, Tq, Dv]: asking einsum for
  # "bqkgd" directly made XLA compute (W V)^T as V^T W^T, which took twice
  # the CPU time of the vmap path at B=1, n=2048, H=8.
  out = precision.einsum("bkgqs,bksd->bkgqd", weights,
                         v.transpose(0, 2, 1, 3),
                         preferred_element_type=jnp.float32).astype(v.dtype)
  out = out.transpose(0, 3, 1, 2, 4)  # [B, Tq, K, G, Dv]
  return out.reshape(b, tq, h, v.shape[-1]), pattern


VMAP = attention_path.AttentionPath(
    name="vmap", fn=_attend_vmap, forms_weights=True, dropout=True,
    dense_scores="float32",
    computes="the reference: the seed's one-head functions mapped with "
    "jax.vmap over heads and batch")
EINSUM = attention_path.AttentionPath(
    name="einsum", fn=_attend_einsum, forms_weights=True, dropout=True,
    dense_scores="float32",
    computes="batched einsums over (B, K, G), GQA without repeating k/v: "
    "the faster of the two paths that form the weights")
