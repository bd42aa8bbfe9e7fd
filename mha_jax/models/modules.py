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
               hooks=None, deterministic=True, rngs=None,
               rules=score_rules.NO_RULES):
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
    `pattern` there to read the weights. `deterministic=False` runs the
    spec's dropout with a key from `rngs` (`dropout_key`).
    `rules`: this call's `score_rules.ScoreRules`, handed to
    `attention_layer` as it is: segment ids `[B, Tq]` / `[B, Tk]` (packed
    sequences; for self-attention the same ids twice), and the user
    rules `score_mod`, `mask_mod`, `block_mask` for a layer whose spec has
    none. A rule closing over this call's arrays (a learned table) gets
    gradients. The static rules (window, soft cap, scale) are the spec's.

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
    key = dropout_key(rngs, deterministic)
    if (not deterministic and self.spec.dropout_rate > 0.0
        and key is None):
      raise ValueError(f"{fn}: `deterministic=False` with dropout needs "
                       "`rngs` (an nnx.Rngs or a key)")
    hooks = multi_head.with_layer_options(
        hooks_lib.NO_HOOKS if hooks is None else hooks,
        self.spec.implementation, head_mask, fn=fn)
    return multi_head.attention_layer(
        params, x_q, x_kv, spec=self.spec, mask=mask, positions=positions,
        kv_positions=kv_positions, cache=cache, lengths=lengths,
        deterministic=deterministic, dropout_rng=key, hooks=hooks,
        rules=rules)


def dropout_key(rngs, deterministic: bool = False):
  """The dropout key a call draws from `rngs`, or None.

  `rngs` takes what `nnx.Dropout.__call__` takes: an `nnx.Rngs` (its
  `dropout` stream, else its `default` one), an `nnx.RngStream`, or a key
  (used as it is). A stream advances by one draw; under `jax.jit` pass a
  key (or use `nnx.jit`, which carries the stream's count). No draw when
  `deterministic` or `rngs` is None: an evaluation call leaves a stream
  where it was.

  The models draw once per call and derive each layer's key from that one
  by `jax.random.fold_in`, so a key gives the same dropout at every level
  whether it came in as a key or from the stream.
  """
  if deterministic or rngs is None:
    return None
  if isinstance(rngs, nnx.Rngs):
    return rngs.dropout()
  if isinstance(rngs, nnx.RngStream):
    return rngs()
  return rngs
