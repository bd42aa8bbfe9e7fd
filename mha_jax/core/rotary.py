"""Rotary position embedding (RoPE), applied to q and k after the head split.

Shape letters: B batch, T length, H heads, Dh per-head width (even).

Each pair of features (i, i + Dh/2) is rotated by the angle
`position * base**(-2i/Dh)`, so q.k depends only on the relative offset.
Positions are given per sequence (`[B, T]`), which is what decoding a ragged
batch with a cache needs: every sequence rotates by its own true offset.

This pairing, (i, i + Dh/2), is the "rotate half" convention of Hugging
Face's Llama, Mistral, Qwen2, Gemma and GPT-NeoX code, whose checkpoints
store q and k in it, so they load without permuting a weight. Two options
cover those families: `rotary_dim` rotates only the first features of each
head (GPT-NeoX's partial rotary) and `scaling` rescales the frequencies
(`frequencies`: linear position interpolation, Llama 3.1's bands).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def frequencies(dim: int, base: float = 10000.0, scaling=None) -> jax.Array:
  """The angle per position of each pair, `[dim/2]`: `base**(-2i/dim)`.

  `scaling`: None; `("linear", factor)` divides every frequency by the
  factor (positions stretched); `("llama3", factor, low_freq_factor,
  high_freq_factor, original_max_len)` keeps wavelengths shorter than
  `original_max_len / high_freq_factor`, divides those longer than
  `original_max_len / low_freq_factor` by `factor`, and between the two
  interpolates linearly in `original_max_len / wavelength` (Llama 3.1).
  """
  freq = base ** (-jnp.arange(dim // 2, dtype=jnp.float32) * 2.0 / dim)
  if scaling is None:
    return freq
  kind, factor = scaling[0], scaling[1]
  if kind == "linear":
    return freq / factor
  if kind != "llama3":
    raise ValueError(f"frequencies: `scaling` kind must be 'linear' or "
                     f"'llama3', got {kind!r}")
  low, high, original = scaling[2:]
  ratio = original * freq / (2 * jnp.pi)  # original_max_len / wavelength
  smooth = jnp.clip((ratio - low) / (high - low), 0.0, 1.0)
  # smooth = 1 (short waves) keeps freq, 0 (long waves) gives freq / factor.
  return (1 - smooth) * freq / factor + smooth * freq


def apply_rotary(x: jax.Array, positions: jax.Array, *,
                 base: float = 10000.0, rotary_dim: int | None = None,
                 scaling=None) -> jax.Array:
  """Rotate `x [B, T, H, Dh]` by `positions [B, T]` (or `[T]`).

  `rotary_dim` (even, <= Dh; None: Dh) rotates the first features of each
  head and passes the rest; `scaling`: see `frequencies`.
  """
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
  if rotary_dim is not None and rotary_dim != dh:
    if rotary_dim % 2 or not 0 < rotary_dim < dh:
      raise ValueError(f"apply_rotary: `rotary_dim` must be even and in "
                       f"(0, Dh={dh}], got {rotary_dim}")
    rotated = apply_rotary(x[..., :rotary_dim], positions, base=base,
                           scaling=scaling)
    return jnp.concatenate([rotated, x[..., rotary_dim:]], axis=-1)
  half = dh // 2
  freq = frequencies(dh, base, scaling)  # [Dh/2]
  # Explicit broadcast: the test suite raises on implicit rank promotion.
  angle = (positions.astype(jnp.float32)[..., None]
           * freq[None, None, :])  # [B, T, Dh/2]
  cos = jnp.cos(angle)[:, :, None, :]  # [B, T, 1, Dh/2]
  sin = jnp.sin(angle)[:, :, None, :]
  x1 = x[..., :half].astype(jnp.float32)
  x2 = x[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
