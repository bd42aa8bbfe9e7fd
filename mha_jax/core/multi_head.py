"""Multi-head attention: the source's five stages as small pure functions.

Shape letters: B batch, Tq query length, Tk key/value length, D d_model,
H query heads, K key/value heads, Dh per-head query/key width, Dv per-head
value width.

    1. project      x [B,T,D] @ W [D, H*Dh]        -> [B, T, H*Dh]
    2. split_heads  [B, T, H*Dh]                    -> [B, T, H, Dh]
    3. attend       per head (jax.vmap over heads)  -> [B, Tq, H, Dv]
    4. merge_heads  [B, Tq, H, Dv]                  -> [B, Tq, H*Dv]
    5. project_out  [B, Tq, H*Dv] @ W^O [H*Dv, D]   -> [B, Tq, D]

`attention_layer` runs them in that order for every attention call in the
project (the NNX module, cached decoding, the functions below), with the
hook sites of `mha_jax.hooks` between the stages. Nothing here is jitted:
callers apply `jax.jit` at the outside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.core import precision
from mha_jax.core import attention
from mha_jax.core import attention_spec
from mha_jax import hooks as hooks_lib
from mha_jax.core import kv_cache
from mha_jax.core import masks as masks_lib
from mha_jax.core import params as params_lib
from mha_jax.core import rotary
from mha_jax.core import score_rules
from mha_jax.core import weight_product

QK_NORMS = attention_spec.QK_NORMS
_NORM_EPS = attention_spec.NORM_EPS


def qk_normalize(x: jax.Array, scale: jax.Array, kind: str, *,
                 eps: float = _NORM_EPS, offset: float = 0.0) -> jax.Array:
  """QK-norm of q or k `[B, T, heads, Dh]` over Dh, times
  `offset + scale [Dh]`.

  "rms": x / rms(x) (OLMo 2, Gemma 3); "layer": (x - mean) / std, no bias
  (ViT-22B; Flax's `normalize_qk`). Statistics in float32. `eps` and
  `offset` are the model's own norm's (Gemma 3: its rms_norm_eps and
  (1 + w)); the offset is added in float32, as Gemma's code does, since
  (1 + w) rounded to bf16 would lose w's low bits.
  """
  scale = offset + scale.astype(jnp.float32) if offset else scale
  return normalize(x, scale, kind, eps=eps)


def normalize(x: jax.Array, scale: jax.Array, kind: str, *,
              eps: float = _NORM_EPS, dtype=None) -> jax.Array:
  """`x [..., N]` normalised over its last axis, times `scale [N]`.

  "rms": x / rms(x); "layer": (x - mean) / std, no bias. Statistics and
  the product in float32, cast once to `dtype` (default x's). QK-norm and
  the models' RMSNorm both use it.
  """
  xf = x.astype(jnp.float32)
  if kind == "layer":
    xf = xf - jnp.mean(xf, axis=-1, keepdims=True)
  elif kind != "rms":
    raise ValueError(f"normalize: `kind` must be one of {QK_NORMS}, got "
                     f"{kind!r}")
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  scale = jnp.reshape(scale.astype(jnp.float32), (1,) * (x.ndim - 1) + (-1,))
  return (xf * scale).astype(x.dtype if dtype is None else dtype)


def project(x: jax.Array, w: jax.Array, b: jax.Array | None = None):
  """Stage 1: one fused projection `x [B,T,D] @ w [D, heads*dim]`."""
  d, heads, dim = w.shape
  y = weight_product.product(x, w.reshape(d, heads * dim))  # [B,T,heads*dim]
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
  y = weight_product.product(concat, w_o.reshape(h * dv, d))  # [B, T, D]
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


def project_heads(params, z, hooks=hooks_lib.NO_HOOKS):
  """Stages 4-5 on each head's output `z [B, Tq, H, Dv]` -> `[B, Tq, D]`.

  The `result` site `[B, Tq, H, D]` (head h's own term z_h @ W^O_h) is
  formed only when a hook asks for it, beside the usual fused product,
  which still gives the output. A patch of `result` moves the output by
  the change of the terms, `sum_h (new_h - clean_h)`: the output is then
  the sum of the new terms plus b_o, and patching in the clean terms
  changes no bit.
  """
  w_o, b_o = params["w_o"], params.get("b_o")
  y = project_out(merge_heads(z), w_o, b_o)
  if not hooks.wants("result"):
    return y
  # The barriers keep XLA from fusing this product with its neighbours,
  # which otherwise changed the rounding of some terms from one compiled
  # program to another: captured in one program and subtracted in another,
  # they must have the same bits for a patch with them to be exact.
  zb, wb = jax.lax.optimization_barrier((z, w_o))
  clean = jax.lax.optimization_barrier(
      precision.einsum("bqhe,hed->bqhd", zb, wb))
  result = hooks("result", clean)
  if not hooks.patches("result"):
    return y
  return y + jnp.sum(result - clean, axis=2)


def _layer_rules(spec, params, rules, fn="attention_layer"):
  """The call's `ScoreRules`: the array-valued `rules` of the call
  (segment ids; for direct use also ALiBi slopes or query positions) with
  the spec's static rules, ALiBi's slopes and the params' sink logits."""
  own = spec.rules()
  static = score_rules.static(own)
  for name, value in static.items():
    given = getattr(rules, name)
    if name in score_rules.USER_FIELDS and value is None:
      static[name] = given  # a user rule may come with the call
    elif given is not None and given != value:
      raise ValueError(f"{fn}: `rules.{name}`={given!r} differs from the "
                       f"spec's {value!r}; set it in the AttentionSpec")
  rules = rules.replace(**static)
  if own.alibi_slopes is not None:
    if rules.alibi_slopes is not None:
      raise ValueError(f"{fn}: the spec's `alibi` gives the paper's slopes;"
                       " pass `rules.alibi_slopes` without it")
    rules = rules.replace(alibi_slopes=own.alibi_slopes)
  if spec.sinks:
    rules = rules.replace(sinks=params["sinks"])
  return rules


def check_spec_params(spec, params, fn="attention_layer"):
  """Raise naming `fn` unless `params` hold the arrays `spec` describes
  (widths, QK-norm scales, sink logits): a spec and params from two
  layers would otherwise fail deep inside the math or silently differ."""
  dims = params_lib.mha_dims(params)
  want = (spec.d_model, spec.num_heads, spec.num_kv_heads, spec.head_dim)
  got = (dims.d_model, dims.num_heads, dims.num_kv_heads, dims.head_dim)
  if want != got:
    raise ValueError(f"{fn}: the spec's (D, H, K, Dh)={want} do not match "
                     f"the params' {got}")
  for flag, names in ((spec.qk_norm is not None, ("q_norm", "k_norm")),
                      (spec.sinks, ("sinks",))):
    for name in names:
      if flag != (name in params):
        raise ValueError(f"{fn}: params {'lack' if flag else 'hold'} "
                         f"`{name}`, which the spec "
                         f"{'asks for' if flag else 'does not'}")


def attention_layer(params, x_q, x_kv=None, *, spec=None, mask=None,
                    bias=None, positions=None, kv_positions=None,
                    cache=None, lengths=None, deterministic=True,
                    dropout_rng=None, hooks=hooks_lib.NO_HOOKS,
                    rules=score_rules.NO_RULES):
  """Every attention call, cached or not, rotary or not: one sequence.

  project q, k, v (stages 1-2) -> [QK-norm] -> rotate q and k (the one
  place for per-head transforms of q and k) -> [write k, v into the
  cache] -> attend
  (stage 3) -> merge and project out (stages 4-5), with the hook sites
  `q`, `k`, `v`, `scores`, `pattern`, `z`, `result` on the way.

  Args:
    params: one layer's dict (`init_mha_params`).
    x_q: `[B, Tq, D]`; x_kv: `[B, Tk, D]` or None (self-attention).
    spec: the layer's `AttentionSpec` (None: `AttentionSpec.of_params`,
      the plain layer of `params`): path, causality, dropout rate, score
      rules, QK-norm, rotary positions.
    mask, bias: as in `multi_head_attention`. With a cache, `mask`
      broadcasts to the slots `[B, H, Tq, S]` and causality is always by
      true position.
    positions: `[B, Tq]` or `[Tq]` positions of the queries (default
      0..Tq-1, or `length[b] + t` with a cache); kv_positions: those of
      the keys (default: `positions` for self-attention, else 0..Tk-1).
    cache: this layer's `KVCache` (self-attention only); lengths: `[B]`
      real new tokens per row (see `kv_cache.update`).
    deterministic, dropout_rng: dropout at `spec.dropout_rate` runs only
      when `deterministic` is False (and then needs `dropout_rng`).
    hooks: a `mha_jax.hooks.Hooks` view scoped to this layer.
    rules: the call's array-valued `ScoreRules` (segment ids; custom ALiBi
      slopes); the static ones are the spec's. With a cache the window
      and ALiBi use the tokens' true positions; segment ids are refused
      (a cache row holds one sequence).

  Returns:
    `(y [B, Tq, D], new cache or None)`. Rows of a sequence that ran past
    the cache are NaN, so an ignored overflow cannot go unnoticed.
  """
  if spec is None:
    spec = attention_spec.AttentionSpec.of_params(params)
  check_spec_params(spec, params)
  rules = _layer_rules(spec, params, rules)
  q, k, v = project_qkv(params, x_q, x_kv)  # [B,Tq,H,Dh], [B,Tk,K,D*]
  if spec.qk_norm is not None:
    norm = dict(eps=spec.qk_norm_eps, offset=spec.qk_norm_offset)
    q = qk_normalize(q, params["q_norm"], spec.qk_norm, **norm)
    k = qk_normalize(k, params["k_norm"], spec.qk_norm, **norm)
  if cache is not None and positions is None:
    positions = kv_cache.positions(cache, q.shape[1])
  if spec.rotary_base is not None:
    if positions is None:
      positions = jnp.arange(q.shape[1])
    if kv_positions is None:
      kv_positions = positions if x_kv is None else jnp.arange(k.shape[1])
    rope = dict(base=spec.rotary_base, rotary_dim=spec.rotary_dim,
                scaling=spec.rotary_scaling)
    q = rotary.apply_rotary(q, positions, **rope)
    k = rotary.apply_rotary(k, kv_positions, **rope)
  q, k, v = hooks("q", q), hooks("k", k), hooks("v", v)
  is_causal = spec.causal
  if cache is not None:
    if rules.segments:
      raise ValueError("attention_layer: segment ids do not apply with a "
                       "KV cache (a cache row holds one sequence; use "
                       "`lengths` for ragged rows)")
    if any(getattr(rules, n) is not None for n in (
        "local_window", "alibi_slopes", "score_mod", "mask_mod")):
      # Slot j holds the token at position j; the queries sit at theirs.
      rules = rules.replace(q_positions=kv_cache.positions(cache, q.shape[1]))
    # Attend over every slot; the cache's mask holds the causal rule.
    cache, visible = kv_cache.update(cache, k, v, lengths)
    k, v = cache.k, cache.v  # [B, S, K, D*]
    mask = masks_lib.combine_masks(mask, visible)
    is_causal = False
  z, _ = attention.attend(  # stage 3: [B, Tq, H, Dv]
      q, k, v, mask=mask, bias=bias, is_causal=is_causal,
      implementation=spec.implementation,
      dropout_rate=0.0 if deterministic else spec.dropout_rate,
      dropout_rng=dropout_rng, hooks=hooks, rules=rules)
  y = project_heads(params, hooks("z", z), hooks)  # stages 4-5
  if cache is not None:
    y = jnp.where(kv_cache.overflowed(cache)[:, None, None], jnp.nan, y)
  return y, cache


def check_inputs(params, x_q, x_kv=None, head_mask=None,
                 fn="multi_head_attention", qk_norm="rms"):
  """Validate everything that shapes can tell before tracing; returns the
  layer's `MHADims`. Errors name `fn`, the argument and what came."""
  dims = params_lib.mha_dims(params)
  if qk_norm not in QK_NORMS:
    raise ValueError(f"{fn}: `qk_norm` must be one of {QK_NORMS}, got "
                     f"{qk_norm!r}")
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


def with_layer_options(hooks, implementation, head_mask=None,
                       return_weights=False, fn="multi_head_attention"):
  """`hooks` plus what two call options mean in hook terms: `head_mask`
  is a patch of `z` (applied before a user's own patch of z) and
  `return_weights` a capture of `pattern` (read back with
  `hooks.read("pattern")`)."""
  if head_mask is not None:
    hooks = hooks.extend(patch={"z": hooks_lib.ScaleHeads(head_mask)})
  if return_weights:
    if not attention.forms_weights(implementation):
      raise ValueError(f"{fn}: return_weights=True is not possible: "
                       f"{attention.weightless_reason(implementation)}")
    hooks = hooks.extend(capture=("pattern",))
  return hooks


def site_names(implementation, prefix=""):
  """`(valid, unavailable)` hook names of one attention layer: the sites
  it forms, and the weight sites a weightless path lacks (with why)."""
  valid = tuple(f"{prefix}{s}" for s in hooks_lib.ATTENTION_SITES
                if attention.forms_weights(implementation)
                or s not in hooks_lib.WEIGHT_SITES)
  unavailable = {}
  if not attention.forms_weights(implementation):
    reason = attention.weightless_reason(implementation)
    unavailable = {f"{prefix}{s}": reason for s in hooks_lib.WEIGHT_SITES}
  return valid, unavailable


def multi_head_attention(params, x_q, x_kv=None, *, mask=None, bias=None,
                         is_causal=False,
                         implementation=attention.DEFAULT_IMPLEMENTATION,
                         return_weights=False, head_mask=None,
                         dropout_rate=0.0, dropout_rng=None, capture=(),
                         patch=None, rules=score_rules.NO_RULES,
                         qk_norm="rms"):
  """The source's MultiHead(X_q, X_kv) = Concat(head_1..head_h) W^O.

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
      rounding. Only "vmap" and "einsum" form the weights (`pattern`).
    return_weights: also return the attention weights `[B, H, Tq, Tk]`
      (the `pattern` site: float32 softmax, before dropout).
    head_mask: `[H]` or `[B, H]` multiplier on each head's output before the
      concatenation (0 ablates a head; a gradient w.r.t. it is the head's
      importance): a patch of the `z` site. Not part of the source.
    dropout_rate, dropout_rng: attention-weight dropout (training only).
    capture: site names to return (`"q"`, `"pattern"`, `"z"`, ... see
      `mha_jax.hooks`); patch: site name -> array or function.
    rules: `score_rules.ScoreRules`: local window, segment ids, soft cap,
      scale, ALiBi (sink logits come from `params["sinks"]`).
    qk_norm: "rms" or "layer": the QK-norm applied when `params` hold
      `q_norm`/`k_norm` scales (Flax's `normalize_qk` is "layer").

  Returns:
    out `[B, Tq, D]`; then, when asked, the dict of captured arrays, then
    the weights.
  """
  check_inputs(params, x_q, x_kv, head_mask, qk_norm=qk_norm)
  capture = (capture,) if isinstance(capture, str) else tuple(capture)
  valid, unavailable = site_names(implementation)
  hooks_lib.check_names(set(capture) | set(patch or {}), valid, unavailable)
  hooks = with_layer_options(hooks_lib.Hooks(capture, patch), implementation,
                             head_mask, return_weights)
  unbatched = jnp.ndim(x_q) == 2
  if unbatched:
    if patch:
      raise ValueError("multi_head_attention: `patch` needs batched inputs "
                       f"[B, T, D], got x_q {jnp.shape(x_q)}")
    x_q = x_q[None]
    x_kv = None if x_kv is None else x_kv[None]
  q, k, v = jax.eval_shape(project_qkv, params, x_q, x_kv)
  attention.check_attend_inputs(
      q, k, v, mask, bias, implementation, fn="multi_head_attention",
      rules=rules.replace(sinks=params.get("sinks")))
  # The keywords become the layer's spec (the static score rules with
  # them); the arrays of `rules` travel with the call.
  spec = attention_spec.AttentionSpec.of_params(
      params, implementation=implementation, causal=is_causal,
      dropout_rate=dropout_rate, qk_norm=qk_norm,
      **score_rules.static(rules))
  y, _ = attention_layer(
      params, x_q, x_kv, spec=spec, mask=mask, bias=bias,
      deterministic=False, dropout_rng=dropout_rng, hooks=hooks, rules=rules)
  captured = dict(hooks.captured)
  if unbatched:
    y = y[0]
    captured = {n: a[0] for n, a in captured.items()}
  return hooks_lib.outputs(
      y, {n: captured[n] for n in capture} if capture else None,
      captured["pattern"] if return_weights else None)


def cached_attention(params, x, cache, *, lengths=None, rotary_base=None,
                     implementation=attention.DEFAULT_IMPLEMENTATION,
                     rules=score_rules.NO_RULES, qk_norm="rms"):
  """Causal self-attention of new tokens `x [B, T, D]` over a `KVCache`.

  The pure form of what `MultiHeadAttention(...)(x, cache=)` runs. Token
  t of row b goes to slot `cache.length[b] + t`, which is also its
  position for `rotary_base`; `lengths [B]` (None: all T) counts each
  row's real new tokens (the rest is right padding, never written; its
  output is 0 before the output projection). `rules`, `qk_norm`: as in
  `multi_head_attention` (no segment ids: a cache row is one sequence).

  Returns `(y [B, T, D], new_cache, CacheStatus)`; rows of a sequence that
  ran past `max_len` are NaN and flagged in the status.
  """
  dims = params_lib.mha_dims(params)
  kv_cache.check_cache(cache, x, dims, lengths, "cached_attention")
  spec = attention_spec.AttentionSpec.of_params(
      params, implementation=implementation, causal=True,
      rotary_base=rotary_base, qk_norm=qk_norm, **score_rules.static(rules))
  y, cache = attention_layer(params, x, spec=spec, cache=cache,
                             lengths=lengths, rules=rules)
  return y, cache, kv_cache.status(cache)
