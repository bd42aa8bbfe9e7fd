"""`load_pretrained`: a Hugging Face directory or a GGUF file -> a model.

    model = mha_jax.load_pretrained("path/to/gpt2")     # a DecoderLM
    model = mha_jax.load_pretrained("smollm2.Q4_1.gguf")  # the same, GGUF
    logits, acts = model(tokens, capture=("blocks.3.attn.pattern",))

Everything that can be wrong is found from config.json (or the GGUF
metadata) and the tensor headers, before a byte of weight data is read;
then each tensor is read from the memory-mapped file (a GGUF tensor
dequantized to float32), laid out by the family's table (`layout.py`)
and put on the device, one at a time.
"""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
from flax import nnx

from mha_jax.core import attention
from mha_jax.models import transformer
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.model_config import ModelConfigError
from mha_jax.pretrained import gguf_architectures
from mha_jax.pretrained import gguf_files
from mha_jax.pretrained import layout
from mha_jax.pretrained import safetensors_files
from mha_jax.pretrained import weights
from mha_jax.pretrained.errors import PretrainedError
from mha_jax.pretrained.family import HFConfig
from mha_jax.pretrained.families import BY_MODEL_TYPE

CONFIG = "config.json"
MODELS = {"decoder": transformer.DecoderLM, "encoder": transformer.Encoder}


def read_config_json(directory) -> dict:
  """config.json of a checkpoint directory, or a PretrainedError (which,
  for a path that is no directory, says what the loaders take: a
  directory or a GGUF file)."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    if directory.suffix == ".gguf" and not directory.exists():
      problem = "expected a GGUF file, got no such file"
    elif not directory.exists():
      problem = ("expected a checkpoint directory or a GGUF file, got no "
                 "such file or directory")
    else:
      problem = ("expected a checkpoint directory or a GGUF file, got a "
                 "file that is not GGUF")
    raise PretrainedError(directory, problem)
  path = directory / CONFIG
  if not path.is_file():
    found = sorted(p.name for p in directory.iterdir())
    raise PretrainedError(directory, f"expected {CONFIG} (the model's "
                          f"architecture), found {found}")
  try:
    fields = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise PretrainedError(path, f"expected JSON, got {e}") from e
  if not isinstance(fields, dict):
    raise PretrainedError(path, f"expected a JSON object, got "
                          f"{type(fields).__name__}")
  return fields


def family_of(fields: dict, where):
  kind = fields.get("model_type")
  if kind not in BY_MODEL_TYPE:
    raise PretrainedError(where, f"field 'model_type': mha_jax loads "
                          f"{sorted(BY_MODEL_TYPE)}, got {kind!r}")
  return BY_MODEL_TYPE[kind]


def config_from_fields(fields: dict, where, **overrides):
  """(family, ModelConfig) of config.json's `fields`; `overrides` are
  ModelConfig fields the caller chooses (implementation, dtypes)."""
  family = family_of(fields, where)
  hf = HFConfig(fields, where)
  kwargs = family.from_hf(hf)
  hf.check_all_read(family.name)
  try:
    return family, ModelConfig(**kwargs, **overrides)
  except ModelConfigError as e:
    raise PretrainedError(where, f"gives an invalid ModelConfig: {e}") from e


class _Source:
  """A checkpoint's config.json fields, tensors and how to read one: a
  Hugging Face directory, or a GGUF file (`gguf_files`)."""

  def __init__(self, path):
    self.path = pathlib.Path(path)
    if self.path.is_file() and (self.path.suffix == ".gguf"
                                or gguf_files.is_gguf(self.path)):
      self.reader = gguf_files.open_reader(self.path)
      self.where = self.path
      self.meta = gguf_files.metadata(self.reader)
      self.arch, _ = gguf_architectures.architecture(self.meta, self.where)
      self.tensors = gguf_files.list_tensors(self.reader, self.path)
      self.fields = gguf_architectures.config_fields(self.meta, self.tensors,
                                             self.where)
      self.naming = "gguf"
    else:
      self.reader = None
      self.fields = read_config_json(self.path)
      self.where = self.path / CONFIG
      self.naming = "source"
      self.tensors = None  # listed on demand: load_config reads no header

  def list_tensors(self):
    if self.tensors is None:
      self.tensors = safetensors_files.list_tensors(
          safetensors_files.checkpoint_files(self.path))
    return self.tensors

  def read(self, info, config):
    if self.reader is None:
      return safetensors_files.read_tensor(info)
    return gguf_files.read_tensor(self.reader, info, self.arch, config)


def load_config(path, **overrides) -> ModelConfig:
  """The `ModelConfig` of a checkpoint directory or GGUF file, reading
  no weights."""
  source = _Source(path)
  return config_from_fields(source.fields, source.where, **overrides)[1]


def load_pretrained(path, *,
                    implementation: str = attention.RUN_IMPLEMENTATION,
                    param_dtype=jnp.float32, dtype=None):
  """A `DecoderLM` (GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2,
  Gemma 3, GPT-NeoX) or `Encoder` (BERT) with the weights of a local
  checkpoint.

  Args:
    path: a directory with config.json and model.safetensors (or shards
      with model.safetensors.index.json), or a GGUF file (architectures
      `gguf_architectures.ARCHITECTURES`: llama, qwen2, qwen3, gemma2, gemma3,
      phi3), whose tensors are dequantized to float32 (`gguf.quants`)
      and then cast to `param_dtype`.
    implementation: the attention path (a key of
      `attention.IMPLEMENTATIONS`); "einsum" (`attention.RUN_IMPLEMENTATION`,
      the default of runs at real sizes) and "vmap" form every hook site,
      "flash" is the fastest on long inputs.
    param_dtype: the parameters' dtype (the checkpoint's values are cast
      with rounding to nearest even: bf16 -> float32 is exact).
    dtype: the compute dtype (None: `param_dtype`).

  Raises PretrainedError (a ValueError) naming the file, tensor or field
  (GGUF: key) when anything does not match, before any model is built.
  """
  source = _Source(path)
  family, config = config_from_fields(
      source.fields, source.where, implementation=implementation,
      param_dtype=param_dtype, dtype=dtype)
  tensors = source.list_tensors()
  cls = MODELS[family.model]
  abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = {".".join(map(str, p)): v for p, v in nnx.to_flat_state(state)}
  shapes = {p: tuple(v.shape) for p, v in flat.items()}
  sizes = weights.axis_sizes(config)
  values = {}
  for info, rule, paths in weights.plan(family, config, tensors, shapes,
                                        source.path, source.naming):
    arrays = layout.to_params(source.read(info, config), rule.src,
                              rule.dst, sizes)
    for p, a in zip(paths, arrays):
      if a.shape != shapes[p]:  # a table whose layouts disagree with us
        raise PretrainedError(info.file, f"tensor {info.name!r} gives "
                              f"{p} shape {a.shape}, expected {shapes[p]}")
      values[p] = jnp.asarray(a, param_dtype)
  new = nnx.from_flat_state([(p, v.replace(values[".".join(map(str, p))]))
                             for p, v in nnx.to_flat_state(state)])
  return nnx.merge(graphdef, new)
