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
It also needs Dv == Dh and one dtype for q, k and v; other inputs raise.
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

def _check(q, k, v, backend):
  """The limits of jax.nn's call that its records cannot state."""
  fn = f"attend(implementation={backend!r})"
  if v.shape[-1] != q.shape[-1]:
    raise ValueError(f"{fn}: needs value width Dv equal to head width Dh; "
                     f"got q {q.shape}, v {v.shape}")
  if not q.dtype == k.dtype == v.dtype:
    raise TypeError(f"{fn}: q, k, v must share one dtype; got {q.dtype}, "
                    f"{k.dtype}, {v.dtype}")


def _attend_jax_nn(q, k, v, mask, bias, keep, *, is_causal, backend,
                   rules=score_rules.NO_RULES):
  """Shared body of the "xla" and "cudnn" entries."""
  del keep  # None: both records refuse dropout
  _check(q, k, v, backend)
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
    why_no_dropout=_NO_DROPOUT,
    computes="jax.nn.dot_product_attention's XLA path")
CUDNN = attention_path.AttentionPath(
    name="cudnn", fn=attend_cudnn, rules=_JAX_NN_RULES, auto_rules={"scale"},
    backends=frozenset({"gpu"}), why_no_dropout=_NO_DROPOUT,
    computes="cuDNN's fused attention (jax.nn, implementation='cudnn')")
