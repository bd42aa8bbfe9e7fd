"""Reading and writing safetensors checkpoints, memory-mapped, no torch.

A Hugging Face directory holds `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`{"weight_map": {tensor: file}}`). The
`safetensors` package checks each file's header and reads each tensor
from the memory-mapped file on demand, one at a time, so loading never
holds the checkpoint twice. NumPy has no bfloat16, so bf16 tensors are
viewed from the mapped bytes as `ml_dtypes.bfloat16` (what jnp.bfloat16
is), with offsets from the same header.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import struct

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from mha_jax.pretrained.errors import PretrainedError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_FLOATS = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "BF16": ml_dtypes.bfloat16}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """Where one tensor lives and what it is, from its file's header."""
  name: str
  file: pathlib.Path
  dtype: str  # safetensors' code: "F32", "BF16", "I64", ...
  shape: tuple[int, ...]
  span: tuple[int, int]  # its bytes in the file, from the file's start

  @property
  def is_float(self) -> bool:
    return self.dtype in _FLOATS

  float_kinds = "F32, F16, BF16, F64"  # for error messages


def checkpoint_files(directory: pathlib.Path) -> list[pathlib.Path]:
  """The safetensors files of a directory: the single file or the shards
  its index names. Raises PretrainedError naming what is missing."""
  index = directory / INDEX
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise PretrainedError(index, f"expected JSON with a 'weight_map' of "
                            f"tensor -> file, got an unreadable index "
                            f"({e})") from e
    files = sorted({directory / f for f in weight_map.values()})
    for f in files:
      if not f.is_file():
        raise PretrainedError(index, f"names shard {f.name}, which is not "
                              f"in {directory}")
    return files
  if (directory / SINGLE).is_file():
    return [directory / SINGLE]
  found = sorted(p.name for p in directory.glob("*.safetensors"))
  raise PretrainedError(directory, f"expected {SINGLE} or {INDEX}, found "
                        f"{found or 'no safetensors file'}"
                        + ("; PyTorch .bin checkpoints are not read (convert"
                           " them to safetensors)" if any(
                               directory.glob("*.bin")) else ""))


def _header(path: pathlib.Path) -> dict:
  """The JSON header, checked by the safetensors package first (a
  truncated or corrupt file fails here, named)."""
  try:
    with safetensors.safe_open(path, framework="numpy"):
      pass
  except (safetensors.SafetensorError, OSError) as e:
    raise PretrainedError(path, f"expected a safetensors file, the package "
                          f"could not read it: {e}") from e
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  header.pop("__metadata__", None)
  return {"_data_start": 8 + n, **header}


def list_tensors(files) -> dict[str, TensorInfo]:
  """Every tensor of the checkpoint by name (a name in two files fails)."""
  out = {}
  for path in files:
    header = _header(path)
    base = header.pop("_data_start")
    for name, h in header.items():
      if name in out:
        raise PretrainedError(path, f"tensor {name!r} is also in "
                              f"{out[name].file.name}")
      start, end = h["data_offsets"]
      out[name] = TensorInfo(name, path, h["dtype"], tuple(h["shape"]),
                             (base + start, base + end))
  return out


def read_tensor(info: TensorInfo) -> np.ndarray:
  """One tensor as a NumPy array (bf16 as ml_dtypes.bfloat16)."""
  if info.dtype == "BF16":
    start, end = info.span
    raw = np.memmap(info.file, dtype=np.uint16, mode="r", offset=start,
                    shape=((end - start) // 2,))
    return np.array(raw).view(ml_dtypes.bfloat16).reshape(info.shape)
  with safetensors.safe_open(info.file, framework="numpy") as f:
    return f.get_tensor(info.name)


def write(tensors: dict[str, np.ndarray], path: pathlib.Path, *,
          metadata: dict[str, str] | None = None) -> None:
  """One safetensors file; bf16 arrays are written as their raw bits."""
  plain = {n: a for n, a in tensors.items() if a.dtype != ml_dtypes.bfloat16}
  bf16 = {n: a for n, a in tensors.items() if n not in plain}
  if not bf16:
    safetensors.numpy.save_file(plain, path, metadata=metadata)
    return
  # The package's NumPy writer has no bfloat16: write the format by hand
  # (8-byte header length, JSON header, then the data in header order).
  header, chunks, offset = {}, [], 0
  for name in sorted(tensors):
    a = np.ascontiguousarray(tensors[name])
    data = a.view(np.uint16).tobytes() if name in bf16 else a.tobytes()
    code = "BF16" if name in bf16 else _code(a.dtype)
    header[name] = {"dtype": code, "shape": list(a.shape),
                    "data_offsets": [offset, offset + len(data)]}
    chunks.append(data)
    offset += len(data)
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob)
    for c in chunks:
      f.write(c)


def _code(dtype) -> str:
  for code, np_dtype in _FLOATS.items():
    if np.dtype(np_dtype) == dtype:
      return code
  raise ValueError(f"safetensors_files.write: unsupported dtype {dtype}")
