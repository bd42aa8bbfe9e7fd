"""A family's weight table applied to one model: which checkpoint tensor
fills which parameter, checked from the headers before any data is read.

Shape letters: as in `layout.py` (m D, h H, k K, d Dh, f F, v V, p
positions, t token types).
"""

from __future__ import annotations

import re

from mha_jax.pretrained import layout
from mha_jax.pretrained.errors import PretrainedError


def axis_sizes(config) -> dict[str, int]:
  """The layout letters' sizes for a `ModelConfig`."""
  return dict(m=config.d_model, h=config.num_heads,
              k=config.num_kv_heads or config.num_heads, d=config.head_width,
              f=config.mlp_width, v=config.vocab_size, p=config.max_len,
              t=config.type_vocab_size, three=3, two=2)


def expand(family, num_layers: int, naming: str = "source"):
  """Every rule of the table with `{l}` filled: [(name, rule, paths)].

  `naming`: "source" (the Hugging Face names) or "gguf" (the GGUF
  column; rules without a GGUF name are left out)."""
  out = []
  for rule in family.rules:
    name = getattr(rule, naming)
    if name is None:
      continue
    layers = range(num_layers) if "{l}" in name else [None]
    for l in layers:
      out.append((name.format(l=l), rule,
                  tuple(p.format(l=l) for p in rule.paths)))
  return out


def checkpoint_name(family, source: str, paths) -> str:
  """The name a tensor is saved under: the base model's prefix, except
  for the readout (a head beside the base model) and base-model classes."""
  if family.model == "encoder" or paths[0].startswith("readout."):
    return source
  return family.prefix + source


def plan(family, config, tensors, param_shapes, where, naming="source"):
  """`[(TensorInfo, rule, paths)]`: each parameter's source tensor.

  `tensors`: {name: TensorInfo} of the checkpoint; `param_shapes`:
  {dotted path: shape} of the model; `naming`: as in `expand` (GGUF
  names carry no prefix and no ignored buffers). Raises PretrainedError for a tensor
  the table does not know (or one whose parameter this config lacks), a
  parameter no tensor fills, a wrong shape or a non-float dtype, naming
  the file, the tensor, what was expected and what came.
  """
  table = {src: (rule, paths)
           for src, rule, paths in expand(family, config.num_layers, naming)}
  sizes = axis_sizes(config)
  prefix = family.prefix if naming == "source" else None
  filled, out = {}, []
  for name, info in sorted(tensors.items()):
    src = name[len(prefix):] if prefix and name.startswith(prefix) else name
    if naming == "source" and any(re.fullmatch(p, src)
                                  for p, _ in family.ignored):
      continue
    if src not in table:
      raise PretrainedError(info.file, f"unexpected tensor {name!r}: the "
                            f"{family.name} table has no such name (it reads "
                            f"names like {next(iter(table))!r})")
    rule, paths = table[src]
    if config.tie_embeddings and paths[0].startswith("readout."):
      continue  # a tied checkpoint that also stored its head
    absent = [p for p in paths if p not in param_shapes]
    if absent:
      raise PretrainedError(info.file, f"unexpected tensor {name!r}: it "
                            f"would fill {absent}, which this config's model "
                            "does not have (config.json and the weights "
                            "disagree)")
    want = layout.shape_of(rule.src, sizes)
    if info.shape != want:
      raise PretrainedError(info.file, f"tensor {name!r}: expected shape "
                            f"{list(want)} ({rule.src} for this config.json),"
                            f" got {list(info.shape)}")
    if not info.is_float:
      raise PretrainedError(info.file, f"tensor {name!r}: expected a float "
                            f"dtype ({info.float_kinds}), got {info.dtype}")
    for p in paths:
      filled[p] = name
    out.append((info, rule, paths))
  missing = [p for p in param_shapes if p not in filled]
  if missing:
    sources = {p: src for src, (_, paths) in table.items() for p in paths}
    names = [sources.get(p, "?") for p in missing]
    raise PretrainedError(where, f"missing tensors: {names} (for parameters "
                          f"{missing}); the checkpoint has "
                          f"{len(tensors)} tensors")
  return out
