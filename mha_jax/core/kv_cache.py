"""Key/value cache for autoregressive decoding: the data and its updates.

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

This file holds the cache itself (`KVCache`, `update`, the overflow
status); attention over it is the one attention path
(`multi_head.attention_layer`, called by `MultiHeadAttention` with
`cache=` and by the pure `multi_head.cached_attention`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import checkify
import numpy as np

from mha_jax.core import masks as masks_lib
from mha_jax.core import params as params_lib


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


def check_cache(cache, x, dims: params_lib.MHADims, lengths, fn) -> None:
  """Shape checks of a cached call that need no values; raise naming the
  argument. `x [B, T, D]` holds the new tokens' inputs."""
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
    # Known values are checked (under jit too, when they are constants of the
    # trace): test the argument itself, as jnp.asarray inside a trace would
    # turn even a constant into a tracer.
    known = not isinstance(lengths, jax.core.Tracer)
    lengths = np.asarray(lengths) if known else lengths
    if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
      raise ValueError(f"{fn}: `lengths` must be an int array of shape [{b}],"
                       f" got {lengths.dtype} {lengths.shape}")
    if known:
      if bool(np.any((lengths < 0) | (lengths > x.shape[1]))):
        raise ValueError(f"{fn}: `lengths` must lie in [0, T={x.shape[1]}], "
                         f"got {lengths}")


def positions(cache: KVCache, t: int) -> jax.Array:
  """True positions `[B, T]` of `t` new tokens: `length[b] + 0..t-1`."""
  return cache.length[:, None] + jnp.arange(t)[None, :]


def update(cache: KVCache, k: jax.Array, v: jax.Array, lengths=None):
  """Write the new tokens' `k [B,T,K,Dh]`, `v [B,T,K,Dv]` into their slots.

  `lengths [B]` (None: all T) counts each row's real new tokens; the rest
  is right padding and never written. Returns `(new_cache, mask)`, where
  `mask [B, 1, T, S]` says which slots each new token may attend to.
  """
  b, t = k.shape[:2]
  s = cache.max_len
  lengths = (jnp.full((b,), t, jnp.int32) if lengths is None
             else jnp.asarray(lengths, jnp.int32))
  pos = positions(cache, t)  # [B, T]
  is_real = jnp.arange(t)[None, :] < lengths[:, None]  # [B, T]
  # Padding rows get slot S, which is out of bounds and dropped, so they
  # never touch the cache; real rows past S are dropped too and reported as
  # overflow (`length` still advances): no wrap, no clamp.
  slot = jnp.where(is_real, pos, s)  # [B, T]
  row = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))  # [B, T]
  new_cache = KVCache(
      k=cache.k.at[row, slot].set(k.astype(cache.k.dtype), mode="drop"),
      v=cache.v.at[row, slot].set(v.astype(cache.v.dtype), mode="drop"),
      length=cache.length + lengths)
  # Causal per sequence: slot j is visible to new token t iff j <= its true
  # position. That also hides unwritten slots (they lie beyond every real
  # position); padding queries see nothing (an empty row gives 0, not NaN).
  causal = jnp.arange(s)[None, None, :] <= pos[:, :, None]  # [B, T, S]
  mask = masks_lib.combine_masks(causal, is_real[:, :, None])[:, None]
  return new_cache, mask


def overflowed(cache: KVCache) -> jax.Array:
  """`[B]` bool: the sequence has written past `max_len` (sticky)."""
  return cache.length > cache.max_len


def status(caches) -> CacheStatus:
  """The `CacheStatus` of one layer's cache or of a model's caches (all
  layers fill alike, so they overflow together)."""
  caches = [caches] if isinstance(caches, KVCache) else list(caches)
  overflow = overflowed(caches[0])
  for cache in caches[1:]:
    overflow = overflow | overflowed(cache)
  return CacheStatus(overflow=overflow)


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
