"""Rotary position embedding (RoPE), applied to q and k after the head split.

Shape letters: B batch, T length, H heads, Dh per-head width (even).

Each pair of features (i, i + Dh/2) is rotated by the angle
`position * base**(-2i/Dh)`, so q.k depends only on the relative offset.
Positions are given per sequence (`[B, T]`), which is what decoding a ragged
batch with a cache needs: every sequence rotates by its own true offset.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_rotary(x: jax.Array, positions: jax.Array, *,
                 base: float = 10000.0) -> jax.Array:
  """Rotate `x [B, T, H, Dh]` by `positions [B, T]` (or `[T]`)."""
  if x.ndim != 4:
    raise ValueError(f"apply_rotary: `x` must be [B, T, H, Dh], got {x.shape}")
  dh = x.shape[-1]
  if dh % 2:
    raise ValueError(f"apply_rotary: head width must be even, got Dh={dh}")
  positions = jnp.asarray(positions)
  given = positions.shape  # the caller's shape, for the message
  if positions.ndim == 1:
    positions = positions[None, :]
  if positions.shape[-1] != x.shape[1] or positions.ndim != 2:
    raise ValueError(f"apply_rotary: `positions` must be [B, T] or [T] with "
                     f"T={x.shape[1]}, got {given}")
  half = dh // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / dh)  # [Dh/2]
  # Explicit broadcast: the test suite raises on implicit rank promotion.
  angle = (positions.astype(jnp.float32)[..., None]
           * freq[None, None, :])  # [B, T, Dh/2]
  cos = jnp.cos(angle)[:, :, None, :]  # [B, T, 1, Dh/2]
  sin = jnp.sin(angle)[:, :, None, :]
  x1 = x[..., :half].astype(jnp.float32)
  x2 = x[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
