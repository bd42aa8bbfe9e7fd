"""Flax NNX modules that own attention parameters and call the pure core.

Shape letters: B batch, Tq query length, Tk key/value length, D d_model,
H query heads, K key/value heads, Dh per-head width.

`MultiHeadAttention` stores exactly the arrays of `init_mha_params` (w_q, w_k,
w_v, w_o and, with biases, b_q, b_k, b_v, b_o) as `nnx.Param`s and does no
math of its own: without rotary positions it calls `multi_head_attention`;
with rotary it calls the stage functions with `apply_rotary` between stage 2
and stage 3 (the only place rotation can go: it acts on q and k per head).

The seam for decoding with a cache: `core_params()` returns the plain params
dict and `rotary_base` says whether (and how) q/k are rotated, so a cached
path (`mha_jax.kv_cache.cached_attention(params, x, cache,
rotary_base=...)`) runs the same layer as pure functions of the same params;
`multi_head.attend_and_project` is the core's shared tail (stages 3-5) for
callers that change q/k/v between the stages.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax import attention
from mha_jax import multi_head
from mha_jax import params as params_lib
from mha_jax import rotary as rotary_lib

_PARAM_NAMES = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


class MultiHeadAttention(nnx.Module):
  """Self- or cross-attention over the pure core.

  Args:
    d_model: D, input and output width.
    num_heads: H query heads.
    num_kv_heads: K key/value heads (None: K = H; K < H grouped-query,
      K = 1 multi-query).
    head_dim: Dh (None: D // H).
    use_bias: add b_q, b_k, b_v, b_o.
    dropout_rate: attention-weight dropout, applied only when a call passes
      `deterministic=False` and a `dropout_rng`.
    rotary: rotate q and k by their positions (RoPE) before the scores.
    rotary_base: the RoPE frequency base.
    implementation: the core's `attend` path ("vmap" or "einsum").
    dtype: compute dtype (params and inputs are cast to it; the core keeps
      the softmax in float32). None: the param dtype.
    param_dtype: storage dtype of the parameters.
    rngs: `nnx.Rngs` with a `params` stream.
  """

  def __init__(self, d_model: int, num_heads: int, *,
               num_kv_heads: int | None = None, head_dim: int | None = None,
               use_bias: bool = False, dropout_rate: float = 0.0,
               rotary: bool = False, rotary_base: float = 10000.0,
               implementation: str = "vmap",
               dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if implementation not in attention.IMPLEMENTATIONS:
      raise ValueError(f"MultiHeadAttention: unknown `implementation`="
                       f"{implementation!r}; expected one of "
                       f"{sorted(attention.IMPLEMENTATIONS)}")
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"MultiHeadAttention: `dropout_rate` must be in [0, 1),"
                       f" got {dropout_rate}")
    core = params_lib.init_mha_params(
        rngs.params(), d_model, num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, use_bias=use_bias, dtype=param_dtype)
    for name, arr in core.items():
      setattr(self, name, nnx.Param(arr))
    self.dims = params_lib.mha_dims(core)
    if rotary and self.dims.head_dim % 2:
      raise ValueError(f"MultiHeadAttention: rotary positions need an even "
                       f"`head_dim`, got {self.dims.head_dim}")
    self.dropout_rate = dropout_rate
    self.rotary = rotary
    self._base = rotary_base
    self.implementation = implementation
    self.dtype = dtype

  @property
  def rotary_base(self) -> float | None:
    """RoPE base for pure cached paths; None when q/k are not rotated."""
    return self._base if self.rotary else None

  def core_params(self) -> dict[str, jax.Array]:
    """The plain params dict (`init_mha_params` layout), in compute dtype."""
    out = {}
    for name in _PARAM_NAMES:
      if hasattr(self, name):
        arr = getattr(self, name)[...]
        out[name] = arr if self.dtype is None else arr.astype(self.dtype)
    return out

  def __call__(self, x_q, x_kv=None, *, mask=None, is_causal=False,
               positions=None, kv_positions=None, head_mask=None,
               deterministic=True, dropout_rng=None, return_weights=False):
    """Attend from `x_q [B,Tq,D]` to `x_kv [B,Tk,D]` (None: self-attention).

    `mask` (bool, True = may attend) broadcasts to `[B, H, Tq, Tk]`;
    `is_causal` adds the bottom-right causal rule. `positions [B, Tq]` and
    `kv_positions [B, Tk]` are used only with `rotary` (default: 0..T-1;
    `kv_positions` defaults to `positions` for self-attention). `head_mask`
    `[H]` or `[B, H]` scales each head's output (ablation / importance).
    Returns `y [B,Tq,D]`, or `(y, weights [B,H,Tq,Tk])` with
    `return_weights`; the weights are the ones the output was computed
    from, so capturing them cannot change `y`.
    """
    params = self.core_params()
    if self.dtype is not None:
      x_q = jnp.asarray(x_q).astype(self.dtype)
      x_kv = None if x_kv is None else jnp.asarray(x_kv).astype(self.dtype)
    rate = 0.0 if deterministic else self.dropout_rate
    if rate > 0.0 and dropout_rng is None:
      raise ValueError("MultiHeadAttention: `deterministic=False` with "
                       "dropout needs `dropout_rng`")
    if not self.rotary:
      return multi_head.multi_head_attention(
          params, x_q, x_kv, mask=mask, is_causal=is_causal,
          implementation=self.implementation, return_weights=return_weights,
          head_mask=head_mask, dropout_rate=rate, dropout_rng=dropout_rng)
    # Rotary: the same stages, with q and k rotated after the head split.
    # The core's boundary checks, so bad inputs fail here with its messages.
    check = multi_head._check_inputs  # pylint: disable=protected-access
    check(params, x_q, x_kv, head_mask)
    if jnp.ndim(x_q) != 3:
      raise ValueError(f"MultiHeadAttention: rotary needs batched `x_q` "
                       f"[B, T, D], got {jnp.shape(x_q)}")
    q, k, v = multi_head.project_qkv(params, x_q, x_kv)  # [B, T, H|K, Dh]
    if positions is None:
      positions = jnp.arange(q.shape[1])
    if kv_positions is None:
      kv_positions = positions if x_kv is None else jnp.arange(k.shape[1])
    q = rotary_lib.apply_rotary(q, positions, base=self._base)
    k = rotary_lib.apply_rotary(k, kv_positions, base=self._base)
    attention.check_attend_inputs(q, k, v, mask, None, self.implementation,
                                  fn="MultiHeadAttention")
    y, weights = multi_head.attend_and_project(
        params, q, k, v, mask=mask, is_causal=is_causal, head_mask=head_mask,
        implementation=self.implementation, dropout_rate=rate,
        dropout_rng=dropout_rng)
    return (y, weights) if return_weights else y
