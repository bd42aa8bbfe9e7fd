"""Text <-> token ids for a loaded model, with the `tokenizers` package.

A checkpoint directory's tokenizer.json is read as is (normaliser,
pre-tokeniser, model and post-processor: BERT's [CLS] ... [SEP] come
from it). A GGUF file carries no tokenizer.json: its `tokenizer.ggml.*`
metadata is rebuilt into the same kind of object (`gguf_tokenizer`,
which says what BOS and separators each model leaves to the user).
`labels` gives the readable token strings the explorer and plots show.
"""

from __future__ import annotations

import pathlib

import numpy as np
import tokenizers

from mha_jax.pretrained.errors import PretrainedError
from mha_jax.pretrained.gguf_tokenizer import tokenizer_from_gguf

FILE = "tokenizer.json"


def load_tokenizer(path) -> tokenizers.Tokenizer:
  """The tokenizer of a checkpoint directory, a tokenizer.json path or a
  GGUF file (`*.gguf`, rebuilt from its metadata by `tokenizer_from_gguf`;
  the suffix decides, as llama.cpp's files always carry it)."""
  path = pathlib.Path(path)
  if path.suffix.lower() == ".gguf":
    return tokenizer_from_gguf(path)
  file = path / FILE if path.is_dir() else path
  if not file.is_file():
    raise PretrainedError(path, f"expected {FILE}, found none (a checkpoint "
                          "saved with its tokenizer has one)")
  try:
    return tokenizers.Tokenizer.from_file(str(file))
  except Exception as e:  # the package raises a bare Exception
    raise PretrainedError(file, f"expected a tokenizers JSON file, got an "
                          f"unreadable one: {e}") from e


def encodings(tokenizer, inputs, max_len=None, *, truncate: bool = True,
              add_special_tokens: bool = True):
  """The tokenizer's encodings of `inputs` (texts or (a, b) pairs), without
  the file's own padding (MiniLM's pads every text to 128): the callers pad
  to the batch's longest only. `max_len` truncates each (the tokenizer's
  own truncation: keeps [SEP] and the like); `truncate=False` turns the
  file's truncation off too. The caller's tokenizer is left as it was:
  its padding and truncation are set for the call and restored (a copy
  through `to_str` took seconds for Gemma's 262k-token vocabulary)."""
  padding, truncation = tokenizer.padding, tokenizer.truncation
  try:
    tokenizer.no_padding()
    if not truncate:
      tokenizer.no_truncation()
    elif max_len is not None:
      tokenizer.enable_truncation(max_length=max_len)
    return tokenizer.encode_batch(inputs,
                                  add_special_tokens=add_special_tokens)
  finally:
    if padding is not None:
      tokenizer.enable_padding(**padding)
    if truncation is None:
      tokenizer.no_truncation()
    else:
      tokenizer.enable_truncation(**truncation)


def _padded(tokenizer, rows):
  """`rows` (lists of ints) right-padded with the pad id (0 without one):
  `(ids [B, T] int32, mask [B, T] bool)`."""
  pad = tokenizer.padding["pad_id"] if tokenizer.padding else 0
  t = max(len(r) for r in rows)
  out = np.full((len(rows), t), pad, np.int32)
  mask = np.zeros((len(rows), t), bool)
  for i, r in enumerate(rows):
    out[i, :len(r)], mask[i, :len(r)] = r, True
  return out, mask


def encode(tokenizer: tokenizers.Tokenizer, texts, *, max_len=None):
  """`texts` (a str or a list) -> `(ids [B, T] int32, mask [B, T] bool)`,
  right-padded with the tokenizer's pad id (0 without one); `max_len`
  truncates each text (special tokens kept)."""
  texts = [texts] if isinstance(texts, str) else list(texts)
  return _padded(tokenizer, [e.ids for e in encodings(tokenizer, texts,
                                                          max_len)])


def encode_pairs(tokenizer: tokenizers.Tokenizer, pairs, *, max_len=None):
  """Sentence pairs `[(a, b), ...]` in the tokenizer's pair template (BERT:
  `[CLS] a [SEP] b [SEP]`) -> `(ids, mask, token_types)`, each `[B, T]`;
  token type 1 marks b and its [SEP], as in BERT's pre-training."""
  encs = encodings(tokenizer, [tuple(p) for p in pairs], max_len)
  ids, mask = _padded(tokenizer, [e.ids for e in encs])
  types, _ = _padded(tokenizer, [e.type_ids for e in encs])
  return ids, mask, np.where(mask, types, 0).astype(np.int32)


def labels(tokenizer: tokenizers.Tokenizer, ids) -> list[str]:
  """The token strings of one sequence `ids [T]` ("Ġthe", "##ing", ...)."""
  return [tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]
