"""What a pretrained family is: a weight table, a config mapping, names.

A `Family` holds, as data, the table of `Rule`s from the checkpoint's
tensor names to mha_jax parameter paths (with the layout strings of
`layout.py`), the names it ignores and why, and two functions between
Hugging Face's `config.json` and `ModelConfig`. A new family is a new
module with one of these; the loader and the writer are shared.

`HFConfig` reads config.json and records every field read, so any field
that no family function read, and that is not known to leave the forward
pass alone, is refused by name.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from mha_jax.pretrained.errors import PretrainedError


@dataclasses.dataclass(frozen=True)
class Rule:
  """Source tensor `source` (with `{l}` for the layer) in layout `src` ->
  the parameter paths `targets` (dotted, `{l}` too) in layout `dst`.

  `gguf`: the same tensor's name in llama.cpp's GGUF files
  (`blk.{l}.attn_q.weight`), or None where the family has no GGUF form.
  GGUF lists a tensor's dimensions innermost first, so once read as a
  NumPy array it has the `src` layout too.
  """
  source: str
  src: str
  targets: tuple[str, ...] | str
  dst: str
  gguf: str | None = None

  @property
  def paths(self) -> tuple[str, ...]:
    return (self.targets,) if isinstance(self.targets, str) else self.targets


@dataclasses.dataclass(frozen=True)
class Family:
  """One architecture family.

  model_types: config.json `model_type` values it reads.
  architecture: the class name written back (`architectures` in config).
  model: "decoder" (`DecoderLM`) or "encoder" (`Encoder`).
  prefix: the base model's prefix in task-head checkpoints ("model.");
    names are read with it or without it and written with it.
  rules: the weight table; ignored: regexes of names not loaded, each
    with the reason (buffers, heads the model has no use for).
  from_hf: HFConfig -> ModelConfig keyword arguments.
  to_hf: ModelConfig -> config.json fields (`model_type` and
    `architectures` are added).
  """
  name: str
  model_types: tuple[str, ...]
  architecture: str
  model: str
  prefix: str
  rules: tuple[Rule, ...]
  ignored: tuple[tuple[str, str], ...]
  from_hf: Callable[["HFConfig"], dict]
  to_hf: Callable[[Any], dict]


# Fields that do not change the forward pass: bookkeeping, token ids, and
# training-only options (dropout probabilities, initialisation).
_NEUTRAL = {
    "_name_or_path", "architectures", "model_type", "transformers_version",
    "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id",
    "decoder_start_token_id", "use_cache", "initializer_range",
    "gradient_checkpointing", "return_dict", "output_hidden_states",
    "output_attentions", "tokenizer_class", "task_specific_params",
    "id2label", "label2id", "problem_type", "finetuning_task", "prefix",
    "chunk_size_feed_forward", "torchscript", "tie_encoder_decoder",
    "is_encoder_decoder", "pruned_heads", "max_length", "min_length",
    "num_beams", "do_sample", "temperature", "top_k", "top_p",
    "num_return_sequences", "use_return_dict", "initializer_factor",
    "cache_implementation",  # which KV cache class generate() uses
}
_NEUTRAL_PATTERNS = (r".*dropout.*", r".*_pdrop", r"summary_.*")


class HFConfig:
  """config.json's fields, read through `get`/`need` so that what no
  family read can be refused by name (`check_all_read`)."""

  def __init__(self, fields: dict, where):
    self.fields, self.where, self.read = dict(fields), str(where), set()

  def __contains__(self, name):
    return name in self.fields

  def get(self, name: str, default=None):
    self.read.add(name)
    val = self.fields.get(name)
    return default if val is None else val

  def need(self, name: str, kinds=(int,)):
    """A required field of one of the Python `kinds`."""
    self.read.add(name)
    if name not in self.fields or self.fields[name] is None:
      raise PretrainedError(self.where, f"field {name!r}: expected a value, "
                            "got none (the field is missing)")
    val = self.fields[name]
    if not isinstance(val, kinds) or isinstance(val, bool) != (bool in kinds):
      raise PretrainedError(self.where, f"field {name!r}: expected "
                            f"{'/'.join(k.__name__ for k in kinds)}, got "
                            f"{val!r}")
    return val

  def only(self, name: str, allowed, default=None):
    """A field that must be one of `allowed` (anything else is refused)."""
    val = self.get(name, default)
    if val not in allowed:
      raise PretrainedError(self.where, f"field {name!r}: mha_jax supports "
                            f"{list(allowed)}, got {val!r}")
    return val

  def fail(self, name: str, message: str):
    raise PretrainedError(self.where, f"field {name!r}: {message}")

  def check_all_read(self, family: str):
    """Refuse any field that the family did not read and that is not
    known to be neutral."""
    for name, val in self.fields.items():
      if name in self.read or name in _NEUTRAL or any(
          re.fullmatch(p, name) for p in _NEUTRAL_PATTERNS):
        continue
      raise PretrainedError(self.where, f"field {name!r}={val!r} is not "
                            f"understood by the {family} loader (it reads "
                            "the fields docs/pretrained.md lists)")


# --- the mappings several families share --------------------------------

ACTIVATIONS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "silu": "silu", "swish": "silu", "relu": "relu"}
ACTIVATION_NAMES = {"gelu_erf": "gelu", "gelu_tanh": "gelu_pytorch_tanh",
                    "silu": "silu", "relu": "relu"}


def activation(hf: HFConfig, name: str, default: str) -> str:
  return ACTIVATIONS[hf.only(name, tuple(ACTIVATIONS), default)]


def rope(hf: HFConfig, *, theta_field="rope_theta", default_theta=10000.0,
         partial_field=None):
  """(base, scaling, partial factor) from `rope_parameters` (transformers
  5) or the older `rope_theta` / `rope_scaling` fields; a rope type
  mha_jax does not implement is refused by name."""
  params = hf.get("rope_parameters")
  if params is not None and hf.get("rope_scaling") is not None:
    hf.fail("rope_scaling", "given beside rope_parameters; expected one of "
            "the two")
  if params is None:
    params = dict(hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get(theta_field, default_theta))
    if partial_field is not None and partial_field in hf:
      params["partial_rotary_factor"] = hf.get(partial_field)
  field = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"
  kind = params.get("rope_type", params.get("type", "default"))
  known = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
  if kind == "default":
    scaling = None
  elif kind == "linear":
    known |= {"factor"}
    scaling = ("linear", float(params["factor"]))
  elif kind == "llama3":
    known |= {"factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings"}
    scaling = ("llama3", float(params["factor"]),
               float(params["low_freq_factor"]),
               float(params["high_freq_factor"]),
               int(params["original_max_position_embeddings"]))
  else:
    hf.fail(field, f"rope_type {kind!r} is not implemented; mha_jax "
            "implements 'default', 'linear' and 'llama3'")
  extra = sorted(set(params) - known)
  if extra:
    hf.fail(field, f"entries {extra} are not understood for rope_type "
            f"{kind!r}")
  return (float(params["rope_theta"]), scaling,
          float(params.get("partial_rotary_factor", 1.0)))


def rope_to_hf(config, partial: float | None = None) -> dict:
  """`rope_parameters` for config.json (transformers 5's field)."""
  out = {"rope_theta": config.rotary_base, "rope_type": "default"}
  s = config.rotary_scaling
  if s is not None and s[0] == "linear":
    out.update(rope_type="linear", factor=s[1])
  elif s is not None:
    out.update(rope_type="llama3", factor=s[1], low_freq_factor=s[2],
               high_freq_factor=s[3], original_max_position_embeddings=s[4])
  if partial is not None:
    out["partial_rotary_factor"] = partial
  return {"rope_parameters": out}


def windows(hf: HFConfig, num_layers: int, slides=lambda layer: True):
  """Per-layer sliding windows from `layer_types` / `sliding_window`.

  Hugging Face lets query i see key j when i - W < j <= i, so a window W
  is mha_jax's (left, right) = (W - 1, 0). Without `layer_types` (configs
  written before transformers 5), layer l slides when `sliding_window`
  is set and `slides(l)`: the family's own rule.
  """
  w = hf.get("sliding_window")
  types = hf.get("layer_types")
  if types is None:
    types = ["sliding_attention" if (w is not None and slides(l))
             else "full_attention" for l in range(num_layers)]
  if len(types) != num_layers or not set(types) <= {
      "sliding_attention", "full_attention"}:
    hf.fail("layer_types", f"expected {num_layers} entries of "
            f"'sliding_attention' or 'full_attention', got {types!r}")
  if "sliding_attention" in types and not isinstance(w, int):
    hf.fail("sliding_window", f"expected an int for the sliding layers, "
            f"got {w!r}")
  out = tuple((w - 1, 0) if t == "sliding_attention" else None
              for t in types)
  return None if all(x is None for x in out) else out


def windows_to_hf(config) -> dict:
  w = config.layer_windows or (config.local_window,) * config.num_layers
  sizes = {x[0] + 1 for x in w if x is not None}
  if len(sizes) > 1 or any(x is not None and x[1] != 0 for x in w):
    raise ValueError(f"windows {w!r}: Hugging Face has one causal window "
                     "size per model")
  return {"sliding_window": sizes.pop() if sizes else None,
          "layer_types": ["sliding_attention" if x is not None
                          else "full_attention" for x in w]}
