"""Weight layouts as strings: one rule maps a source tensor to parameters.

A layout names a tensor's axes with letters whose sizes come from the
model's config, and groups fused axes in parentheses:

  m D (d_model)    h H (query heads)   k K (key/value heads)
  d Dh (head width)   f F (MLP width)  v V (vocabulary)
  p max_len (position table)   t token types   three 3 (fused q, k, v)
  two 2 (fused gate and up)

For example Llama's `q_proj.weight` is stored `[H*Dh, D]` ("(h d) m") and
mha_jax's `w_q` is `[D, H, Dh]` ("m h d"); GPT-2's fused `c_attn.weight`
is "m (three h d)" and GPT-NeoX's `query_key_value.weight` is
"(h three d) m" (q, k, v interleaved per head). An axis of the source that
the target lacks (`three`) is split: each of its slices goes to one of the
rule's parameters in order. `to_params` reads the source layout into the
targets (a reshape, a transpose, a split); `to_source` is its exact
inverse, used to save a model back.

An axis may also be a concatenation of unequal parts, separated by `|`
inside its group, when fused tensors have parts of different sizes:
Phi-3's `qkv_proj.weight` with GQA is "(h d | k d | k d) m", q's rows
then k's then v's, and its `dst` names each part's layout in the same
order ("m h d | m k d | m k d"); part i goes to the rule's i-th
parameter.
"""

from __future__ import annotations

import math

import numpy as np


def parse(layout: str) -> list[tuple[str, ...]]:
  """"(h d) m" -> [("h", "d"), ("m",)]: the tensor's axes, each a group."""
  groups, current = [], None
  for token in layout.replace("(", " ( ").replace(")", " ) ").split():
    if token == "(":
      current = []
    elif token == ")":
      groups.append(tuple(current))
      current = None
    elif current is not None:
      current.append(token)
    else:
      groups.append((token,))
  return groups


def shape_of(layout: str, sizes: dict[str, int]) -> tuple[int, ...]:
  """The tensor shape a layout has for these axis sizes."""
  if "|" in layout:
    parts, axis = _parts(layout)
    shapes = [shape_of(p, sizes) for p in parts]
    return shapes[0][:axis] + (sum(s[axis] for s in shapes),) + (
        shapes[0][axis + 1:])
  return tuple(math.prod(sizes[a] for a in g) for g in parse(layout))


def _parts(layout: str) -> tuple[list[str], int]:
  """"(h d | k d) m" -> (["(h d) m", "(k d) m"], 0): one layout per part
  of the concatenated axis, and that axis's position."""
  groups = parse(layout.replace("|", " | "))
  (axis,) = [i for i, g in enumerate(groups) if "|" in g]
  alternatives, current = [], []
  for a in groups[axis] + ("|",):
    if a == "|":
      alternatives.append(current)
      current = []
    else:
      current.append(a)
  text = lambda g: "(" + " ".join(g) + ")" if len(g) > 1 else g[0]
  return [" ".join(text(alt) if i == axis else text(g)
                   for i, g in enumerate(groups))
          for alt in alternatives], axis


def _concat(src: str, dst: str) -> tuple[list[str], list[str], int]:
  """The parts of a concatenated `src` with their `dst` layouts."""
  parts, axis = _parts(src)
  dsts = [d.strip() for d in dst.split("|")]
  if len(dsts) != len(parts):
    raise ValueError(f"layout: {src!r} -> {dst!r} must name one target "
                     "layout per part")
  return parts, dsts, axis


def _axes(src: str, dst: str):
  flat = [a for g in parse(src) for a in g]
  out = [a for g in parse(dst) for a in g]
  split = [a for a in flat if a not in out]
  if len(split) > 1 or any(a not in flat for a in out):
    raise ValueError(f"layout: {src!r} -> {dst!r} must drop at most one axis "
                     "(the split) and add none")
  return flat, out, split[0] if split else None


def to_params(array: np.ndarray, src: str, dst: str,
              sizes: dict[str, int]) -> list[np.ndarray]:
  """Source tensor in layout `src` -> target arrays in layout `dst` (one,
  or one per slice of the split axis or part of the concatenated one).
  The caller checks the shape."""
  if "|" in src:
    parts, dsts, axis = _concat(src, dst)
    ends = np.cumsum([shape_of(p, sizes)[axis] for p in parts])
    pieces = np.split(array, ends[:-1], axis=axis)
    return [to_params(x, p, d, sizes)[0]
            for x, p, d in zip(pieces, parts, dsts)]
  flat, out, split = _axes(src, dst)
  x = np.reshape(array, [sizes[a] for a in flat])
  order = ([flat.index(split)] if split else []) + [flat.index(a) for a in out]
  x = np.transpose(x, order)
  return list(x) if split else [x]


def to_source(arrays: list[np.ndarray], src: str, dst: str,
              sizes: dict[str, int]) -> np.ndarray:
  """The inverse of `to_params`: target arrays -> one tensor in `src`."""
  if "|" in src:
    parts, dsts, axis = _concat(src, dst)
    return np.concatenate([to_source([x], p, d, sizes)
                           for x, p, d in zip(arrays, parts, dsts)],
                          axis=axis)
  flat, out, split = _axes(src, dst)
  x = np.stack(arrays) if split else arrays[0]
  order = ([split] if split else []) + out
  x = np.transpose(x, [order.index(a) for a in flat])
  return np.reshape(x, shape_of(src, sizes))
