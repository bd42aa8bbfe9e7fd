"""Reading GGUF files (llama.cpp's format) as a checkpoint source, no torch.

A GGUF file holds key-value metadata (`general.*`, `<arch>.*` for the
architecture, `tokenizer.ggml.*`) and named tensors, quantized or not.
The `gguf` package parses the header and memory-maps the data;
`gguf.quants.dequantize` turns every quantized type it knows (F32, F16,
BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K ... Q6_K and more) into float32
in NumPy, one tensor at a time, so loading holds one float32 copy of the
model plus one tensor.

This module turns a file into what the safetensors path has:
- `config_fields`: the metadata as config.json fields of the family the
  architecture maps to (`ARCHITECTURES`), so the family's own `from_hf`
  builds the `ModelConfig` and refuses what it does not implement. Every
  `<arch>.*` key is either mapped or known not to change the forward pass;
  any other is refused by name, as config.json fields are.
- `list_tensors` / `read_tensor`: the tensors under their GGUF names
  (the family tables' `gguf` column), each read as float32 in the
  layout of the Hugging Face tensor, with llama.cpp's conversion undone:
  - llama: the converter permutes the rows of q and k from Hugging
    Face's rotate-half order to the interleaved pairs (2i, 2i + 1) that
    llama.cpp rotates; `unpermute_qk` restores them.
    Mistral's files are llama files (llama.cpp's converter writes
    MistralForCausalLM as `llama`; the `gguf` package has no `mistral`
    architecture) and load as llama: the file keeps no sliding window
    and llama.cpp attends to every position, as mha_jax then does.
  - gemma2, gemma3: the converter stores Gemma's RMSNorm weights as
    1 + w; `read_tensor` subtracts 1 in float32, as transformers' GGUF
    loader does, so the weights equal its converted tensors bit for bit.
  - qwen2, qwen3, phi3, gemma2, gemma3: rotated as stored (llama.cpp's
    rotate-half "NEOX" mode), no permutation. phi3 keeps Hugging Face's
    fused `attn_qkv` (q, k, v rows) and `ffn_up` (gate, up rows), which
    the phi3 family's table splits.

GGUF lists dimensions innermost first (`ne`); the package reverses them,
so a matrix stored `[in, out]` in `ne` arrives as the `[out, in]` array
of a torch `Linear` weight, the layout the tables name.
"""

from __future__ import annotations

import dataclasses
import pathlib

import gguf
import numpy as np
from gguf import quants

from mha_jax.pretrained.errors import PretrainedError

MAGIC = b"GGUF"
_Q = gguf.GGMLQuantizationType
# Float and quantized types `gguf.quants.dequantize` reads.
SUPPORTED = tuple(t for t in _Q if t in (_Q.F32, _Q.F16) or
                  t in quants._type_traits)  # pylint: disable=protected-access

_SUPPORTED_NAMES = frozenset(t.name for t in SUPPORTED)

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


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
  """One tensor of a GGUF file: `shape` in NumPy order (outermost
  first), `dtype` the GGML type's name; `is_float` says whether
  `gguf.quants` can read it as float32."""
  name: str
  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]
  index: int  # its position in the reader's tensor list

  @property
  def is_float(self) -> bool:
    return self.dtype in _SUPPORTED_NAMES

  float_kinds = ("a type gguf.quants dequantizes: "
                 + ", ".join(t.name for t in SUPPORTED))


def is_gguf(path) -> bool:
  """Whether `path` is a file that starts with GGUF's magic bytes."""
  path = pathlib.Path(path)
  if not path.is_file():
    return False
  with open(path, "rb") as f:
    return f.read(4) == MAGIC


def open_reader(path) -> gguf.GGUFReader:
  """The memory-mapped reader of a GGUF file; a missing, truncated or
  corrupt file raises a PretrainedError naming it."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise PretrainedError(path, "expected a GGUF file, got no such file")
  if not is_gguf(path):
    raise PretrainedError(path, f"expected a GGUF file (magic {MAGIC!r}), "
                          "got other bytes")
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, IndexError, OSError, KeyError) as e:
    # A tensor cut short fails the reader's reshape (ValueError).
    raise PretrainedError(path, f"expected a complete GGUF file, the gguf "
                          f"package could not read it ({type(e).__name__}: "
                          f"{e}); is it truncated?") from e
  return reader


def metadata(reader: gguf.GGUFReader) -> dict:
  """Every key's value as Python data, except the tokenizer's long
  arrays (tokens, scores, merges, token types), read on demand."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("tokenizer.ggml.") and field.types and (
        field.types[0] == gguf.GGUFValueType.ARRAY):
      out[key] = ...  # present; `gguf_tokenizer` reads it
      continue
    out[key] = field.contents()
  return out


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


def list_tensors(reader: gguf.GGUFReader, path) -> dict[str, GGUFTensor]:
  """Every tensor of the file by name."""
  path = pathlib.Path(path)
  out = {}
  for i, t in enumerate(reader.tensors):
    if t.name in out:
      raise PretrainedError(path, f"tensor {t.name!r} appears twice")
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    out[t.name] = GGUFTensor(t.name, path, t.tensor_type.name, shape, i)
  return out


def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's row permutation of a q or k weight `[heads * Dh,
  ...]`: within each head, the converter moved row i and row i + Dh/2
  (rotate-half partners) to rows 2i and 2i + 1."""
  dh = w.shape[0] // heads
  x = w.reshape(heads, dh // 2, 2, *w.shape[1:])  # stored: row 2i + half
  return np.swapaxes(x, 1, 2).reshape(w.shape)  # row half * Dh/2 + i


# Rows dequantized at a time: the package's NumPy code makes several
# float32 temporaries of its input's size, so a whole embedding (Gemma 3's
# is 671 MB as float32) at once would hold about three copies.
_CHUNK_BYTES = 16 << 20


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
  """`gguf.quants.dequantize` of a tensor's raw data (rows on the first
  axis), a block of rows at a time into one float32 array, so the peak
  is that array plus one block's temporaries."""
  if data.ndim < 2 or data.nbytes <= _CHUNK_BYTES:
    return np.array(quants.dequantize(data, qtype), np.float32)
  rows = max(1, _CHUNK_BYTES // (data.nbytes // data.shape[0]))
  first = quants.dequantize(data[:rows], qtype)
  out = np.empty((data.shape[0],) + first.shape[1:], np.float32)
  out[:rows] = first
  for start in range(rows, data.shape[0], rows):
    out[start:start + rows] = quants.dequantize(data[start:start + rows],
                                                qtype)
  return out


def read_tensor(reader: gguf.GGUFReader, info: GGUFTensor, arch: str,
                config) -> np.ndarray:
  """One tensor, dequantized to float32 in the Hugging Face layout (the
  conversions of the module docstring undone)."""
  t = reader.tensors[info.index]
  spec = ARCHITECTURES[arch]
  x = dequantize(t.data, t.tensor_type).reshape(info.shape)
  if spec.permute_qk and info.name.endswith(("attn_q.weight",
                                             "attn_q.bias")):
    x = unpermute_qk(x, config.num_heads)
  elif spec.permute_qk and info.name.endswith(("attn_k.weight",
                                               "attn_k.bias")):
    x = unpermute_qk(x, config.num_kv_heads or config.num_heads)
  if spec.norm_shift and info.name.endswith("norm.weight"):
    x = x - np.float32(spec.norm_shift)
  return x
