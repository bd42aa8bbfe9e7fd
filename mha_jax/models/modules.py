"""Flax NNX modules that own attention parameters and call the pure core.

Shape letters: B batch, Tq query length, Tk key/value length, S cache
slots, D d_model, H query heads, K key/value heads, Dh per-head width.

`MultiHeadAttention` stores exactly the arrays of `init_mha_params` (w_q, w_k,
w_v, w_o and, with biases, b_q, b_k, b_v, b_o) as `nnx.Param`s and does no
math of its own: every call, cached or not, rotary or not, runs the core's
one attention path `multi_head.attention_layer` on `core_params()` and
its `AttentionSpec`, and returns what that returns, `(y, cache or None)`.
With `cache=` it takes this layer's `KVCache` and returns the new one;
with `hooks=` its hook sites (`q`, `k`, `v`, `scores`, `pattern`, `z`,
`result`; see `mha_jax.hooks`) can be read or replaced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax import hooks as hooks_lib
from mha_jax.core import kv_cache
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.core import score_rules
from mha_jax.core.attention_spec import AttentionSpec

_PARAM_NAMES = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o",
                "q_norm", "k_norm", "sinks")


class MultiHeadAttention(nnx.Module):
  """Self- or cross-attention over the pure core, as `spec` describes it.

  Args:
    spec: the layer's `AttentionSpec` (widths, path, causality, dropout,
      score rules, QK-norm, rotary positions), validated when built;
      `ModelConfig.attention_spec(layer)` gives a model's.
    dtype: compute dtype (params and inputs are cast to it; the core keeps
      the softmax in float32). None: the param dtype.
    param_dtype: storage dtype of the parameters.
    rngs: `nnx.Rngs` with a `params` stream.

  The parameters are those of `init_mha_params` for the spec's widths and
  biases, plus `q_norm`, `k_norm [Dh]` with QK-norm (starting at 1 -
  offset, so that a new layer's norm multiplies by 1) and `sinks [H]`
  (starting at 0) with sinks.
  """

  def __init__(self, spec: AttentionSpec, *, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if not isinstance(spec, AttentionSpec):
      raise TypeError(f"MultiHeadAttention: `spec` must be an AttentionSpec,"
                      f" got {type(spec).__name__}")
    core = params_lib.init_mha_params(
        rngs.params(), spec.d_model, spec.num_heads,
        num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
        use_bias=spec.use_bias, dtype=param_dtype)
    if spec.use_bias and not spec.out_bias:
      del core["b_o"]
    if spec.qk_norm is not None:
      start = 1.0 - spec.qk_norm_offset
      core["q_norm"] = jnp.full((spec.head_dim,), start, param_dtype)
      core["k_norm"] = jnp.full((spec.head_dim,), start, param_dtype)
    if spec.sinks:
      core["sinks"] = jnp.zeros((spec.num_heads,), param_dtype)
    for name, arr in core.items():
      setattr(self, name, nnx.Param(arr))
    self.spec = spec
    self.dims = params_lib.mha_dims(core)
    self.dtype = dtype

  def core_params(self) -> dict[str, jax.Array]:
    """The plain params dict (`init_mha_params` layout), in compute dtype."""
    out = {}
    for name in _PARAM_NAMES:
      if hasattr(self, name):
        arr = getattr(self, name)[...]
        out[name] = arr if self.dtype is None else arr.astype(self.dtype)
    return out

  def init_cache(self, batch: int, max_len: int) -> kv_cache.KVCache:
    """An empty cache for this layer, in its compute dtype."""
    dtype = self.w_k[...].dtype if self.dtype is None else self.dtype
    return kv_cache.init_cache(batch, max_len, self.dims.num_kv_heads,
                               self.dims.head_dim, self.dims.value_dim, dtype)

  def __call__(self, x_q, x_kv=None, *, mask=None, positions=None,
               kv_positions=None, head_mask=None, cache=None, lengths=None,
               hooks=None, deterministic=True, dropout_rng=None,
               segment_ids=None, kv_segment_ids=None, score_mod=None,
               mask_mod=None, block_mask=None):
    """Attend from `x_q [B,Tq,D]` to `x_kv [B,Tk,D]` (None: self-attention).

    `mask` (bool, True = may attend) broadcasts to `[B, H, Tq, Tk]`; the
    spec's `causal` adds the bottom-right causal rule. `positions [B, Tq]`
    and `kv_positions [B, Tk]` are used only with rotary positions
    (default: 0..T-1, or each row's next slots with a cache;
    `kv_positions` defaults to `positions` for self-attention).
    `head_mask [H]` or `[B, H]` scales each head's output `z` (ablation /
    importance). `cache`: this layer's `KVCache` for causal
    self-attention over it (`lengths [B]`: real new tokens per row).
    `hooks`: a `mha_jax.hooks.Hooks` view of this layer; capture
    `pattern` there to read the weights. `segment_ids [B, Tq]` (int):
    packed sequences, each token attends only within its segment;
    `kv_segment_ids [B, Tk]` for cross-attention (default: `segment_ids`).
    `score_mod`, `mask_mod`, `block_mask`: user rules of this call
    (`score_rules.ScoreRules`), for a layer whose spec has none; a rule
    closing over this call's arrays (a learned table) gets gradients.

    Returns `(y [B, Tq, D], new cache or None)`, as `attention_layer`.
    """
    params = self.core_params()
    fn = "MultiHeadAttention"
    multi_head.check_inputs(params, x_q, x_kv, head_mask, fn=fn)
    if jnp.ndim(x_q) != 3:
      raise ValueError(f"{fn}: `x_q` must be batched [B, T, D], got "
                       f"{jnp.shape(x_q)}")
    if cache is not None:
      if x_kv is not None:
        raise ValueError(f"{fn}: a `cache` holds this layer's own keys; "
                         "cross-attention (`x_kv`) takes none")
      kv_cache.check_cache(cache, x_q, self.dims, lengths, fn)
    if self.dtype is not None:
      x_q = jnp.asarray(x_q).astype(self.dtype)
      x_kv = None if x_kv is None else jnp.asarray(x_kv).astype(self.dtype)
    if (not deterministic and self.spec.dropout_rate > 0.0
        and dropout_rng is None):
      raise ValueError(f"{fn}: `deterministic=False` with dropout needs "
                       "`dropout_rng`")
    hooks = multi_head.with_layer_options(
        hooks_lib.NO_HOOKS if hooks is None else hooks,
        self.spec.implementation, head_mask, fn=fn)
    if kv_segment_ids is None:
      kv_segment_ids = segment_ids
    rules = score_rules.ScoreRules(q_segment_ids=segment_ids,
                                   kv_segment_ids=kv_segment_ids,
                                   score_mod=score_mod, mask_mod=mask_mod,
                                   block_mask=block_mask)
    return multi_head.attention_layer(
        params, x_q, x_kv, spec=self.spec, mask=mask, positions=positions,
        kv_positions=kv_positions, cache=cache, lengths=lengths,
        deterministic=deterministic, dropout_rng=dropout_rng, hooks=hooks,
        rules=rules)
