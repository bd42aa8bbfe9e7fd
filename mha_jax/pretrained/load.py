"""`load_pretrained`: a Hugging Face directory -> an mha_jax model.

    model = mha_jax.load_pretrained("path/to/gpt2")     # a DecoderLM
    logits, acts = model(tokens, capture=("blocks.3.attn.pattern",))

Everything that can be wrong is found from config.json and the
safetensors headers, before a byte of weight data is read; then each
tensor is read from the memory-mapped file, laid out by the family's
table (`layout.py`) and put on the device, one at a time.
"""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
from flax import nnx

from mha_jax.models import transformer
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.model_config import ModelConfigError
from mha_jax.pretrained import layout
from mha_jax.pretrained import safetensors_files
from mha_jax.pretrained import weights
from mha_jax.pretrained.errors import PretrainedError
from mha_jax.pretrained.family import HFConfig
from mha_jax.pretrained.families import BY_MODEL_TYPE

CONFIG = "config.json"
MODELS = {"decoder": transformer.DecoderLM, "encoder": transformer.Encoder}


def read_config_json(directory) -> dict:
  """config.json of a checkpoint directory, or a PretrainedError."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    raise PretrainedError(directory, "expected a checkpoint directory, got "
                          "no such directory")
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


def load_config(path, **overrides) -> ModelConfig:
  """The `ModelConfig` of a checkpoint directory, reading no weights."""
  directory = pathlib.Path(path)
  return config_from_fields(read_config_json(directory), directory / CONFIG,
                            **overrides)[1]


def load_pretrained(path, *, implementation: str = "einsum",
                    param_dtype=jnp.float32, dtype=None):
  """A `DecoderLM` (GPT-2, Llama, Mistral, Qwen2, Gemma 2, GPT-NeoX) or
  `Encoder` (BERT) with the weights of a local Hugging Face directory.

  Args:
    path: a directory with config.json and model.safetensors (or shards
      with model.safetensors.index.json).
    implementation: the attention path (a key of
      `attention.IMPLEMENTATIONS`); "einsum" and "vmap" form every hook
      site, "flash" is the fastest on long inputs.
    param_dtype: the parameters' dtype (the checkpoint's values are cast:
      bf16 -> float32 is exact).
    dtype: the compute dtype (None: `param_dtype`).

  Raises PretrainedError (a ValueError) naming the file, tensor or field
  when anything does not match, before any model is built.
  """
  directory = pathlib.Path(path)
  fields = read_config_json(directory)
  family, config = config_from_fields(
      fields, directory / CONFIG, implementation=implementation,
      param_dtype=param_dtype, dtype=dtype)
  tensors = safetensors_files.list_tensors(
      safetensors_files.checkpoint_files(directory))
  cls = MODELS[family.model]
  abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = {".".join(map(str, p)): v for p, v in nnx.to_flat_state(state)}
  shapes = {p: tuple(v.shape) for p, v in flat.items()}
  sizes = weights.axis_sizes(config)
  values = {}
  for info, rule, paths in weights.plan(family, config, tensors, shapes,
                                        directory):
    arrays = layout.to_params(safetensors_files.read_tensor(info), rule.src,
                              rule.dst, sizes)
    for p, a in zip(paths, arrays):
      if a.shape != shapes[p]:  # a table whose layouts disagree with us
        raise PretrainedError(info.file, f"tensor {info.name!r} gives "
                              f"{p} shape {a.shape}, expected {shapes[p]}")
      values[p] = jnp.asarray(a, param_dtype)
  new = nnx.from_flat_state([(p, v.replace(values[".".join(map(str, p))]))
                             for p, v in nnx.to_flat_state(state)])
  return nnx.merge(graphdef, new)



