"""Per-example positions for patching: which positions of each example a
patch replaces, where a task's roles sit at their own position in each
example (IOI's subject, indirect object and END in prompts of different
templates).

Shape letters: R position sets (roles), B batch, T length, H heads.

A position set is a `[B, T]` boolean mask, True where that example's
value is patched; `positions [R, B, T]` holds R of them, and
`patching.activation_patching(..., positions=)` scores one patch per
(site, head, set). `at_positions` builds the masks from integer
positions, `role_masks` from named roles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def at_positions(index, length: int) -> jax.Array:
  """`[R, B, T]` bool from `index [R, B]` (or `[B]`, one set) integer
  positions: set r holds position `index[r, b]` of example b only."""
  index = np.asarray(index)
  if index.ndim == 1:
    index = index[None]
  if (index.ndim != 2 or not np.issubdtype(index.dtype, np.integer)
      or np.any((index < 0) | (index >= length))):
    raise ValueError(f"at_positions: `index` must be integer positions [R, "
                     f"B] (or [B]) in [0, {length}), got {index.dtype} of "
                     f"shape {index.shape} in [{index.min(initial=0)}, "
                     f"{index.max(initial=0)}]")
  return jnp.asarray(np.arange(length) == index[..., None])


def role_masks(at: Mapping[str, object], length: int,
               roles: Sequence[str]) -> jax.Array:
  """`[R, B, T]` bool, one set per name of `roles`: a role of `at` (name
  -> `[B]` integer positions, one per example) holds its own position in
  each example; "all" every position; "rest" every position no role of
  `at` holds."""
  named = {r: np.arange(length)[None] == np.asarray(p)[:, None]
           for r, p in at.items()}
  n = len(next(iter(at.values())))
  allowed = ("all",) + tuple(at) + ("rest",)
  out = []
  for r in roles:
    if r == "all":
      out.append(np.ones((n, length), bool))
    elif r == "rest":
      out.append(~np.any(np.stack(list(named.values())), 0))
    elif r in named:
      out.append(named[r])
    else:
      raise ValueError(f"role_masks: `roles` must be drawn from {allowed}, "
                       f"got {r!r}")
  return jnp.asarray(np.stack(out))


def check(positions, batch: int, length: int, fn: str, *,
          arg: str = "positions", sets: bool = True) -> jax.Array:
  """`positions` as an array, or ValueError naming `fn` and `arg` unless
  it is bool `[R, batch, length]` (`sets=False`: `[batch, length]`).
  Shapes and dtypes are static, so this holds under `jax.jit` too."""
  positions = jnp.asarray(positions)
  want = (batch, length)
  shape_ok = ((positions.ndim == 3 and positions.shape[1:] == want) if sets
              else positions.shape == want)
  if positions.dtype != jnp.bool_ or not shape_ok:
    shape = (f"[R, {batch}, {length}] (R position sets, one per role, of "
             f"the inputs' B and T)" if sets
             else f"[{batch}, {length}] (the inputs' B and T)")
    raise ValueError(f"{fn}: `{arg}` must be a bool array {shape}; got "
                     f"{positions.dtype} of shape {positions.shape}")
  return positions


def checked(positions, per_position: bool, clean, fn: str):
  """`positions` checked against the inputs' `[B, T]` (`clean`'s first
  two axes), or None; refused beside `per_position`."""
  if positions is None:
    return None
  if per_position:
    raise ValueError(f"{fn}: `per_position=True` patches one position of "
                     f"every example and `positions` each example's own; "
                     f"pass one of them, got both")
  return check(positions, *jnp.shape(clean)[:2], fn)


def on_site(mask: jax.Array, ndim: int, pos_axis: int) -> jax.Array:
  """A `[B, T]` mask reshaped to broadcast against a site's value of
  `ndim` axes: batch first, T on the site's `pos_axis`."""
  shape = [1] * ndim
  shape[0], shape[pos_axis] = mask.shape
  return mask.reshape(shape)


def contract(est: jax.Array, letters: str, positions, per_example: bool):
  """Per-example attribution products `est` (axes named by `letters`,
  from "b", "h", "t") summed over each position set: `[H, R]` (`[R]`
  without "h"), with a last axis B when `per_example`."""
  out = ("h" if "h" in letters else "") + "r" + ("b" if per_example else "")
  return jnp.einsum(f"{letters},rbt->{out}", est,
                    positions.astype(est.dtype))
