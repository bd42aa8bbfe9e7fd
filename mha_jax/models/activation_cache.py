"""The activations of one forward pass, as TransformerLens's cache.

Shape letters: B batch, T length, D d_model, H heads, L layers, C
components of a stack.

    logits, cache = model.run_with_cache(tokens)       # every site
    cache["pattern", 1]              # == cache["blocks.1.attn.pattern"]
    cache.stack("resid_post")        # [L, B, T, D]
    parts, labels = cache.decompose_resid(return_labels=True)
    dla = cache.apply_ln_to_stack(parts, model) @ w_u  # [C, B, T, V]

`ActivationCache` is a read-only mapping from full hook-site names
(`mha_jax.hooks`) to arrays, plus a static `Layout` (how many layers and
heads, how the blocks are wired). It is a pytree: the arrays are its
leaves, the names and layout static, so it comes out of `jax.jit` and
`jax.vmap` and goes into them, and `jax.tree.map(lambda a: a[0], cache)`
drops the batch axis (TransformerLens's `remove_batch_dim`).

Nothing here needs the batch axis: every method reads only the trailing
`[T, D]` (`[T, H, D]` for `result`) of what it stacks, so a cache
without its batch axis works the same.
"""

from __future__ import annotations

import dataclasses
import difflib

import jax
import jax.numpy as jnp

from mha_jax.models import transformer_lens_names as tl_names
from mha_jax.models.residual_stream import ResidualStream


@dataclasses.dataclass(frozen=True)
class Layout:
  """What the cache's methods need to know of the model, all static.

  `placement` is `ModelConfig.norm_placement` ("pre", "post",
  "sandwich"); `parallel` whether attention and MLP both read the block's
  input (GPT-NeoX); `attention_only` whether blocks have no MLP.
  """
  num_layers: int
  num_heads: int
  placement: str = "pre"
  parallel: bool = False
  attention_only: bool = False

  @classmethod
  def of(cls, model) -> Layout:
    c = model.config
    return cls(c.num_layers, c.num_heads, c.norm_placement, c.parallel_block,
               c.attention_only)


@jax.tree_util.register_pytree_with_keys_class
class ActivationCache(ResidualStream):
  """Captured activations by full site name, with TransformerLens's views.

  Index it by full name (`cache["blocks.1.attn.pattern"]`; the
  TransformerLens spelling `"blocks.1.attn.hook_pattern"` works too) or
  by `(short name, layer)`: `cache["pattern", 1]`, where the short name
  is a key of `transformer_lens_names.SHORT_NAMES` and a negative layer
  counts from the end. The residual stream's methods are
  `ResidualStream`'s (residual_stream.py).
  """

  def __init__(self, arrays: dict[str, jax.Array], layout: Layout):
    self._arrays = dict(arrays)
    self.layout = layout

  # --- pytree: arrays are leaves, names and layout static ---------------

  def tree_flatten_with_keys(self):
    names = tuple(self._arrays)
    children = tuple((jax.tree_util.DictKey(n), self._arrays[n])
                     for n in names)
    return children, (names, self.layout)

  @classmethod
  def tree_unflatten(cls, aux, children):
    names, layout = aux
    return cls(dict(zip(names, children)), layout)

  # --- mapping ----------------------------------------------------------

  def name(self, key) -> str:
    """The full site name a key stands for (no lookup of the value)."""
    if isinstance(key, str):
      return tl_names.tl_name(key)
    if not isinstance(key, tuple) or len(key) != 2:
      raise TypeError(f"ActivationCache: a key is a site name or (short "
                      f"name, layer), got {key!r}")
    short, layer = key
    if short not in tl_names.SHORT_NAMES:
      raise KeyError(f"ActivationCache: unknown short name {short!r} in "
                     f"{key!r}; expected one of "
                     f"{', '.join(tl_names.SHORT_NAMES)}")
    return (f"blocks.{self._layer(layer, 'layer')}."
            f"{tl_names.SHORT_NAMES[short]}")

  def _layer(self, layer, what, *, allow_end=False, error=KeyError) -> int:
    """`layer` in [0, L) (or [0, L] with `allow_end`), negatives counted
    from the end of [0, L) as in Python; else `error` (KeyError when
    indexing, ValueError for a method's argument)."""
    n = self.layout.num_layers
    if not isinstance(layer, int) or isinstance(layer, bool):
      raise TypeError(f"ActivationCache: `{what}` must be an int, got "
                      f"{layer!r}")
    top = n + 1 if allow_end else n
    if not -n <= layer < top:
      raise error(f"ActivationCache: `{what}`={layer} is out of range "
                     f"for a {n}-layer model: expected 0..{top - 1} or "
                     f"-{n}..-1")
    return layer % n if layer < 0 else layer

  def __getitem__(self, key) -> jax.Array:
    name = self.name(key)
    if name not in self._arrays:
      near = difflib.get_close_matches(name, list(self._arrays), n=3)
      hint = (f" (did you mean {' or '.join(map(repr, near))}?)" if near
              else "")
      raise KeyError(f"ActivationCache: no activation {name!r}{hint}; it "
                     f"holds {len(self._arrays)} sites (`keys()`); "
                     "run_with_cache(names=None) captures every site")
    return self._arrays[name]

  def __contains__(self, key) -> bool:
    try:
      return self.name(key) in self._arrays
    except (KeyError, TypeError):
      return False

  def keys(self) -> tuple[str, ...]:
    """The full site names, in the order the forward reached them."""
    return tuple(self._arrays)

  def values(self):
    return tuple(self._arrays.values())

  def items(self):
    return tuple(self._arrays.items())

  def __iter__(self):
    return iter(self._arrays)

  def __len__(self) -> int:
    return len(self._arrays)

  def __repr__(self) -> str:
    return (f"ActivationCache({len(self)} activations of a "
            f"{self.layout.num_layers}-layer model)")

  # --- stacks -----------------------------------------------------------

  def stack(self, short: str, layer: int | None = None) -> jax.Array:
    """One short name's activation over layers 0..layer-1 (None: all):
    `cache.stack("pattern")` is `[L, B, H, T, T]`."""
    n = self.layout.num_layers
    top = n if layer is None else self._layer(
        layer, "layer", allow_end=True, error=ValueError)
    return jnp.stack([self[short, l] for l in range(top)])


def run_with_cache(model, inputs, names=None, **kwargs):
  """`model(inputs, capture=names, **kwargs)` as `(output, ActivationCache)`.

  `names`: None (every site `model.hook_names()` lists: those its
  attention path forms; "scores" and "pattern" need implementation
  "vmap" or "einsum"), one full name, a list of them, or a function
  name -> bool applied to `model.hook_names()` (TransformerLens's
  `names_filter`). Other keywords go to the model's call, except those
  that change what it returns.
  """
  for key in ("capture", "return_weights", "cache"):
    if key in kwargs:
      raise TypeError(f"run_with_cache: `{key}` is not accepted: name the "
                      "sites with `names`; read weights as "
                      "cache.stack('pattern'); decode with "
                      "models.generate")
  if names is None:
    names = model.hook_names()
  elif isinstance(names, str):
    names = (names,)
  elif callable(names):
    names = tuple(n for n in model.hook_names() if names(n))
  names = tuple(names)
  if not names:
    return model(inputs, **kwargs), ActivationCache({}, Layout.of(model))
  out, captured = model(inputs, capture=names, **kwargs)
  order = {n: i for i, n in enumerate(model.hook_names())}
  arrays = {n: captured[n] for n in sorted(captured, key=order.get)}
  return out, ActivationCache(arrays, Layout.of(model))
