"""Grouped-query attention's head geometry: which kv head a query head
reads (`h // (H // K)`), the group of query heads sharing a kv head, and
the per-query-head view of kv heads. One mapping, used by the
per-query-head view and by the circuit tools, so that a head index means
the same thing everywhere (the package's docstring says what it means for
each hook site).

Shape letters: H query heads, K key/value heads, G = H // K.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

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
