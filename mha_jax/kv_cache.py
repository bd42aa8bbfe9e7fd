"""Key/value cache for autoregressive decoding, as pure functions.

Shape letters: B batch, T new tokens in this call, S cache slots (max_len),
D d_model, H query heads, K key/value heads, Dh per-head query/key width,
Dv per-head value width.

During decoding the keys and values of past tokens never change, so each layer
keeps them in a fixed-size buffer `[B, S, K, Dh]` and every call projects only
the NEW tokens. Every sequence has its own fill level `length[b]` (a ragged
batch), so a new token of sequence b lands in slot `length[b] + t` and sees
slots `0 .. length[b] + t`.

The buffer shape is static, so one jitted function serves every position:
positions are data, not shapes. The price is that attention always reads all
S slots (unwritten ones are masked out), so a step costs O(S), not O(length).

Writing past S is never wrapped or clamped: the tokens that do not fit are
dropped, the sequence's `length` still advances past S (so the overflow is
sticky), its outputs are NaN, and `CacheStatus.overflow[b]` is True. Check it
with `raise_if_overflow` outside jit or `check_no_overflow` under checkify.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from mha_jax import masks as masks_lib
from mha_jax import multi_head
from mha_jax import params as params_lib
from mha_jax import rotary


class KVCache(NamedTuple):
  """One attention layer's cache (a pytree, so it passes through jit)."""
  k: jax.Array  # [B, S, K, Dh]
  v: jax.Array  # [B, S, K, Dv]
  length: jax.Array  # [B] int32: slots filled per sequence

  @property
  def max_len(self) -> int:
    return self.k.shape[1]


class CacheStatus(NamedTuple):
  """What the caller must look at after a cached call."""
  overflow: jax.Array  # [B] bool: this sequence ran past max_len


def init_cache(batch: int, max_len: int, num_kv_heads: int, head_dim: int,
               value_dim: int | None = None, dtype=jnp.float32) -> KVCache:
  """An empty cache: zero buffers and `length` 0 for every sequence."""
  value_dim = head_dim if value_dim is None else value_dim
  for name, val in (("batch", batch), ("max_len", max_len),
                    ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                    ("value_dim", value_dim)):
    if not isinstance(val, int) or val < 1:
      raise ValueError(f"init_cache: `{name}` must be a positive int, got "
                       f"{val!r}")
  return KVCache(
      k=jnp.zeros((batch, max_len, num_kv_heads, head_dim), dtype),
      v=jnp.zeros((batch, max_len, num_kv_heads, value_dim), dtype),
      length=jnp.zeros((batch,), jnp.int32))


def init_cache_for(params, batch: int, max_len: int,
                   dtype=jnp.float32) -> KVCache:
  """An empty cache sized for the attention layer `params`."""
  dims = params_lib.mha_dims(params)
  return init_cache(batch, max_len, dims.num_kv_heads, dims.head_dim,
                    dims.value_dim, dtype)


def _check_inputs(params, x, cache, lengths, fn):
  """Shape checks that need no values; raise naming the argument."""
  dims = params_lib.mha_dims(params)
  if jnp.ndim(x) != 3 or x.shape[-1] != dims.d_model:
    raise ValueError(f"{fn}: `x` must have shape [B, T, D] with D="
                     f"{dims.d_model}, got {jnp.shape(x)}")
  if not isinstance(cache, KVCache):
    raise TypeError(f"{fn}: `cache` must be a KVCache (see init_cache), got "
                    f"{type(cache).__name__}")
  b = x.shape[0]
  want = {"k": (b, cache.max_len, dims.num_kv_heads, dims.head_dim),
          "v": (b, cache.max_len, dims.num_kv_heads, dims.value_dim),
          "length": (b,)}
  for name, shape in want.items():
    got = tuple(getattr(cache, name).shape)
    if got != shape:
      raise ValueError(f"{fn}: `cache.{name}` must have shape {shape} for x "
                       f"{x.shape} and params with K={dims.num_kv_heads}, "
                       f"got {got}")
  if lengths is not None:
    lengths = jnp.asarray(lengths)
    if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
      raise ValueError(f"{fn}: `lengths` must be an int array of shape [{b}],"
                       f" got {lengths.dtype} {lengths.shape}")
    if not isinstance(lengths, jax.core.Tracer):
      if bool(jnp.any((lengths < 0) | (lengths > x.shape[1]))):
        raise ValueError(f"{fn}: `lengths` must lie in [0, T={x.shape[1]}], "
                         f"got {lengths}")


def cached_attention(params, x, cache: KVCache, *, lengths=None,
                     rotary_base: float | None = None,
                     implementation: str = "einsum"):
  """Self-attention of new tokens `x [B, T, D]` over the cache plus themselves.

  Args:
    params: one attention layer's dict (`init_mha_params`), MHA, GQA or MQA.
    x: the new tokens' inputs, `[B, T, D]`; sequence b's first `lengths[b]`
      rows are real and the rest is right padding (never written, output 0
      before the output projection).
    cache: this layer's `KVCache`; new keys go to slots `length[b] + t`.
    lengths: `[B]` int, real new tokens per sequence; None means all T.
    rotary_base: if given, rotate q and k by each token's TRUE position
      `length[b] + t` (`apply_rotary`) before caching k.
    implementation: a key of `attention.IMPLEMENTATIONS`.

  Returns:
    `(out [B, T, D], new_cache, CacheStatus)`.
  """
  _check_inputs(params, x, cache, lengths, "cached_attention")
  b, t, _ = x.shape
  s = cache.max_len
  lengths = (jnp.full((b,), t, jnp.int32) if lengths is None
             else jnp.asarray(lengths, jnp.int32))
  pos = cache.length[:, None] + jnp.arange(t)[None, :]  # [B, T] true positions
  is_real = jnp.arange(t)[None, :] < lengths[:, None]  # [B, T]
  end = cache.length + lengths  # [B]

  q, k, v = multi_head.project_qkv(params, x)  # [B,T,H,Dh], [B,T,K,D*]
  if rotary_base is not None:
    q = rotary.apply_rotary(q, pos, base=rotary_base)
    k = rotary.apply_rotary(k, pos, base=rotary_base)

  # Scatter the new rows into their slots. Padding rows get index S, which
  # is out of bounds and dropped, so they never touch the cache; real rows
  # past S are dropped too and reported as overflow below (no wrap, no clamp).
  slot = jnp.where(is_real, pos, s)  # [B, T]
  row = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))  # [B, T]
  new_cache = KVCache(
      k=cache.k.at[row, slot].set(k.astype(cache.k.dtype), mode="drop"),
      v=cache.v.at[row, slot].set(v.astype(cache.v.dtype), mode="drop"),
      length=end)

  # Causal per sequence: slot j is visible to new token t iff j <= its true
  # position. That also hides unwritten slots (they lie beyond every real
  # position); padding queries see nothing (an empty row gives 0, not NaN).
  causal = (jnp.arange(s)[None, None, :] <= pos[:, :, None])  # [B, T, S]
  mask = masks_lib.combine_masks(causal, is_real[:, :, None])[:, None]
  y, _ = multi_head.attend_and_project(  # [B, T, D]; mask is [B, 1, T, S]
      params, q, new_cache.k, new_cache.v, mask=mask,
      implementation=implementation)
  overflow = end > s
  # Poison the rows of an overflowed sequence so that ignoring the status
  # cannot go unnoticed downstream.
  y = jnp.where(overflow[:, None, None], jnp.nan, y)
  return y, new_cache, CacheStatus(overflow=overflow)


def prefill(params, x, cache: KVCache, *, lengths=None, rotary_base=None,
            implementation="einsum"):
  """Run a right-padded prompt `x [B, T, D]` (real lengths `lengths`)."""
  return cached_attention(params, x, cache, lengths=lengths,
                          rotary_base=rotary_base,
                          implementation=implementation)


def decode_step(params, x, cache: KVCache, *, rotary_base=None,
                implementation="einsum"):
  """One new token per sequence: `x [B, D] -> out [B, D]`, new cache, status."""
  if jnp.ndim(x) != 2:
    raise ValueError(f"decode_step: `x` must have shape [B, D], got "
                     f"{jnp.shape(x)}")
  y, cache, status = cached_attention(params, x[:, None], cache,
                                      rotary_base=rotary_base,
                                      implementation=implementation)
  return y[:, 0], cache, status


def raise_if_overflow(status: CacheStatus) -> None:
  """Host-side check after a jitted call: raise if any sequence overflowed."""
  overflow = jax.device_get(status.overflow)
  if overflow.any():
    bad = [int(i) for i in overflow.nonzero()[0]]
    raise OverflowError(f"KV cache overflow: sequences {bad} wrote past "
                        "max_len; their outputs are invalid (NaN). Allocate "
                        "a larger cache with init_cache(max_len=...)")


def check_no_overflow(status: CacheStatus) -> None:
  """The same check inside a `checkify.checkify`-wrapped (jitted) function."""
  checkify.check(~jnp.any(status.overflow),
                 "KV cache overflow: a sequence wrote past max_len")


# ----------------------------------------------------------------------------
# A tiny pure decoder stack (pre-norm attention + MLP blocks on embeddings),
# only to test cached decoding through several layers and to time it in
# experiments/kv_cache.py. The trainable language model lives in the modules.


def init_stack_params(key, num_layers: int, d_model: int, num_heads: int, *,
                      num_kv_heads: int | None = None,
                      mlp_dim: int | None = None) -> list[dict]:
  """`num_layers` blocks: {"attn": init_mha_params(...), "w_in", "w_out"}."""
  mlp_dim = 4 * d_model if mlp_dim is None else mlp_dim
  layers = []
  for k in jax.random.split(key, num_layers):
    ka, ki, ko = jax.random.split(k, 3)
    layers.append({
        "attn": params_lib.init_mha_params(ka, d_model, num_heads,
                                           num_kv_heads=num_kv_heads),
        "w_in": jax.random.normal(ki, (d_model, mlp_dim)) * d_model ** -0.5,
        "w_out": jax.random.normal(ko, (mlp_dim, d_model)) * mlp_dim ** -0.5,
    })
  return layers


def _rms_norm(x):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _mlp(layer, x):
  return jax.nn.gelu(_rms_norm(x) @ layer["w_in"]) @ layer["w_out"]


def full_causal_attention(params, x, *, rotary_base=None,
                          implementation="einsum"):
  """No-cache reference: causal self-attention over all of `x [B, T, D]`."""
  if rotary_base is None:
    return multi_head.multi_head_attention(params, x, is_causal=True,
                                           implementation=implementation)
  q, k, v = multi_head.project_qkv(params, x)  # [B, T, H, Dh], [B, T, K, D*]
  pos = jnp.arange(x.shape[1])  # [T]: the same positions for every row
  q = rotary.apply_rotary(q, pos, base=rotary_base)
  k = rotary.apply_rotary(k, pos, base=rotary_base)
  y, _ = multi_head.attend_and_project(params, q, k, v, is_causal=True,
                                       implementation=implementation)
  return y


def stack_forward(layers, x, *, rotary_base=None, implementation="einsum"):
  """The whole stack over `x [B, T, D]` with no cache (recomputes everything)."""
  for layer in layers:
    x = x + full_causal_attention(layer["attn"], _rms_norm(x),
                                  rotary_base=rotary_base,
                                  implementation=implementation)
    x = x + _mlp(layer, x)
  return x


def stack_cached(layers, x, caches, *, lengths=None, rotary_base=None,
                 implementation="einsum"):
  """The stack over new tokens `x [B, T, D]` with one cache per layer.

  Returns `(out [B, T, D], new_caches, CacheStatus)`; overflow in any layer
  is reported (all layers fill alike, so they overflow together).
  """
  new_caches, overflow = [], None
  for layer, cache in zip(layers, caches, strict=True):
    a, cache, status = cached_attention(
        layer["attn"], _rms_norm(x), cache, lengths=lengths,
        rotary_base=rotary_base, implementation=implementation)
    x = x + a
    x = x + _mlp(layer, x)
    new_caches.append(cache)
    overflow = status.overflow if overflow is None else (
        overflow | status.overflow)
  return x, new_caches, CacheStatus(overflow=overflow)
