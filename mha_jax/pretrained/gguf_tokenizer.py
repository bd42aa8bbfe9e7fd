"""The tokenizer a GGUF file describes, as a `tokenizers.Tokenizer`.

A GGUF file has no tokenizer.json: llama.cpp stores the vocabulary as
metadata under `tokenizer.ggml.*` (`model`, `pre`, `tokens`,
`token_type`, `scores`, `merges`, the special ids and the `add_*` flags).
This module rebuilds the pipeline those keys stand for, so ids agree with
transformers' GGUF tokenizer (`AutoTokenizer.from_pretrained(dir,
gguf_file=name)`) on the installed SmolLM2 and Gemma 3 files:

- `model` "gpt2": byte-level BPE with the file's merges. `pre` names how
  text is cut before the byte mapping (`BYTE_LEVEL_SPLITS`); "smollm"
  cuts every digit apart and then applies GPT-2's pattern, as llama.cpp
  and SmolLM2's own tokenizer.json do. (transformers skips the digit cut
  for "smollm"; SmolLM2's vocabulary has no token holding a digit beside
  anything else, so its ids come out the same either way.)
- `model` "llama": SentencePiece-style BPE with byte fallback (`<0xNN>`),
  spaces written "▁", a leading "▁" only if `add_space_prefix` (default
  true, as in llama.cpp; Gemma 3 says false). The file has scores but no
  merges; the merges are rebuilt from the vocabulary, ranked by the
  merged token's place in the file. SentencePiece writes its pieces
  best-first, so that place is the score order for ordinary pieces, and
  it also ranks Gemma's user-defined runs of spaces and newlines (which
  carry a placeholder score of -1000) where transformers ranks them.

Control tokens (type 3) become special tokens and user-defined ones
(type 4) plain added tokens, so "<|im_start|>" or "<start_of_turn>" is
one id, never cut into pieces. The post-processor adds BOS and EOS as
`add_bos_token` / `add_eos_token` say; `padding_token_id` is the padding.

What a user must add themselves:
- SmolLM2 (`add_bos_token` false): no BOS is added, and nothing marks
  document ends; its document separator is <|endoftext|>, id 0 (id 1 is
  <|im_start|>, id 2 <|im_end|>, its EOS and padding).
- Gemma 3 adds BOS (<bos>, id 2) to every text and never EOS (<eos>,
  id 1); the chat turns (<start_of_turn>, <end_of_turn>) are up to the
  caller.

`tokenizer_from_gguf(path)` reads a file; a loader that already holds a
`gguf.GGUFReader` passes `tokenizer_fields(reader)` to
`tokenizer_from_fields(fields, where)`, a pure function of the values.
"""

from __future__ import annotations

import pathlib

import gguf
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from mha_jax.pretrained import gguf_files
from mha_jax.pretrained.errors import PretrainedError

PREFIX = "tokenizer.ggml."
# `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's "▁", a space inside a piece

# Llama 3's split: letters with one leading non-letter, numbers in runs of
# at most three, punctuation with its trailing newlines, whitespace.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
           r"|\s+")
# Qwen2's: Llama 3's with every digit on its own.
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def _gpt2_split():
  """GPT-2's own pattern, the one `ByteLevel(use_regex=True)` applies."""
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2():
  # Digits first: "2024" is four pieces, so no merge spans two digits.
  return pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True), _gpt2_split()])


def _regex_split(pattern):
  def split():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  return split


# `tokenizer.ggml.pre` of a byte-level vocabulary -> (the pre-tokenizer,
# ignore_merges: a word that is itself a token is taken whole, as Llama 3's
# tokenizer.json and llama.cpp do for it).
BYTE_LEVEL_SPLITS = {
    "gpt-2": (_gpt2_split, False),
    "smollm": (_digits_then_gpt2, False),
    "starcoder": (_digits_then_gpt2, False),
    "llama-bpe": (_regex_split(_LLAMA3), True),
    "qwen2": (_regex_split(_QWEN2), False),
}
# A SentencePiece vocabulary splits only at its own spaces.
SENTENCEPIECE_SPLITS = ("default",)
MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece-style BPE"}


def tokenizer_fields(reader: gguf.GGUFReader) -> dict:
  """The `tokenizer.*` keys of an open reader as Python values."""
  return {key: field.contents() for key, field in reader.fields.items()
          if key.startswith("tokenizer.")}


def tokenizer_from_gguf(path) -> tokenizers.Tokenizer:
  """The tokenizer stored in the GGUF file at `path`."""
  path = pathlib.Path(path)
  reader = gguf_files.open_reader(path)  # the loader's checks and errors
  return tokenizer_from_fields(tokenizer_fields(reader), path)


def _get(fields, name, default=None):
  return fields.get(PREFIX + name, default)


def _choice(where, key, got, supported, what=""):
  if got not in supported:
    raise PretrainedError(where, f"{PREFIX}{key}: expected one of "
                          f"{', '.join(map(repr, supported))}{what}, got "
                          f"{got!r}")


def _check_lists(fields, where, n):
  """Per-token arrays must have one entry per token: a short one would
  silently shift every later token's type or score."""
  for name in ("token_type", "scores"):
    values = _get(fields, name)
    if values is not None and len(values) != n:
      raise PretrainedError(where, f"{PREFIX}{name}: expected {n} entries, "
                            f"one per token, got {len(values)}")
  for name in ("bos_token_id", "eos_token_id", "unknown_token_id",
               "padding_token_id"):
    i = _get(fields, name)
    if i is not None and not 0 <= i < n:
      raise PretrainedError(where, f"{PREFIX}{name}: expected an id in "
                            f"[0, {n}), got {i}")


def tokenizer_from_fields(fields: dict, where) -> tokenizers.Tokenizer:
  """The tokenizer that the `tokenizer.ggml.*` values in `fields` (key ->
  Python value, as `tokenizer_fields` gives) describe; `where` names the
  file in errors."""
  tokens = _get(fields, "tokens")
  if not tokens:
    raise PretrainedError(where, f"expected {PREFIX}tokens, found none (a "
                          "GGUF file saved without its tokenizer)")
  if not isinstance(tokens, (list, tuple)):  # e.g. a placeholder, unread
    raise PretrainedError(where, f"{PREFIX}tokens: expected a list of "
                          f"strings (`tokenizer_fields` reads them), got "
                          f"{type(tokens).__name__}")
  tokens = list(tokens)
  model = _get(fields, "model")
  _choice(where, "model", model, tuple(MODELS),
          " (" + ", ".join(f"{k}: {v}" for k, v in MODELS.items()) + ")")
  pre = _get(fields, "pre", "default")
  _check_lists(fields, where, len(tokens))
  types = list(_get(fields, "token_type") or [NORMAL] * len(tokens))
  if model == "gpt2":
    _choice(where, "pre", pre, tuple(BYTE_LEVEL_SPLITS),
            " for a byte-level vocabulary")
    tok = _byte_level(fields, where, tokens, pre)
  else:
    _choice(where, "pre", pre, SENTENCEPIECE_SPLITS,
            " for a SentencePiece vocabulary")
    tok = _sentencepiece(fields, tokens, types)
  return _finish(tok, fields, tokens, types, model)


def _byte_level(fields, where, tokens, pre):
  merges = _get(fields, "merges")
  if not merges:
    raise PretrainedError(where, f"expected {PREFIX}merges for a byte-level "
                          "vocabulary, found none")
  split, ignore_merges = BYTE_LEVEL_SPLITS[pre]
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = tokenizers.Tokenizer(models.BPE(
      vocab, [tuple(m.split(" ", 1)) for m in merges],
      ignore_merges=ignore_merges))
  tok.pre_tokenizer = split()
  tok.decoder = decoders.ByteLevel()
  return tok


def _respelled(tokens, types):
  """Tokens with their spaces written "▁". Gemma's files store runs of
  spaces as real spaces, but the text reaches the BPE with every space
  already "▁", so only that spelling can ever match (unless it is taken)."""
  taken = set(tokens)
  out = []
  for t, kind in zip(tokens, types):
    s = t.replace(" ", SPACE)
    out.append(s if kind != CONTROL and s not in taken else t)
  return out


def sentencepiece_merges(tokens, types) -> list[tuple[str, str]]:
  """Every (left, right) pair of tokens that joins into a token, ranked by
  the joined token's place in the file, then by the longer left piece.

  BPE over these ranks joins, at each step, the adjacent pair whose result
  comes first in the file: SentencePiece's rule, since its pieces are
  written best-first. Byte and control tokens are never results (byte
  fallback and special-token matching produce them, not merges).
  """
  ids = {t: i for i, t in enumerate(tokens)}
  merges = []
  for t, kind in zip(tokens, types):
    if kind in (BYTE, CONTROL, UNUSED, UNKNOWN):
      continue
    for k in range(len(t) - 1, 0, -1):
      if t[:k] in ids and t[k:] in ids:
        merges.append((t[:k], t[k:]))
  return merges


def _sentencepiece(fields, tokens, types):
  spelled = _respelled(tokens, types)
  unk = _get(fields, "unknown_token_id")
  if unk is None and UNKNOWN in types:
    unk = types.index(UNKNOWN)
  prefix = bool(_get(fields, "add_space_prefix", True))
  tok = tokenizers.Tokenizer(models.BPE(
      {t: i for i, t in enumerate(spelled)},
      sentencepiece_merges(spelled, types),
      unk_token=None if unk is None else spelled[unk], fuse_unk=True,
      byte_fallback=True))
  # split=False: the whole text is one word, so a merge may span "▁".
  tok.pre_tokenizer = pre_tokenizers.Metaspace(
      replacement=SPACE, prepend_scheme="first" if prefix else "never",
      split=False)
  steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(),
           decoders.Fuse()]
  if prefix:  # the space the pre-tokenizer added
    steps.append(decoders.Strip(" ", 1, 0))
  tok.decoder = decoders.Sequence(steps)
  return tok


def _finish(tok, fields, tokens, types, model):
  """Added tokens, BOS/EOS and padding: the same for both kinds."""
  vocab = tok.get_vocab()
  tok.add_special_tokens([
      tokenizers.AddedToken(t, special=True, normalized=False)
      for t, kind in zip(tokens, types) if kind == CONTROL])
  # A user-defined token matches whole, as llama.cpp matches it; one the
  # vocabulary respelled ("  " -> "▁▁") is left to the BPE.
  user = [tokenizers.AddedToken(t, normalized=False)
          for i, (t, kind) in enumerate(zip(tokens, types))
          if kind == USER_DEFINED and vocab.get(t) == i]
  if user:
    tok.add_tokens(user)
  # Without the flag llama.cpp adds BOS to a SentencePiece vocabulary only.
  bos = _get(fields, "add_bos_token", model == "llama")
  eos = _get(fields, "add_eos_token", False)
  template, specials = _template(fields, tokens, bos, eos)
  tok.post_processor = processors.TemplateProcessing(
      single=template("A", 0), pair=template("A", 0) + template("B", 1),
      special_tokens=specials)
  pad = _get(fields, "padding_token_id")
  if pad is not None:
    tok.enable_padding(pad_id=pad, pad_token=tokens[pad])
  return tok


def _template(fields, tokens, bos, eos):
  ends = []
  for add, key in ((bos, "bos_token_id"), (eos, "eos_token_id")):
    i = _get(fields, key)
    ends.append((tokens[i], i) if add and i is not None else None)
  first, last = ends

  def template(seq, type_id):
    return [f"{e[0]}:{type_id}" for e in (first,) if e] + [
        f"${seq}:{type_id}"] + [f"{e[0]}:{type_id}" for e in (last,) if e]

  return template, [e for e in ends if e]
