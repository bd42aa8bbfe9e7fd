"""Attention on JAX's Pallas TPU splash kernel ("pallas_tpu").

Shape letters: B batch, Tq query length, Tk key/value length, H query
heads, K key/value heads, G = H // K, Dh head width.

`jax.experimental.pallas.ops.tpu.splash_attention` is the TPU kernel that
ships with JAX. It takes one example's heads `[heads, T, Dh]`, a static
mask object (causal, local window) that lets it skip whole blocks, segment
ids, per-head sinks and a logit soft cap. This adapter keeps mha_jax's
semantics on it:

  * bottom-right causality: `CausalMask(offset=Tk - Tq)`, and a window as
    `LocalMask((left, right), offset=Tk - Tq)`;
  * GQA without repeating k/v: the kernel's multi-query form per kv head,
    each serving its G query heads;
  * the scale multiplies q (the kernel does not scale);
  * a query row with no allowed key outputs 0: the kernel gives such a row
    a finite mask value, so the adapter zeroes the rows that have no
    allowed key (they can exist only with segment ids, or with causality
    when Tq > Tk).

The kernel takes no dense mask, bias (nor ALiBi), query positions or
dropout; those are refused naming the option. Off TPU the kernel runs in
Pallas' interpret mode, which is how the tests check this adapter on CPU
(slowly: it is a correctness path there, never chosen by `auto`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.core import attention_path
from mha_jax.core import score_rules

BLOCK = 128  # the kernel's block length; Tq and Tk must be multiples


def _splash():
  # Imported on use: the module pulls in Pallas' TPU backend pieces.
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as kernel,
      splash_attention_mask as masks)
  return kernel, masks


def limits(call, device) -> str | None:
  """Why the splash adapter cannot take `call` (a `call.Call`) on `device`
  (None when it can); the rule options and dropout are its record's to
  refuse. On a TPU a head width above one block must fill whole lanes;
  off TPU (interpret mode) that limit does not apply."""
  if len(set(call.dtypes)) != 1:
    return "q, k, v must share one dtype"
  if call.value_width != call.head_dim:
    return (f"it needs Dv == Dh, got Dv={call.value_width}, "
            f"Dh={call.head_dim}")
  if call.q_len % BLOCK or call.kv_len % BLOCK:
    return (f"Tq={call.q_len} and Tk={call.kv_len} must be multiples of its "
            f"block of {BLOCK}")
  if call.mask_dims is not None:
    return ("it takes no dense boolean mask (its masks are static causal/"
            "window objects and segment ids)")
  if call.bias_dims is not None:
    return "it takes no additive bias"
  head_dim = call.head_dim
  if device.backend == "tpu" and head_dim > BLOCK and head_dim % BLOCK:
    # Pallas TPU flash attention tiles in blocks of 128 (BlockSizes.
    # get_default, MIN_BLOCK_SIZE), the TPU's lane width.
    return (f"head width Dh={head_dim} above {BLOCK} must be a multiple of "
            f"{BLOCK} (the TPU's lane width)")
  return None


def attend_pallas_tpu(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                      rules=score_rules.NO_RULES, interpret=None):
  """The path "pallas_tpu": splash attention (its `limits` were checked by
  `attend`).

  `interpret` (None: off TPU) runs the kernel in Pallas' interpreter.
  """
  del dropout_rate, keep  # keep is None: the record refuses dropout
  b, tq, h, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  g = h // kh
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  kernel_lib, masks = _splash()
  offset = tk - tq  # query i sits at key position Tk - Tq + i
  window = rules.local_window
  if window is not None:
    left, right = window
    one = masks.LocalMask((tq, tk), (left, 0 if is_causal else right),
                          offset=offset)
  elif is_causal:
    one = masks.CausalMask((tq, tk), offset=offset)
  else:
    one = masks.FullMask((tq, tk))
  blocks = kernel_lib.BlockSizes(
      block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK,
      block_q_dkv=BLOCK, block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK,
      block_q_dq=BLOCK, block_kv_dq=BLOCK)
  kernel = kernel_lib.make_splash_mqa_single_device(
      masks.MultiHeadMask([one] * g), block_sizes=blocks,
      attn_logits_soft_cap=rules.soft_cap, interpret=interpret)

  scale = score_rules.scale_of(rules, dh)
  qg = (q * jnp.asarray(scale, q.dtype)).reshape(b, tq, kh, g, dh).transpose(
      0, 2, 3, 1, 4)  # [B, K, G, Tq, Dh]
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, Tk, D]
  sinks = (None if rules.sinks is None else
           rules.sinks.astype(jnp.float32).reshape(kh, g))

  def one_group(qh, kh_, vh, seg_q, seg_k, sink):
    """One example's kv head and its G query heads: [G, Tq, Dh]."""
    segments = (None if seg_q is None else
                kernel_lib.SegmentIds(q=seg_q, kv=seg_k))
    return kernel(qh, kh_, vh, segments, sink)

  seg_q, seg_k = rules.q_segment_ids, rules.kv_segment_ids
  seg_axis = None if seg_q is None else 0
  over_k = jax.vmap(one_group, in_axes=(0, 0, 0, None, None,
                                        None if sinks is None else 0))
  over_b = jax.vmap(over_k, in_axes=(0, 0, 0, seg_axis, seg_axis, None))
  out = over_b(qg, kt, vt, seg_q, seg_k, sinks)  # [B, K, G, Tq, Dv]
  out = out.transpose(0, 3, 1, 2, 4).reshape(b, tq, h, v.shape[-1])
  if seg_q is not None or (is_causal and tq > tk):
    # Rows with no allowed key: zero them (the kernel's mask value is
    # finite, so it would average the values there).
    q_pos = score_rules.default_q_positions(tq, tk)[None]
    ok = score_rules.allowed(
        q_pos, jnp.arange(tk), is_causal=is_causal, rules=rules,
        q_seg=seg_q, k_seg=seg_k)  # [B?, Tq, Tk] bool
    has_key = jnp.any(ok, axis=-1)[..., None, None]  # [B?, Tq, 1, 1]
    out = jnp.where(has_key, out, 0)
  return out.astype(v.dtype), None


PALLAS_TPU = attention_path.AttentionPath(
    name="pallas_tpu", fn=attend_pallas_tpu,
    rules={"scale", "local_window", "q_segment_ids", "soft_cap", "sinks"},
    limits=limits,
    computes="JAX's Pallas TPU splash attention (causal/window masks skip "
    "blocks, GQA without repeating k/v)")
