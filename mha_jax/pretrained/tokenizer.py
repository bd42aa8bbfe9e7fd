"""Text <-> token ids for a loaded model, with the `tokenizers` package.

A checkpoint directory's tokenizer.json is read as is (normaliser,
pre-tokeniser, model and post-processor: BERT's [CLS] ... [SEP] come
from it). `labels` gives the readable token strings the explorer and
plots show.
"""

from __future__ import annotations

import pathlib

import numpy as np
import tokenizers

from mha_jax.pretrained.errors import PretrainedError

FILE = "tokenizer.json"


def load_tokenizer(path) -> tokenizers.Tokenizer:
  """The tokenizer of a checkpoint directory (or a tokenizer.json path)."""
  path = pathlib.Path(path)
  file = path / FILE if path.is_dir() else path
  if not file.is_file():
    raise PretrainedError(path, f"expected {FILE}, found none (a checkpoint "
                          "saved with its tokenizer has one)")
  try:
    return tokenizers.Tokenizer.from_file(str(file))
  except Exception as e:  # the package raises a bare Exception
    raise PretrainedError(file, f"expected a tokenizers JSON file, got an "
                          f"unreadable one: {e}") from e


def encode(tokenizer: tokenizers.Tokenizer, texts, *, max_len=None):
  """`texts` (a str or a list) -> `(ids [B, T] int32, mask [B, T] bool)`,
  right-padded with the tokenizer's pad id (0 without one); `max_len`
  truncates each text (special tokens kept)."""
  texts = [texts] if isinstance(texts, str) else list(texts)
  pad = tokenizer.padding["pad_id"] if tokenizer.padding else 0
  # A copy without the file's own padding (MiniLM's pads every text to
  # 128): this pads to the batch's longest text only.
  tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())
  tokenizer.no_padding()
  if max_len is not None:  # the tokenizer's own: keeps [SEP] and the like
    tokenizer.enable_truncation(max_length=max_len)
  encs = [e.ids for e in tokenizer.encode_batch(texts)]
  t = max(len(e) for e in encs)
  ids = np.full((len(encs), t), pad, np.int32)
  mask = np.zeros((len(encs), t), bool)
  for i, e in enumerate(encs):
    ids[i, :len(e)], mask[i, :len(e)] = e, True
  return ids, mask


def labels(tokenizer: tokenizers.Tokenizer, ids) -> list[str]:
  """The token strings of one sequence `ids [T]` ("Ġthe", "##ing", ...)."""
  return [tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]
