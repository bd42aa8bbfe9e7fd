"""Flax NNX modules that own attention parameters and call the pure core.

Shape letters: B batch, Tq query length, Tk key/value length, S cache
slots, D d_model, H query heads, K key/value heads, Dh per-head width.

`MultiHeadAttention` stores exactly the arrays of `init_mha_params` (w_q, w_k,
w_v, w_o and, with biases, b_q, b_k, b_v, b_o) as `nnx.Param`s and does no
math of its own: every call, cached or not, rotary or not, runs the core's
one attention path `multi_head.attention_layer` on `core_params()`.
With `cache=` it takes this layer's `KVCache` and returns the new one;
with `hooks=` its hook sites (`q`, `k`, `v`, `scores`, `pattern`, `z`,
`result`; see `mha_jax.hooks`) can be read or replaced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mha_jax.core import attention
from mha_jax import hooks as hooks_lib
from mha_jax.core import kv_cache
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.core import score_rules

_PARAM_NAMES = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o",
                "q_norm", "k_norm", "sinks")


class MultiHeadAttention(nnx.Module):
  """Self- or cross-attention over the pure core.

  Args:
    d_model: D, input and output width.
    num_heads: H query heads.
    num_kv_heads: K key/value heads (None: K = H; K < H grouped-query,
      K = 1 multi-query).
    head_dim: Dh (None: D // H).
    use_bias: add b_q, b_k, b_v, b_o.
    out_bias: with `use_bias`, False drops b_o (Qwen2's q, k, v biases).
    dropout_rate: attention-weight dropout, applied only when a call passes
      `deterministic=False` and a `dropout_rng`.
    rotary: rotate q and k by their positions (RoPE) before the scores.
    rotary_base: the RoPE frequency base; rotary_dim, rotary_scaling: as
      in `rotary.apply_rotary` (GPT-NeoX's partial rotary, Llama 3's
      frequencies).
    implementation: the core's `attend` path (a key of
      `attention.IMPLEMENTATIONS`; only "vmap" and "einsum" form weights).
    local_window: `(left, right)`: sliding-window attention (keys at most
      `left` before and `right` after the query's position).
    soft_cap: c > 0: scores become `c * tanh(s / c)` (Gemma 2).
    scale: the multiplier of q.k (None: 1 / sqrt(Dh)).
    sinks: learn one sink logit per head (`sinks [H]`, starting at 0): an
      "attend to nothing" softmax column (gpt-oss).
    qk_norm: None, "rms" (RMSNorm, OLMo 2 / Gemma 3) or "layer" (LayerNorm
      without bias, Flax's `normalize_qk`) on q and k per head, with a
      learned scale `[Dh]` shared by the heads (`q_norm`, `k_norm`).
    qk_norm_eps, qk_norm_offset: that norm's epsilon, and the offset its
      scale is added to (Gemma 3's (1 + w): 1; the scales then start at
      1 - offset, so a new layer's norm still multiplies by 1).
    alibi: add ALiBi's `-slope_h |i - j|` with the paper's slopes (H must
      be a power of two).
    dtype: compute dtype (params and inputs are cast to it; the core keeps
      the softmax in float32). None: the param dtype.
    param_dtype: storage dtype of the parameters.
    rngs: `nnx.Rngs` with a `params` stream.
  """

  def __init__(self, d_model: int, num_heads: int, *,
               num_kv_heads: int | None = None, head_dim: int | None = None,
               use_bias: bool = False, out_bias: bool = True,
               dropout_rate: float = 0.0,
               rotary: bool = False, rotary_base: float = 10000.0,
               rotary_dim: int | None = None, rotary_scaling=None,
               implementation: str = "vmap", local_window=None,
               soft_cap=None, scale=None, sinks: bool = False,
               qk_norm: str | None = None, qk_norm_eps: float = 1e-6,
               qk_norm_offset: float = 0.0, alibi: bool = False,
               dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if not attention.known_implementation(implementation):
      raise ValueError(f"MultiHeadAttention: unknown `implementation`="
                       f"{implementation!r}; expected one of "
                       f"{sorted(attention.IMPLEMENTATIONS)}")
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"MultiHeadAttention: `dropout_rate` must be in [0, 1),"
                       f" got {dropout_rate}")
    if qk_norm is not None and qk_norm not in multi_head.QK_NORMS:
      raise ValueError(f"MultiHeadAttention: `qk_norm` must be None or one "
                       f"of {multi_head.QK_NORMS}, got {qk_norm!r}")
    core = params_lib.init_mha_params(
        rngs.params(), d_model, num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, use_bias=use_bias, dtype=param_dtype)
    if use_bias and not out_bias:
      del core["b_o"]
    dh = core["w_q"].shape[-1]
    if qk_norm is not None:
      core["q_norm"] = jnp.full((dh,), 1.0 - qk_norm_offset, param_dtype)
      core["k_norm"] = jnp.full((dh,), 1.0 - qk_norm_offset, param_dtype)
    if sinks:
      core["sinks"] = jnp.zeros((num_heads,), param_dtype)
    for name, arr in core.items():
      setattr(self, name, nnx.Param(arr))
    self.dims = params_lib.mha_dims(core)
    # The static score rules, checked now so that a bad option fails at
    # construction (the arrays come per call).
    self.local_window = None if local_window is None else tuple(local_window)
    self.soft_cap, self.scale = soft_cap, scale
    if alibi:
      score_rules.alibi_slopes(num_heads)  # raises for a head count it lacks
    self.alibi = alibi
    score_rules.check(self._rules(), batch=1, q_len=1, kv_len=1,
                      num_heads=num_heads, fn="MultiHeadAttention")
    self.qk_norm = qk_norm
    self.qk_norm_eps, self.qk_norm_offset = qk_norm_eps, qk_norm_offset
    if rotary and self.dims.head_dim % 2:
      raise ValueError(f"MultiHeadAttention: rotary positions need an even "
                       f"`head_dim`, got {self.dims.head_dim}")
    self.dropout_rate = dropout_rate
    self.rotary = rotary
    self.rotary_base = rotary_base
    self.rotary_dim, self.rotary_scaling = rotary_dim, rotary_scaling
    self.implementation = implementation
    self.dtype = dtype

  def _rules(self, segment_ids=None, kv_segment_ids=None):
    """This layer's `ScoreRules` for one call."""
    return score_rules.ScoreRules(
        local_window=self.local_window, soft_cap=self.soft_cap,
        scale=self.scale, q_segment_ids=segment_ids,
        kv_segment_ids=kv_segment_ids,
        alibi_slopes=(score_rules.alibi_slopes(self.dims.num_heads)
                      if self.alibi else None))

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

  def __call__(self, x_q, x_kv=None, *, mask=None, is_causal=False,
               positions=None, kv_positions=None, head_mask=None,
               cache=None, lengths=None, hooks=None, deterministic=True,
               dropout_rng=None, return_weights=False, segment_ids=None,
               kv_segment_ids=None):
    """Attend from `x_q [B,Tq,D]` to `x_kv [B,Tk,D]` (None: self-attention).

    `mask` (bool, True = may attend) broadcasts to `[B, H, Tq, Tk]`;
    `is_causal` adds the bottom-right causal rule. `positions [B, Tq]` and
    `kv_positions [B, Tk]` are used only with `rotary` (default: 0..T-1,
    or each row's next slots with a cache; `kv_positions` defaults to
    `positions` for self-attention). `head_mask [H]` or `[B, H]` scales
    each head's output `z` (ablation / importance). `cache`: this layer's
    `KVCache` for causal self-attention over it (`lengths [B]`: real new
    tokens per row). `hooks`: a `mha_jax.hooks.Hooks` view of this layer.
    `segment_ids [B, Tq]` (int): packed sequences, each token attends only
    within its segment; `kv_segment_ids [B, Tk]` for cross-attention
    (default: `segment_ids`).

    Returns `y [B,Tq,D]`, then the new cache when one was passed, then the
    weights `[B,H,Tq,Tk]` (the `pattern`) with `return_weights`.
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
    rate = 0.0 if deterministic else self.dropout_rate
    if rate > 0.0 and dropout_rng is None:
      raise ValueError(f"{fn}: `deterministic=False` with dropout needs "
                       "`dropout_rng`")
    hooks = multi_head.with_layer_options(
        hooks_lib.NO_HOOKS if hooks is None else hooks, self.implementation,
        head_mask, return_weights, fn=fn)
    y, new_cache = multi_head.attention_layer(
        params, x_q, x_kv, mask=mask, is_causal=is_causal,
        implementation=self.implementation,
        rotary_base=self.rotary_base if self.rotary else None,
        rotary_dim=self.rotary_dim, rotary_scaling=self.rotary_scaling,
        positions=positions, kv_positions=kv_positions, cache=cache,
        lengths=lengths, dropout_rate=rate, dropout_rng=dropout_rng,
        hooks=hooks, qk_norm=self.qk_norm or "rms",
        qk_norm_eps=self.qk_norm_eps, qk_norm_offset=self.qk_norm_offset,
        rules=self._rules(segment_ids, segment_ids if kv_segment_ids is None
                          else kv_segment_ids))
    out = (y,) + ((new_cache,) if cache is not None else ())
    if return_weights:
      out += (hooks.read("pattern"),)
    return out[0] if len(out) == 1 else out
