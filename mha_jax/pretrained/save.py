"""`save_pretrained`: an mha_jax model -> a Hugging Face directory.

Writes config.json and model.safetensors that `transformers` opens with
`AutoModelForCausalLM` (decoders) or `AutoModel` (BERT). The weights go
through the family's table backwards (`layout.to_source`), so a loaded
model saves the tensors it was loaded from, bit for bit.

A model is saved as a family only when that family's config.json gives
back exactly the model's `ModelConfig`; otherwise the call is refused and
names the fields no family holds (docs/pretrained.md lists the project's
options that have none, for example `attention_only` and `attention_sinks`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
from flax import nnx

from mha_jax.models import transformer
from mha_jax.models.model_config import ModelConfig
from mha_jax.pretrained import layout
from mha_jax.pretrained import safetensors_files
from mha_jax.pretrained import weights
from mha_jax.pretrained.errors import PretrainedError
from mha_jax.pretrained.families import FAMILIES
from mha_jax.pretrained.family import HFConfig

# How a model runs, not what it computes: not part of a family's config.
_RUNTIME = ("implementation", "dtype", "param_dtype", "dropout_rate")
_DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
           np.dtype(np.float64): "float64"}


def canonical(config: ModelConfig) -> ModelConfig:
  """`config` with every default that stands for a value resolved (K,
  Dh, F, b_o, one window per layer, the sliding layers' rotary base), so
  equal models compare equal."""
  windows = tuple(config.window_of(l) for l in range(config.num_layers))
  # A local base that changes nothing (no sliding layer, or the global
  # base without a scaling) is the same model as none.
  local = config.local_rotary_base
  if all(w is None for w in windows) or (
      local == config.rotary_base and config.rotary_scaling is None):
    local = None
  return config.replace(local_rotary_base=local,
      num_kv_heads=config.num_kv_heads or config.num_heads,
      head_dim=config.head_width, mlp_dim=config.mlp_width,
      out_bias=config.has_out_bias, local_window=None,
      layer_windows=None if all(w is None for w in windows) else windows)


def hf_config(config: ModelConfig, family):
  """`(config.json fields or None, differences, written)`: the fields
  when `family` holds `config` exactly; else the differing fields as
  'name: model X, family gives Y' (`written` False when the family could
  not even write the config)."""
  try:
    fields = dict(family.to_hf(config), model_type=family.model_types[0],
                  architectures=[family.architecture])
    kwargs = family.from_hf(HFConfig(fields, "config.json"))
    back = ModelConfig(**kwargs, **{n: getattr(config, n) for n in _RUNTIME})
  except (ValueError, TypeError) as e:  # a field the family cannot write
    return None, [str(e)], False
  ours, theirs = canonical(config), canonical(back)
  diff = [f"{f.name}: model {getattr(ours, f.name)!r}, {family.name} "
          f"gives {getattr(theirs, f.name)!r}"
          for f in dataclasses.fields(ModelConfig)
          if getattr(ours, f.name) != getattr(theirs, f.name)]
  return (None if diff else fields), diff, True


def choose_family(config: ModelConfig, kind: str, name: str | None = None):
  """The family that holds `config` (the named one, or the first that
  does), with its config.json fields; a PretrainedError names the fields
  of the closest family that do not fit."""
  candidates = ([FAMILIES[name]] if name else
                [f for f in FAMILIES.values() if f.model == kind])
  if name is not None and name not in FAMILIES:
    raise PretrainedError("save_pretrained", f"`family`: expected one of "
                          f"{sorted(FAMILIES)}, got {name!r}")
  misses = []
  for family in candidates:
    if family.model != kind:
      raise PretrainedError("save_pretrained", f"`family`={name!r} is a(n) "
                            f"{family.model}, the model is a(n) {kind}")
    fields, diff, written = hf_config(config, family)
    if fields is not None:
      return family, fields
    # A family that could not even write the config ranks last.
    misses.append((not written, len(diff), family.name, diff))
  *_, closest, diff = min(misses)
  raise PretrainedError("save_pretrained", f"no family holds this "
                        f"ModelConfig; the closest, {closest}, differs in: "
                        + "; ".join(diff))


def save_pretrained(model, directory, *, family: str | None = None,
                    tokenizer=None) -> pathlib.Path:
  """Write `model` (a `DecoderLM` or `Encoder`) as a Hugging Face
  checkpoint: `directory/config.json` and `model.safetensors` (and
  `tokenizer.json` when a `tokenizers.Tokenizer` is given).

  `family`: one of `FAMILIES` (None: the first that holds the config).
  Parameters keep their dtype (float32, float16, bfloat16). Returns the
  directory.
  """
  kinds = {transformer.DecoderLM: "decoder", transformer.Encoder: "encoder"}
  if type(model) not in kinds:
    raise PretrainedError("save_pretrained", f"`model`: expected a DecoderLM"
                          f" or Encoder, got {type(model).__name__}")
  config = model.config
  fam, fields = choose_family(config, kinds[type(model)], family)
  params = {".".join(map(str, p)): np.asarray(v[...])
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  sizes = weights.axis_sizes(config)
  tensors, used = {}, set()
  for source, rule, paths in weights.expand(fam, config.num_layers):
    if not all(p in params for p in paths):
      continue
    name = weights.checkpoint_name(fam, source, paths)
    tensors[name] = np.ascontiguousarray(layout.to_source(
        [params[p] for p in paths], rule.src, rule.dst, sizes))
    used.update(paths)
  left = sorted(set(params) - used)
  if left:  # a table that misses a parameter would lose it silently
    raise PretrainedError("save_pretrained", f"parameters {left} have no "
                          f"tensor in the {fam.name} table")
  dtype = next(iter(params.values())).dtype
  fields["dtype"] = _DTYPES.get(np.dtype(dtype), "bfloat16")
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
  safetensors_files.write(tensors, directory / safetensors_files.SINGLE,
                          metadata={"format": "pt"})
  if tokenizer is not None:
    tokenizer.save(str(directory / "tokenizer.json"))
  return directory
