"""GGUF architectures as Hugging Face families: which `general.architecture`
values load, and how their `<arch>.*` metadata becomes config.json fields.

`config_fields` gives the metadata as config.json fields of the family the
architecture maps to (`ARCHITECTURES`), so the family's own `from_hf`
builds the `ModelConfig` and refuses what it does not implement. Every
`<arch>.*` key is either mapped or known not to change the forward pass;
any other is refused by name, as config.json fields are. Architectures
that cannot load are refused saying why (`REFUSED`). How a file's
tensors are read, and llama.cpp's conversions undone, is
`gguf_files.py`'s.
"""

from __future__ import annotations

import dataclasses

from mha_jax.pretrained.errors import PretrainedError

# Metadata keys of an architecture -> config.json fields. A key mapped to
# None is read only to check it (see `config_fields`).
_COMMON_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "attention.value_length": None,  # must equal key_length
    "rope.dimension_count": None,  # the head width, or phi3's rotated part
}
# 0 is how llama.cpp's phi3 converter writes "no window".
_WINDOW = {"attention.sliding_window": "sliding_window"}
_FINAL_CAP = {"final_logit_softcapping": "final_logit_softcapping"}
_CAPS = dict(_FINAL_CAP, attn_logit_softcapping="attn_logit_softcapping")


@dataclasses.dataclass(frozen=True)
class Architecture:
  """How one GGUF `general.architecture` becomes a family.

  model_type: the config.json `model_type` (the family) it loads as.
  permute_qk: undo llama.cpp's q/k row permutation.
  norm_shift: subtracted from every `*norm.weight` (Gemma's 1 + w).
  keys: metadata keys (after `<arch>.`) -> config.json fields.
  partial_rotary: `rope.dimension_count` may be less than the head width
    (the rotated part, phi3); elsewhere it must equal it.
  defaults: config.json fields no key holds, as transformers' config
    class defaults them.
  """
  model_type: str
  permute_qk: bool
  norm_shift: float
  keys: dict
  partial_rotary: bool = False
  defaults: dict = dataclasses.field(default_factory=dict)


ARCHITECTURES = {
    "llama": Architecture("llama", permute_qk=True, norm_shift=0.0,
                          keys=_COMMON_KEYS),
    "qwen2": Architecture("qwen2", permute_qk=False, norm_shift=0.0,
                          keys=_COMMON_KEYS),
    "qwen3": Architecture("qwen3", permute_qk=False, norm_shift=0.0,
                          keys=_COMMON_KEYS),
    # The file has no query_pre_attn_scalar: Gemma 2 2B's and 9B's 256
    # (Gemma2Config's default); 27B's is 144, which llama.cpp infers
    # from the layer count and a file cannot say.
    "gemma2": Architecture("gemma2", permute_qk=False, norm_shift=1.0,
                           keys=dict(_COMMON_KEYS, **_WINDOW, **_CAPS),
                           defaults={"query_pre_attn_scalar": 256}),
    "gemma3": Architecture("gemma3_text", permute_qk=False, norm_shift=1.0,
                           keys=dict(_COMMON_KEYS, **_WINDOW, **_FINAL_CAP)),
    # original_context_length is written for every phi3 file; it acts
    # only with longrope's attn_factor and rope_factors_* tensors, which
    # are refused by name.
    "phi3": Architecture("phi3", permute_qk=False, norm_shift=0.0,
                         keys=dict(_COMMON_KEYS, **_WINDOW, **{
                             "rope.scaling.original_context_length":
                                 "original_max_position_embeddings"}),
                         partial_rotary=True),
}
# Architectures close to those above that mha_jax does not load, and why.
REFUSED = {
    "mistral3": "the newer Mistral converter's text model, which scales "
                "attention by position (attention.temperature_scale) and "
                "rope by YaRN; neither is implemented",
    "qwen2moe": "a mixture-of-experts MLP, which is not implemented",
    "qwen3moe": "a mixture-of-experts MLP, which is not implemented",
}
# Keys outside `<arch>.*` that describe the file, not the model's math.
_NEUTRAL_PREFIXES = ("general.", "tokenizer.", "GGUF.", "quantize.",
                     "split.")



def architecture(meta: dict, where) -> tuple[str, Architecture]:
  arch = meta.get("general.architecture")
  if arch in REFUSED:
    raise PretrainedError(where, f"key 'general.architecture': {arch!r} "
                          f"is refused: {REFUSED[arch]}; mha_jax loads "
                          f"{sorted(ARCHITECTURES)}")
  if arch not in ARCHITECTURES:
    raise PretrainedError(where, f"key 'general.architecture': mha_jax loads "
                          f"{sorted(ARCHITECTURES)}, got {arch!r}")
  return arch, ARCHITECTURES[arch]


def config_fields(meta: dict, tensors: dict, where) -> dict:
  """The config.json fields that `meta` (from `metadata`) stands for.

  `tensors` ({name: GGUFTensor}) settles what the metadata leaves out:
  the vocabulary (the embedding's rows, when `<arch>.vocab_size` is
  absent) and tied embeddings (no `output.weight`). Raises a
  PretrainedError naming the key for any `<arch>.*` key not understood,
  or a value mha_jax does not implement.
  """
  arch, spec = architecture(meta, where)
  fields = {"model_type": spec.model_type}
  prefix = arch + "."
  for key, value in meta.items():
    if not key.startswith(prefix):
      if not key.startswith(_NEUTRAL_PREFIXES):
        raise PretrainedError(where, f"key {key!r}={value!r} is not "
                              f"understood by the GGUF loader")
      continue
    name = key[len(prefix):]
    if name not in spec.keys and name.startswith("rope.scaling."):
      raise PretrainedError(where, f"key {key!r}={value!r}: rope scaling "
                            "in GGUF metadata is not implemented; expected "
                            "no rope.scaling keys")
    if name not in spec.keys:
      raise PretrainedError(where, f"key {key!r}={value!r} is not "
                            f"understood by the {arch} GGUF loader (it reads "
                            f"{sorted(prefix + k for k in spec.keys)})")
    if spec.keys[name] == "sliding_window" and value == 0:
      continue  # llama.cpp's phi3 converter's "no window"
    if spec.keys[name] is not None:
      fields[spec.keys[name]] = value
  heads = fields.get("num_attention_heads")
  if "head_dim" not in fields and isinstance(heads, int) and heads > 0:
    fields["head_dim"] = fields.get("hidden_size", 0) // heads
  head_dim = fields.get("head_dim")
  got = meta.get(prefix + "attention.value_length")
  if got is not None and got != head_dim:
    raise PretrainedError(where, f"key {prefix + 'attention.value_length'!r}"
                          f": mha_jax expects the head width {head_dim} (no "
                          f"separate value width), got {got}")
  got = meta.get(prefix + "rope.dimension_count")
  if got is not None and spec.partial_rotary and isinstance(
      head_dim, int) and 0 < got <= head_dim:
    fields["partial_rotary_factor"] = got / head_dim
  elif got is not None and got != head_dim:
    raise PretrainedError(where, f"key {prefix + 'rope.dimension_count'!r}: "
                          f"mha_jax expects the head width {head_dim} (no "
                          f"partial rotary in {arch} files), got {got}")
  for name, value in spec.defaults.items():
    fields.setdefault(name, value)
  if "vocab_size" not in fields and "token_embd.weight" in tensors:
    fields["vocab_size"] = tensors["token_embd.weight"].shape[0]
  fields["tie_word_embeddings"] = "output.weight" not in tensors
  return fields
