"""Attention delegated to `jax.nn.dot_product_attention` ("xla", "cudnn").

Shape letters: B batch, Tq query length, Tk key/value length, H query heads,
K key/value heads, Dh head width, Dv value width.

`jax.nn.dot_product_attention` differs from the mha_jax reference in two
places, and the adapter below bridges both:
  * its `is_causal` is aligned top-left (query i sees keys j <= i), ours
    bottom-right (query i sits at key position Tk - Tq + i). When Tq != Tk
    the adapter passes our `causal_mask(Tq, Tk)` as an explicit mask.
  * masked keys get a large negative logit, not -inf, so a query row with no
    allowed key averages V uniformly. The reference returns 0 there; the
    adapter zeroes such rows (found from the boolean mask). A row emptied
    only by a `bias` of -inf is NOT caught: jax then gives NaN. Pass
    forbidden keys as `mask=`, not as a -inf bias, on these paths.
It also needs Dv == Dh and one dtype for q, k and v (`jax_nn_limits`, which
the records state and `attend` checks before the call).
Neither path can return the weights, nor apply attention dropout.

Of the `score_rules` options, `scale` and `local_window` pass through
(jax.nn's `scale` and `local_window_size`; a window with Tq != Tk, query
positions or a user mask becomes an explicit mask, since jax's window is
top-left aligned and the empty rows must be found); segment ids, soft
caps, sinks and ALiBi have no jax.nn counterpart and are refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.core import attention_path
from mha_jax.core import masks as masks_lib
from mha_jax.core import precision
from mha_jax.core import score_rules

# cuDNN's fused attention takes these dtypes only (check_layout).
_HALF = frozenset({"float16", "bfloat16"})


def jax_nn_limits(call, device) -> str | None:
  """Why the adapter to jax.nn cannot take `call` (a `call.Call`; None
  when it can): it needs one dtype for q, k and v, and Dv == Dh."""
  del device  # the same on every backend
  if len(set(call.dtypes)) != 1:
    return f"q, k, v must share one dtype, got {', '.join(call.dtypes)}"
  if call.value_width != call.head_dim:
    return ("mha_jax's jax.nn.dot_product_attention adapter needs value "
            f"width Dv == Dh, got Dv={call.value_width}, Dh={call.head_dim}")
  return None


def cudnn_limits(call, device) -> str | None:
  """Why cuDNN cannot take `call` on `device` (a `call.Device`; None when
  it can). JAX's own limits (jax 0.10): `check_layout` and
  `check_is_flash_attention` in jax/_src/cudnn/fused_attention_stablehlo.py,
  and `is_causal` of `dot_product_attention` in jax/_src/nn/functions.py,
  stated here so that a call is refused in words instead of failing deep
  inside jax.nn."""
  dtypes, head_dim = call.dtypes, call.head_dim
  q_len, kv_len = call.q_len, call.kv_len
  if not device.cudnn:
    return "no cuDNN on this GPU (not a CUDA device)"
  if len(set(dtypes)) == 1 and dtypes[0] not in _HALF:
    return (f"cuDNN's fused attention takes float16/bfloat16 only "
            f"(check_layout), got {dtypes[0]}")
  why = jax_nn_limits(call, device)
  if why is not None:
    return why
  capability = device.capability
  hopper = capability is not None and tuple(capability) >= (9, 0)
  h_max = 256 if hopper else 128
  if head_dim > h_max or head_dim % 8:
    where = ("compute capability >= 9.0" if hopper else
             "before compute capability 9.0" if capability is not None
             else "compute capability unknown, so the pre-Hopper limit")
    return (f"head width Dh={head_dim} must be <= {h_max} and a multiple of "
            f"8 ({where}; check_is_flash_attention)")
  if call.is_causal and q_len != kv_len:
    return (f"jax's is_causal is top-left aligned (tril of [Tq, Tk]); ours is "
            f"bottom-right, which differs when Tq={q_len} != Tk={kv_len} and "
            "would need a dense [Tq, Tk] mask, losing the kernel's causal "
            "block skipping")
  if call.masked:
    if call.trailing != (q_len, kv_len):
      return ("a mask/bias reaches cuDNN as a bias that must span [Tq, Tk] in "
              f"its last two axes (check_layout); these broadcast to "
              f"{call.trailing}")
    if q_len % 2 or kv_len % 2:
      return ("with a mask/bias cuDNN's backward needs even Tq and Tk "
              f"(check_is_flash_attention), got Tq={q_len}, Tk={kv_len}")
  return None


def _attend_jax_nn(q, k, v, mask, bias, keep, *, is_causal, backend,
                   rules=score_rules.NO_RULES):
  """Shared body of the "xla" and "cudnn" entries."""
  del keep  # None: both records refuse dropout; the limits
  # (`jax_nn_limits`, `cudnn_limits`) were checked by `attend`
  tq, tk = q.shape[1], k.shape[1]
  mask = None if mask is None else jnp.reshape(
      mask, (1,) * (4 - mask.ndim) + mask.shape)  # [b?, h?, tq?, tk?]
  window = rules.local_window
  if window is not None and (tq != tk or mask is not None or
                             rules.q_positions is not None):
    # The window (and causality) from true positions, as an explicit mask.
    q_pos = (score_rules.default_q_positions(tq, tk)[None, None]
             if rules.q_positions is None else rules.q_positions[:, None])
    mask = score_rules.allowed(q_pos, jnp.arange(tk), mask=mask,
                               is_causal=is_causal, rules=rules)
    window, is_causal = None, False
  elif rules.q_positions is not None and is_causal:
    q_pos = rules.q_positions[:, None]  # [B, 1, Tq]
    mask = score_rules.allowed(q_pos, jnp.arange(tk), mask=mask,
                               is_causal=True)
    is_causal = False
  native_causal = is_causal
  if is_causal and (tq != tk or mask is not None):
    # Bottom-right causality as an explicit mask (also needed to find the
    # empty rows below when a user mask is combined with it).
    mask = masks_lib.combine_masks(
        mask, masks_lib.causal_mask(tq, tk)[None, None])
    native_causal = False
  if bias is not None:
    bias = jnp.reshape(bias, (1,) * (4 - bias.ndim) + bias.shape)
  # jax.nn's own einsums take JAX's default precision (TF32 on NVIDIA
  # GPUs); the scope holds them to the library's (core/precision.py).
  with precision.scope(q, k, v):
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, is_causal=native_causal,
        scale=rules.scale, local_window_size=window, implementation=backend)
  if mask is not None:
    # Zero the rows with no allowed key (jax averages V there).
    has_key = jnp.any(mask, axis=-1, keepdims=True)  # [b?, h?, tq?, 1]
    out = jnp.where(has_key.transpose(0, 2, 1, 3), out, 0)  # [B, Tq, H, Dv]
  return out, None


def attend_xla(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
               rules=score_rules.NO_RULES):
  """The path "xla": jax.nn's XLA attention."""
  del dropout_rate
  return _attend_jax_nn(q, k, v, mask, bias, keep, is_causal=is_causal,
                        backend="xla", rules=rules)


def attend_cudnn(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                 rules=score_rules.NO_RULES):
  """The path "cudnn": cuDNN flash attention (GPU only)."""
  del dropout_rate
  return _attend_jax_nn(q, k, v, mask, bias, keep, is_causal=is_causal,
                        backend="cudnn", rules=rules)


# The options the adapter above passes to jax.nn; the others (segment
# ids, soft caps, sinks, ALiBi, the user rules) have no jax.nn
# counterpart and are refused by name. `auto` sends windows to "xla",
# whose window it has run, and not to "cudnn", whose window goes through
# the same jax.nn call but has not been run on a GPU here.
_JAX_NN_RULES = frozenset({"scale", "local_window", "q_positions"})
_NO_DROPOUT = "jax.nn.dot_product_attention has none"
XLA = attention_path.AttentionPath(
    name="xla", fn=attend_xla, rules=_JAX_NN_RULES,
    auto_rules={"scale", "local_window"}, dense_scores="input",
    limits=jax_nn_limits, why_no_dropout=_NO_DROPOUT,
    computes="jax.nn.dot_product_attention's XLA path")
CUDNN = attention_path.AttentionPath(
    name="cudnn", fn=attend_cudnn, rules=_JAX_NN_RULES, auto_rules={"scale"},
    backends=frozenset({"gpu"}), limits=cudnn_limits,
    why_no_dropout=_NO_DROPOUT,
    computes="cuDNN's fused attention (jax.nn, implementation='cudnn')")
