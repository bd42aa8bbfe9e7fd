"""Reading GGUF files (llama.cpp's format) as a checkpoint source, no torch.

A GGUF file holds key-value metadata (`general.*`, `<arch>.*` for the
architecture, `tokenizer.ggml.*`) and named tensors, quantized or not.
The `gguf` package parses the header and memory-maps the data;
`gguf.quants.dequantize` turns every quantized type it knows (F32, F16,
BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K ... Q6_K and more) into float32
in NumPy, one tensor at a time, so loading holds one float32 copy of the
model plus one tensor.

This module reads a file into what the safetensors path has (the
metadata's mapping to config.json fields, architecture by architecture,
is `gguf_architectures.py`'s):
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

from mha_jax.pretrained import gguf_architectures
from mha_jax.pretrained.errors import PretrainedError

MAGIC = b"GGUF"
_Q = gguf.GGMLQuantizationType
# Float and quantized types `gguf.quants.dequantize` reads.
SUPPORTED = tuple(t for t in _Q if t in (_Q.F32, _Q.F16) or
                  t in quants._type_traits)  # pylint: disable=protected-access

_SUPPORTED_NAMES = frozenset(t.name for t in SUPPORTED)

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
  spec = gguf_architectures.ARCHITECTURES[arch]
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
