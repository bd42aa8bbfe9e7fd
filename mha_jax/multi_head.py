"""Multi-head attention: the seed's five stages as small pure functions.

Shape letters: B batch, Tq query length, Tk key/value length, D d_model,
H query heads, K key/value heads, Dh per-head query/key width, Dv per-head
value width.

    1. project      x [B,T,D] @ W [D, H*Dh]        -> [B, T, H*Dh]
    2. split_heads  [B, T, H*Dh]                    -> [B, T, H, Dh]
    3. attend       per head (jax.vmap over heads)  -> [B, Tq, H, Dv]
    4. merge_heads  [B, Tq, H, Dv]                  -> [B, Tq, H*Dv]
    5. project_out  [B, Tq, H*Dv] @ W^O [H*Dv, D]   -> [B, Tq, D]

Nothing here is jitted: callers apply `jax.jit` at the outside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax import attention
from mha_jax import params as params_lib


def project(x: jax.Array, w: jax.Array, b: jax.Array | None = None):
  """Stage 1: one fused projection `x [B,T,D] @ w [D, heads*dim]`."""
  d, heads, dim = w.shape
  y = x @ w.reshape(d, heads * dim)  # [B, T, heads*dim]
  if b is not None:
    y = y + b.reshape((1,) * (y.ndim - 1) + (heads * dim,))
  return y


def split_heads(y: jax.Array, num_heads: int) -> jax.Array:
  """Stage 2: `[B, T, heads*dim] -> [B, T, heads, dim]`, disjoint slices."""
  return y.reshape(*y.shape[:-1], num_heads, y.shape[-1] // num_heads)


def merge_heads(o: jax.Array) -> jax.Array:
  """Stage 4: concatenate heads, `[B, T, H, Dv] -> [B, T, H*Dv]`."""
  return o.reshape(*o.shape[:-2], o.shape[-2] * o.shape[-1])


def project_out(concat: jax.Array, w_o: jax.Array,
                b_o: jax.Array | None = None) -> jax.Array:
  """Stage 5: `[B, T, H*Dv] @ w_o [H*Dv, D]`, mixing information across heads."""
  h, dv, d = w_o.shape
  y = concat @ w_o.reshape(h * dv, d)  # [B, T, D]
  if b_o is not None:
    y = y + b_o.reshape((1,) * (y.ndim - 1) + (d,))
  return y


def project_qkv(params, x_q, x_kv=None):
  """Stages 1-2 for Q, K and V: returns q `[B,Tq,H,Dh]`, k, v `[B,Tk,K,D*]`."""
  x_kv = x_q if x_kv is None else x_kv
  h = params["w_q"].shape[1]
  kh = params["w_k"].shape[1]
  q = split_heads(project(x_q, params["w_q"], params.get("b_q")), h)
  k = split_heads(project(x_kv, params["w_k"], params.get("b_k")), kh)
  v = split_heads(project(x_kv, params["w_v"], params.get("b_v")), kh)
  return q, k, v


def attend_and_project(params, q, k, v, *, mask=None, bias=None,
                       is_causal=False, head_mask=None, implementation="vmap",
                       dropout_rate=0.0, dropout_rng=None):
  """Stages 3-5 on head-split q `[B,Tq,H,Dh]`, k/v `[B,Tk,K,D*]`.

  The tail of `multi_head_attention` (attend, optional head mask, merge,
  output projection), public for callers that change q/k/v between the
  stages (rotary positions, a key/value cache). Returns
  `(y [B, Tq, D], weights [B, H, Tq, Tk] or None)`.
  """
  out, weights = attention.attend(  # [B, Tq, H, Dv]
      q, k, v, mask=mask, bias=bias, is_causal=is_causal,
      implementation=implementation, dropout_rate=dropout_rate,
      dropout_rng=dropout_rng)
  if head_mask is not None:
    hm = jnp.asarray(head_mask, out.dtype)
    hm = hm[None] if hm.ndim == 1 else hm  # [B?, H]
    out = out * hm[:, None, :, None]
  y = project_out(merge_heads(out), params["w_o"], params.get("b_o"))
  return y, weights


def _check_inputs(params, x_q, x_kv, head_mask):
  """Validate everything that shapes can tell before tracing."""
  fn = "multi_head_attention"
  dims = params_lib.mha_dims(params)
  for name, x in (("x_q", x_q), ("x_kv", x_kv)):
    if x is None:
      continue
    if jnp.ndim(x) not in (2, 3):
      raise ValueError(f"{fn}: `{name}` must have shape [B, T, D] or [T, D], "
                       f"got {jnp.shape(x)}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
      raise TypeError(f"{fn}: `{name}` must be floating (embed integer tokens "
                      f"first), got {jnp.result_type(x)}")
    if jnp.shape(x)[-1] != dims.d_model:
      raise ValueError(f"{fn}: `{name}` has feature size {jnp.shape(x)[-1]} "
                       f"but params expect d_model={dims.d_model} (w_q shape "
                       f"{params['w_q'].shape})")
  if x_kv is not None:
    if jnp.ndim(x_kv) != jnp.ndim(x_q):
      raise ValueError(f"{fn}: `x_q` {jnp.shape(x_q)} and `x_kv` "
                       f"{jnp.shape(x_kv)} must both be batched or both not")
    if jnp.ndim(x_q) == 3 and x_q.shape[0] != x_kv.shape[0]:
      raise ValueError(f"{fn}: batch sizes differ: `x_q` {x_q.shape}, `x_kv` "
                       f"{x_kv.shape}")
  if head_mask is not None:
    hm = jnp.shape(head_mask)
    b = jnp.shape(x_q)[0] if jnp.ndim(x_q) == 3 else 1
    if hm not in ((dims.num_heads,), (b, dims.num_heads)):
      raise ValueError(f"{fn}: `head_mask` must have shape [H]=[{dims.num_heads}]"
                       f" or [B, H]=[{b}, {dims.num_heads}], got {hm}")
  return dims


def multi_head_attention(params, x_q, x_kv=None, *, mask=None, bias=None,
                         is_causal=False, implementation="vmap",
                         return_weights=False, head_mask=None,
                         dropout_rate=0.0, dropout_rng=None):
  """The seed's MultiHead(X_q, X_kv) = Concat(head_1..head_h) W^O.

  Args:
    params: dict from `init_mha_params` (`w_q [D,H,Dh]`, `w_k [D,K,Dh]`,
      `w_v [D,K,Dv]`, `w_o [H,Dv,D]`, optional biases).
    x_q: queries source `[B, Tq, D]` (or unbatched `[Tq, D]`).
    x_kv: keys/values source `[B, Tk, D]`; None for self-attention.
    mask: bool broadcastable to `[B, H, Tq, Tk]`, True = may attend.
    bias: float broadcastable to `[B, H, Tq, Tk]`, added to scaled scores.
    is_causal: also apply `causal_mask(Tq, Tk)` (bottom-right aligned)
      without materialising it as an input.
    implementation: "vmap" (reference: one head mapped with jax.vmap),
      "einsum" (fused), "flash" (blockwise online softmax, O(T) memory),
      "xla" / "cudnn" (jax.nn.dot_product_attention) or "auto" (the fastest
      of these for the backend); all give the same numbers up to float
      rounding. Only "vmap" and "einsum" can return weights.
    return_weights: also return the attention weights `[B, H, Tq, Tk]`.
    head_mask: `[H]` or `[B, H]` multiplier on each head's output before the
      concatenation (0 ablates a head; a gradient w.r.t. it is the head's
      importance). Not part of the seed; a research intervention.
    dropout_rate, dropout_rng: attention-weight dropout (training only).

  Returns:
    out `[B, Tq, D]`, or `(out, weights)` when `return_weights`.
  """
  _check_inputs(params, x_q, x_kv, head_mask)
  if return_weights and implementation in attention.WEIGHTLESS:
    raise ValueError(f"multi_head_attention: implementation="
                     f"{implementation!r} never forms the attention weights, "
                     "so return_weights=True is not possible; use 'vmap' or "
                     "'einsum' to inspect weights")
  unbatched = jnp.ndim(x_q) == 2
  if unbatched:
    x_q = x_q[None]
    x_kv = None if x_kv is None else x_kv[None]
  q, k, v = project_qkv(params, x_q, x_kv)  # stages 1-2
  attention.check_attend_inputs(q, k, v, mask, bias, implementation,
                                fn="multi_head_attention")
  y, weights = attend_and_project(  # stages 3-5
      params, q, k, v, mask=mask, bias=bias, is_causal=is_causal,
      head_mask=head_mask, implementation=implementation,
      dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  if unbatched:
    y = y[0]
    weights = None if weights is None else weights[0]
  return (y, weights) if return_weights else y
