"""Hook sites: the site names, the `Hooks` object that captures and
patches at them during one call, and the checks of names and values.

Shape letters and the sites' meanings: the package's docstring
(`mha_jax/hooks/__init__.py`). A `Hooks` object lives for one call. At
each site the model calls `hooks(site, x)`: a patch (an array, or a
function of the clean array) replaces x, then a capture records the value
that flows on. Both happen while JAX traces, so they work under
`jax.jit`, `jax.grad` and `jax.vmap`; the site names are Python strings,
hence static: the same set of names reuses a compiled program, a new set
compiles once. Also here: a head's printed name (`head_name`) and the
return convention of the calls that capture (`outputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import difflib

import jax
import jax.numpy as jnp

ATTENTION_SITES = ("q", "k", "v", "scores", "pattern", "z", "result")
# A transformer block's own sites, all [B, T, D].
BLOCK_SITES = ("resid_pre", "attn_out", "cross_out", "resid_mid", "mlp_out",
               "resid_post")
# Formed only by implementations that materialise the [Tq, Tk] weights.
WEIGHT_SITES = ("scores", "pattern")

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


def unknown_site(name: str, valid: Iterable[str], listing: str) -> str:
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
      raise ValueError(unknown_site(name, valid, _listing(valid)))


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

