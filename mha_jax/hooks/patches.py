"""Patch helpers: the common interventions as one-liners (`replace`,
`ablate`, `ScaleHeads`) and the axes of each hook site they index.

They are pytrees (the arrays are leaves, the choice of heads and
positions is static), so a dict of them can be passed straight into a
jitted function: new values reuse the compiled program.

Shape letters: B batch, T (Tq, Tk) length, D d_model, H query heads, K
key/value heads, Dh, Dv per-head widths (the package's docstring).
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp

from mha_jax.hooks import sites
from mha_jax.hooks.sites import ATTENTION_SITES
from mha_jax.hooks.sites import BLOCK_SITES
from mha_jax.hooks.sites import PatchError

# Per site kind: (axis of heads or None, axis of query positions).
_AXES = {"q": (2, 1), "k": (2, 1), "v": (2, 1), "z": (2, 1),
         "result": (2, 1), "scores": (1, 2), "pattern": (1, 2)}
_BLOCK_AXES = (None, 1)  # resid_pre, attn_out, ...: [B, T, D]
# The shape letters of each site kind, for error messages.
_LETTERS = {"q": "B, Tq, H, Dh", "k": "B, Tk, K, Dh", "v": "B, Tk, K, Dv",
            "scores": "B, H, Tq, Tk", "pattern": "B, H, Tq, Tk",
            "z": "B, Tq, H, Dv", "result": "B, Tq, H, D"}


def _leaf(site: str) -> str:
  return site.rsplit(".", 1)[-1]


def site_axes(site: str) -> tuple[int | None, int]:
  """`(head axis or None, query position axis)` of the activation at `site`
  (block sites, `[B, T, D]`, have no head axis)."""
  return _AXES.get(_leaf(site), _BLOCK_AXES)


def _static_index(index, what):
  """None, one Python int, or a tuple of them. `operator.index` takes
  NumPy and concrete JAX integers and refuses floats, which `int` would
  truncate to another head."""
  if index is None:
    return None
  try:
    return operator.index(index)
  except TypeError:
    pass
  try:
    return tuple(operator.index(i) for i in index)
  except TypeError:
    raise TypeError(f"`{what}` must be None, an int or a list of ints, got "
                    f"{index!r}") from None


def _letters(kind: str) -> list[str]:
  return _LETTERS.get(kind, "B, T, D").split(", ")


def _kv_note(kind: str) -> str:
  """What a k/v error adds: under GQA an index or value may have been
  meant per query head."""
  if kind not in ("k", "v"):
    return ""
  return (f"; {kind} holds the K kv heads, not the H query heads: query "
          "head h reads kv head h // (H // K) (`hooks.kv_head(h, H, K)`), "
          "and a patch of it changes what its whole group reads")


def _in_range(index, what, axis, shape, kind):
  """`index` as a tuple with negative entries counted from the end
  (Python's rule), or a PatchError naming the value, the axis and its
  size: JAX's scatter drops an index past the end, which would patch
  nothing, silently."""
  size = shape[axis]
  letters = _letters(kind)
  many = isinstance(index, tuple)
  for i in index if many else (index,):
    if not -size <= i < size:
      got = f"`{what}`={list(index)} holds {i}" if many else f"`{what}`={i}"
      raise PatchError(
          f"{got}, out of range for axis {axis} ({letters[axis]}) of {kind} "
          f"[{', '.join(letters)}]={list(shape)}, of size {size}: use "
          f"0..{size - 1}, or -{size}..-1 counting from the end"
          + (_kv_note(kind) if what == "heads" else ""))
  return tuple(i % size for i in (index if many else (index,)))


def _selector(index, axis: int, ndim: int, size: int):
  """Bool array, True at `index` along `axis`, broadcastable to rank ndim."""
  sel = jnp.zeros((size,), bool).at[jnp.asarray(index)].set(True)
  shape = [1] * ndim
  shape[axis] = size
  return sel.reshape(shape)


def _fits(shape, target) -> bool:
  """Whether `shape` is `target` axis by axis, up to axes of size 1."""
  return len(shape) == len(target) and all(
      a in (1, b) for a, b in zip(shape, target))


@jax.tree_util.register_pytree_node_class
class Replace:
  """A patch: the chosen heads / query positions come from `value`, the
  rest stays clean. Build it with `replace` (or `ablate`); `kind` is the
  site's last part (`"z"`, `"resid_pre"`), for the shape letters of its
  errors."""

  def __init__(self, value, heads=None, positions=None, axes=_BLOCK_AXES,
               kind="activation"):
    self.value = value
    self.heads = _static_index(heads, "heads")
    self.positions = _static_index(positions, "positions")
    self.axes = axes
    self.kind = kind

  def _value(self, clean: jax.Array) -> jax.Array:
    """`value` as an array of `clean`'s shape, or a PatchError.

    Accepted: a scalar; the site's shape, where any axis may be 1 (one
    example patched into all, a mean taken with keepdims); and, where
    `heads` or `positions` is one int, that shape without the axis it
    picks (`z[:, :, h]`, `z[:, t]`, `z[:, t, h]`: the slice a user has at
    hand). Another shape is refused, never broadcast into other axes.
    """
    value = jnp.asarray(self.value, clean.dtype)
    if value.ndim == 0:
      return jnp.broadcast_to(value, clean.shape)
    picked = sorted(axis for axis, index in zip(self.axes, (
        self.heads, self.positions)) if isinstance(index, int))
    # Every way of leaving out some of the picked axes, the full shape
    # first; a value must fit exactly one of them.
    options = [()] + [(a,) for a in picked] + ([tuple(picked)]
                                               if len(picked) > 1 else [])
    shapes = [tuple(n for a, n in enumerate(clean.shape) if a not in drop)
              for drop in options]
    fit = [drop for drop, s in zip(options, shapes) if _fits(value.shape, s)]
    if len(fit) == 1:
      return jnp.broadcast_to(jnp.expand_dims(value, fit[0]), clean.shape)
    letters = _letters(self.kind)
    names = [", ".join(x for a, x in enumerate(letters) if a not in drop)
             for drop in options]
    want = " or ".join(f"[{n}]={list(s)}" for n, s in zip(names, shapes))
    why = ("fits more than one of" if fit else "must be a scalar or fit")
    raise PatchError(
        f"`replace`'s value has shape {list(value.shape)}, which {why} "
        f"{want} (an axis of size 1 broadcasts"
        + ("; an int `heads` or `positions` may leave its axis out" if picked
           else "") + ")" + _kv_note(self.kind))

  def __call__(self, clean: jax.Array) -> jax.Array:
    head_axis, pos_axis = self.axes
    sel = jnp.ones((1,) * clean.ndim, bool)
    for what, index, axis in (("heads", self.heads, head_axis),
                              ("positions", self.positions, pos_axis)):
      if index is not None:
        index = _in_range(index, what, axis, clean.shape, self.kind)
        sel = sel & _selector(index, axis, clean.ndim, clean.shape[axis])
    return jnp.where(sel, self._value(clean), clean)

  def tree_flatten(self):
    return (self.value,), (self.heads, self.positions, self.axes, self.kind)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0], *aux)


def replace(site: str, value: jax.Array, *, heads: Any = None,
            positions: Any = None) -> dict[str, Replace]:
  """A patch that takes the chosen heads / query positions from `value`.

  `value` is an activation of the same site (e.g. captured from another
  run), a scalar, or, where `heads` (or `positions`) is one int, that
  activation without its head (position) axis: `z[:, :, h]`. `heads`
  counts the site's own heads: the H query heads, but on `k` and `v` the
  K kv heads (`kv_head(h, H, K)` is query head h's, shared by its group;
  see the module docstring). `heads` and
  `positions` are an int, a list of ints or None (all); negative ones
  count from the end, as in Python, and one past either end fails naming
  the site, the axis and its size. Returns `{site: patch}`, ready for
  `patch=` (merge several with `|`):

      clean = model(tokens_a, capture=["blocks.1.attn.z"])[1]
      model(tokens_b, patch=hooks.replace(
          "blocks.1.attn.z", clean["blocks.1.attn.z"], heads=2, positions=5))
  """
  kind = _leaf(site)
  if kind not in ATTENTION_SITES + BLOCK_SITES:
    # The name first: its last part decides the axes, so a typo would
    # otherwise read as a site without heads.
    parent = site[:len(site) - len(kind)]
    raise ValueError(sites.unknown_site(
        site, [parent + s for s in ATTENTION_SITES + BLOCK_SITES],
        "a site name ends in one of: "
        + ", ".join(ATTENTION_SITES + BLOCK_SITES)))
  axes = site_axes(site)
  if heads is not None and axes[0] is None:
    raise ValueError(f"site {site!r} has no head axis (it is [B, T, D]); "
                     "drop `heads`")
  return {site: Replace(value, heads, positions, axes, kind)}


def ablate(site: str, *, heads: Any = None, positions: Any = None
           ) -> dict[str, Replace]:
  """A patch that zeroes the chosen heads / positions of `site`."""
  return replace(site, 0.0, heads=heads, positions=positions)


@jax.tree_util.register_pytree_node_class
class ScaleHeads:
  """A patch of `z [B, T, H, Dv]` multiplying head h by `gates [H]` or
  `[B, H]`: what `head_mask` does (0 removes a head; differentiable)."""

  def __init__(self, gates):
    self.gates = gates

  def __call__(self, z: jax.Array) -> jax.Array:
    g = jnp.asarray(self.gates, z.dtype)
    g = g[None] if g.ndim == 1 else g  # [B?, H]
    return z * g[:, None, :, None]

  def tree_flatten(self):
    return (self.gates,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(children[0])
