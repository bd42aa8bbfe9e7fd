"""Layer 1, hooks: read (capture) or replace (patch) any activation by
name. The bottom layer, importing nothing of the project, so that both
the pure core and the modules can offer hook sites.

Shape letters: B batch, Tq query length, Tk key length (cache slots when
decoding with a cache), D d_model, H query heads, K key/value heads,
Dh per-head query/key width, Dv per-head value width.

The names and meanings follow TransformerLens (`hook_q`, `hook_pattern`,
...), without the `hook_` prefix. In an attention layer:

  q        [B, Tq, H, Dh]  queries, after rotary positions
  k        [B, Tk, K, Dh]  keys of the tokens of this call, after rotary
  v        [B, Tk, K, Dv]  values of the tokens of this call
  scores   [B, H, Tq, Tk]  float32: scaled q.k, plus bias, -inf where
                           masked; the softmax's input
  pattern  [B, H, Tq, Tk]  float32: the softmax; before dropout
  z        [B, Tq, H, Dv]  each head's output, before W^O
  result   [B, Tq, H, D]   each head's own contribution to the residual
                           stream, z_h @ W^O_h (formed only when asked for)

and in a transformer block, all `[B, T, D]`: `resid_pre`, `attn_out`
(after b_o), `cross_out` (blocks with cross-attention), `resid_mid` (before
the MLP, blocks with one), `mlp_out`, `resid_post`. A model prefixes them
with where they sit: `"blocks.1.attn.pattern"`, `"blocks.0.resid_post"`,
and for an encoder-decoder `"encoder.blocks.0.attn.z"`,
`"decoder.blocks.1.cross.pattern"`.

With a KV cache, `k` and `v` are the new tokens' (what gets written), and
`scores`/`pattern` run over all cache slots (`Tk = S`).

Grouped-query attention (K < H; K = 1 is multi-query): `k` and `v` hold
the K kv heads, as TransformerLens's `hook_k`/`hook_v` do by default, and
every other site counts the H query heads. Query head h reads kv head
`h // (H // K)`: consecutive query heads share one, as in Hugging Face's
`repeat_kv` and in `core.attention.attend` (which groups q as `[K, G]`).
So that a head index means the same thing at every site, `expand_kv(k, H)`
is the per-query-head view `[B, T, H, Dh]` (its head h is what query head
h reads; TransformerLens's `ungroup_grouped_query_attention`), `kv_head(h,
H, K)` the kv head of query head h and `query_heads(j, H, K)` the group
sharing kv head j. A patch of `k` or `v` (`heads=` there counts kv heads,
and an index past K fails saying so) changes what the whole group reads:
to change what ONE query head sees, patch its `scores`, `pattern` or `q`;
to remove its output, its `z`.

A `Hooks` object lives for one call. At each site the model calls
`hooks(site, x)`: a patch (an array, or a function of the clean array)
replaces x, then a capture records the value that flows on. Both happen
while JAX traces, so they work under `jax.jit`, `jax.grad` and `jax.vmap`;
the site names are Python strings, hence static: the same set of names
reuses a compiled program, a new set compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import difflib
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ATTENTION_SITES = ("q", "k", "v", "scores", "pattern", "z", "result")
# A transformer block's own sites, all [B, T, D].
BLOCK_SITES = ("resid_pre", "attn_out", "cross_out", "resid_mid", "mlp_out",
               "resid_post")
# Formed only by implementations that materialise the [Tq, Tk] weights.
WEIGHT_SITES = ("scores", "pattern")

# Per site kind: (axis of heads or None, axis of query positions).
_AXES = {"q": (2, 1), "k": (2, 1), "v": (2, 1), "z": (2, 1),
         "result": (2, 1), "scores": (1, 2), "pattern": (1, 2)}
_BLOCK_AXES = (None, 1)  # resid_pre, attn_out, ...: [B, T, D]
# The shape letters of each site kind, for error messages.
_LETTERS = {"q": "B, Tq, H, Dh", "k": "B, Tk, K, Dh", "v": "B, Tk, K, Dv",
            "scores": "B, H, Tq, Tk", "pattern": "B, H, Tq, Tk",
            "z": "B, Tq, H, Dv", "result": "B, Tq, H, D"}

Patch = jax.Array | Callable[[jax.Array], jax.Array]


def head_name(layer: int, head: int) -> str:
  """`L1H3`: head 3 of layer 1, both counted from 0 as the API counts them
  (`blocks.1.attn`, `heads=3`) and as TransformerLens names heads. The one
  place a head's name is written: reports, the explorer and the cache's
  labels all use it."""
  return f"L{int(layer)}H{int(head)}"


def outputs(main, *asked):
  """What a user-facing call returns: `main` alone when nothing else was
  asked for, else `(main, *parts)` with the asked-for parts in the
  caller's fixed order (None marks a part not asked for). The one return
  convention of `multi_head_attention` (captures, weights) and the models
  (cache, captures, weights)."""
  parts = tuple(p for p in asked if p is not None)
  return (main, *parts) if parts else main


def _leaf(site: str) -> str:
  return site.rsplit(".", 1)[-1]


def _compose(first: Patch, then: Patch) -> Patch:
  """One patch that applies `first`, then `then` (an array wins outright)."""
  if not callable(then):
    return then
  if not callable(first):
    return lambda x: then(first)
  return lambda x: then(first(x))


class Hooks:
  """What one call captures and patches, addressed by full site names.

  Args:
    capture: site names whose values to record in `captured`.
    patch: site name -> array (replaces the activation; same shape and
      dtype) or function (clean activation -> new activation).
    valid: if given, every name must be one of these; otherwise a
      ValueError lists them.

  `scope("blocks.0")` returns a view that prefixes names and shares the
  same patches and `captured` dict, so a block passes `hooks.scope("attn")`
  to its attention layer, which calls `hooks("z", z)`.
  """

  def __init__(self, capture: Iterable[str] = (),
               patch: Mapping[str, Patch] | None = None, *,
               valid: Iterable[str] | None = None, prefix: str = "",
               captured: dict[str, jax.Array] | None = None):
    if isinstance(capture, str):
      capture = (capture,)
    self.capture = frozenset(capture)
    self.patch = dict(patch or {})
    self.prefix = prefix
    self.captured = {} if captured is None else captured
    if valid is not None:
      check_names(self.capture | set(self.patch), valid)

  def __bool__(self) -> bool:
    return bool(self.capture or self.patch)

  def scope(self, name: str) -> Hooks:
    """A view for the sites under `name` (same patches, same `captured`)."""
    return Hooks(self.capture, self.patch, prefix=f"{self.prefix}{name}.",
                 captured=self.captured)

  def extend(self, capture: Iterable[str] = (),
             patch: Mapping[str, Patch] | None = None) -> Hooks:
    """More captures and patches, named relative to this view.

    A new patch at a site that already has one runs FIRST, the existing
    one after it (so `head_mask` gates z before a user's own patch of z).
    """
    full = {f"{self.prefix}{n}" for n in capture}
    patches = dict(self.patch)
    for name, p in (patch or {}).items():
      name = f"{self.prefix}{name}"
      patches[name] = _compose(p, patches[name]) if name in patches else p
    return Hooks(self.capture | full, patches, prefix=self.prefix,
                 captured=self.captured)

  def wants(self, site: str) -> bool:
    """Whether `site` (relative to this view) is captured or patched."""
    name = f"{self.prefix}{site}"
    return name in self.capture or name in self.patch

  def patches(self, site: str) -> bool:
    return f"{self.prefix}{site}" in self.patch

  def read(self, site: str) -> jax.Array:
    """The captured value of `site` (relative to this view)."""
    return self.captured[f"{self.prefix}{site}"]

  def __call__(self, site: str, x: jax.Array) -> jax.Array:
    """The value that flows on from `site`: patched, then captured."""
    name = f"{self.prefix}{site}"
    if name in self.patch:
      p = self.patch[name]
      try:
        new = p(x) if callable(p) else p
      except PatchError as e:  # raised by `Replace`, which knows no name
        raise ValueError(f"hook site {name!r}: {e}") from None
      _check_value(name, new, x, "a function patch returned"
                   if callable(p) else "the patch value is")
      x = new
    if name in self.capture:
      self.captured[name] = x
    return x


NO_HOOKS = Hooks()


class PatchError(ValueError):
  """A patch helper's value or index does not fit the activation it meets;
  `Hooks` re-raises it as a ValueError that names the site."""


def _close_matches(name: str, valid: Iterable[str]) -> list[str]:
  """The valid names a typo of `name` most likely meant: the same place
  with a close last part (`blocks.0.attn.zz` -> `blocks.0.attn.z`), else
  close whole names (site names share long prefixes, so a whole-name
  match alone would suggest every site of the layer)."""
  valid = tuple(valid)
  parent, _, leaf = name.rpartition(".")
  siblings = {v.rpartition(".")[2]: v for v in valid
              if v.rpartition(".")[0] == parent}
  near = difflib.get_close_matches(leaf, list(siblings), n=3, cutoff=0.6)
  if near:
    return [siblings[n] for n in near]
  return difflib.get_close_matches(name, valid, n=3, cutoff=0.8)


def _unknown_site(name: str, valid: Iterable[str], listing: str) -> str:
  near = _close_matches(name, valid)
  hint = (f" (did you mean {' or '.join(repr(n) for n in near)}?)"
          if near else "")
  return f"unknown hook site {name!r}{hint}; {listing}"


def check_names(names: Iterable[str], valid: Iterable[str],
                unavailable: Mapping[str, str] | None = None) -> None:
  """Raise naming the first bad site name (and the valid names closest to
  it) and listing the valid ones (or, past `LISTED_SITES`, counting them).

  `unavailable` maps names that exist in general but not on this model or
  call (e.g. `pattern` on a path that never forms weights) to the reason.
  """
  valid = tuple(valid)
  valid_set = set(valid)
  for name in sorted(names):
    if not isinstance(name, str):
      raise TypeError(f"hook site names must be strings, got {name!r}")
    if unavailable and name in unavailable:
      raise ValueError(f"hook site {name!r}: {unavailable[name]}")
    if name not in valid_set:
      raise ValueError(_unknown_site(name, valid, _listing(valid)))


# Up to this many valid sites are listed in an unknown site's error; a
# real model has hundreds (SmolLM2's list ran to 7,348 characters on one
# line), so past it the error says where to find them.
LISTED_SITES = 12


def _listing(valid: tuple[str, ...]) -> str:
  if len(valid) <= LISTED_SITES:
    return "this model has: " + ", ".join(valid)
  return (f"this model has {len(valid)} sites, listed by "
          "`model.hook_names()`")


def _check_value(name, new, clean, what):
  shape, dtype = jnp.shape(new), jnp.result_type(new)
  if shape != clean.shape or dtype != clean.dtype:
    raise ValueError(f"hook site {name!r}: {what} {dtype}{list(shape)}, but "
                     f"the activation there is {clean.dtype}"
                     f"{list(clean.shape)}")


# ----------------------------------------------------------------------------
# Grouped-query attention: which kv head a query head reads. One mapping,
# used by the per-query-head view and by the circuit tools, so that a
# head index means the same thing everywhere.


def _group(num_heads: int, num_kv_heads: int, fn: str) -> int:
  """G = H // K query heads per kv head, or a ValueError naming `fn`."""
  for name, n in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
      raise ValueError(f"{fn}: `{name}` must be a positive int, got {n!r}")
  if num_heads % num_kv_heads:
    raise ValueError(f"{fn}: `num_kv_heads`={num_kv_heads} must divide "
                     f"`num_heads`={num_heads}")
  return num_heads // num_kv_heads


def _head_index(index, size: int, what: str, fn: str) -> int:
  """`index` in [0, size), negative ones counted from the end (Python's
  rule), or a ValueError naming `what`, the range and the value."""
  try:
    i = operator.index(index)
  except TypeError:
    raise TypeError(f"{fn}: `{what}` must be an int, got {index!r}") from None
  if not -size <= i < size:
    raise ValueError(f"{fn}: `{what}`={i} is out of range: expected an int "
                     f"in [0, {size}) (or -{size}..-1 from the end)")
  return i % size


def kv_heads_of(num_heads: int, num_kv_heads: int) -> np.ndarray:
  """`[H]` int: the kv head each query head reads, `h // (H // K)`."""
  return np.arange(num_heads) // _group(num_heads, num_kv_heads,
                                         "kv_heads_of")


def kv_head(head: int, num_heads: int, num_kv_heads: int) -> int:
  """The kv head query head `head` reads (`heads=` for a `k`/`v` patch).

      hooks.kv_head(5, num_heads=9, num_kv_heads=3)   # 1 (SmolLM2-135M)
  """
  _group(num_heads, num_kv_heads, "kv_head")
  h = _head_index(head, num_heads, "head", "kv_head")
  return int(kv_heads_of(num_heads, num_kv_heads)[h])


def query_heads(kv: int, num_heads: int, num_kv_heads: int
                ) -> tuple[int, ...]:
  """The query heads that read kv head `kv` (its group), in order: what
  a patch of that kv head's `k` or `v` changes."""
  _group(num_heads, num_kv_heads, "query_heads")
  j = _head_index(kv, num_kv_heads, "kv", "query_heads")
  return tuple(int(h) for h in np.flatnonzero(
      kv_heads_of(num_heads, num_kv_heads) == j))


def expand_kv(x: jax.Array, num_heads: int, *, axis: int = -2) -> jax.Array:
  """The per-query-head view of kv heads: `[..., K, d] -> [..., H, d]`.

  Head h of the result is kv head `kv_head(h, H, K)`, what query head h
  reads, so it lines up with `q`, `z`, `pattern`: `expand_kv(k, H)[:, :,
  h]` is query head h's keys. Works on the `k`/`v` sites `[B, T, K, D*]`
  (and `[T, K, D*]`) and, with the same default `axis`, on the weights
  `w_k`/`w_v` `[D, K, D*]`. A copy for reading: to patch, index kv heads.
  """
  x = jnp.asarray(x)
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"expand_kv: `axis`={axis} is out of range for `x` of "
                     f"shape {list(x.shape)}")
  k = x.shape[axis]
  _group(num_heads, 1, "expand_kv")
  if num_heads % k:
    raise ValueError(f"expand_kv: `x` has {k} kv heads on axis {axis} (shape "
                     f"{list(x.shape)}), which must divide `num_heads`="
                     f"{num_heads}")
  return jnp.take(x, jnp.asarray(kv_heads_of(num_heads, k)), axis=axis)


# ----------------------------------------------------------------------------
# Patch helpers: the common interventions as one-liners. They are pytrees
# (the arrays are leaves, the choice of heads and positions is static), so
# a dict of them can be passed straight into a jitted function: new values
# reuse the compiled program.


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
    raise ValueError(_unknown_site(
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
