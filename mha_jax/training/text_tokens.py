"""Real text as subword tokens: a byte-level BPE trained on the training files.

Shape letters: B batch (windows), W window length in tokens (T + 1 for a
model of length T), V vocabulary.

`load(corpus, vocab_size=V, window=W, cache_dir=...)` takes a split byte
corpus (`text_corpus.Corpus`: the same files, the same split by file as the
byte task) and returns its `TokenCorpus`:
  * the tokenizer: byte-level BPE (`tokenizers`), trained on the TRAINING
    split's files only, with the project's reserved ids kept: PAD, BOS, SEP
    (`tasks.PAD/BOS/SEP`) are ids 0, 1, 2 and never occur in text, the 256
    bytes come next, then the learnt merges up to V ids. Byte-level means
    every UTF-8 text has an encoding and decodes back to itself exactly;
  * every file of both splits encoded once, one token array per split
    (uint16, memory-mapped), and windows of W tokens inside one file,
    drawn as the byte task draws them (`text_corpus.Split`);
  * `token_bytes [V]`: how many bytes of text each id stands for, which
    turns bits per token into bits per byte: the sum of a window's bits
    over the sum of its targets' bytes.

Cached on disk: training a 4k vocabulary on the 28 MB of the standard
library takes about 10 s and encoding both splits 2 s, so it happens once
per corpus and settings. The folder `cache_dir/bpe-<key>` is keyed by a
hash of the settings (V, the tokenizer's pre-tokenisation, the `tokenizers`
version) and of every file's bytes and role (train or held out), so a
changed file, split or setting trains afresh and nothing stale is read. It
is written to a temporary folder and renamed into place, so an interrupted
run leaves no half-written cache.

Determinism: the BPE trainer counts pairs in parallel but picks each merge
by count with ties broken by the pair itself, so the same corpus and
settings give the same merges (tests/training/test_text_tokens.py trains
twice and compares). Bad settings fail by name: V too small for the
reserved ids and the byte alphabet, V beyond uint16, or a split with no
file of W tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shutil
import tempfile

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from mha_jax.training import text_corpus

SPECIALS = ("<pad>", "<bos>", "<sep>")  # ids 0, 1, 2: tasks.PAD, BOS, SEP
MIN_VOCAB = len(SPECIALS) + text_corpus.NUM_BYTES  # no merge at all
MAX_VOCAB = 1 << 16  # ids are stored as uint16
CACHE_VERSION = 1  # bump when the cached files change meaning
TOKENIZER_FILE = "tokenizer.json"


def default_cache_dir() -> pathlib.Path:
  """`$XDG_CACHE_HOME/mha_jax` (or `~/.cache/mha_jax`): where an empty
  `task.cache_dir` keeps tokenizers."""
  base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(base) / "mha_jax"


@dataclasses.dataclass(frozen=True, eq=False)
class TokenSplit(text_corpus.Split):
  """The token ids of one split's documents, and its windows of W tokens.

  `starts [N + 1]`: document i holds `tokens[starts[i]:starts[i + 1]]`;
  `ends` (the windows' cumulative counts) and `documents` (the files, as
  in the byte split) are those of `text_corpus.Split`.
  """
  tokens: np.ndarray = None  # [total tokens] uint16
  starts: np.ndarray = None  # [N + 1] int64

  @property
  def num_tokens(self) -> int:
    return int(self.starts[-1])

  def document_tokens(self, i: int) -> np.ndarray:
    """The token ids of document `i`, int32."""
    return np.asarray(self.tokens[self.starts[i]:self.starts[i + 1]],
                      np.int32)

  def windows(self, index, *, first_id: int = 0) -> np.ndarray:
    """Token ids `[B, W]` (int32) of windows `index [B]` (`first_id` is
    the byte split's argument; token ids already leave 0-2 free)."""
    del first_id
    doc, offset = self.locate(index)
    out = np.empty((len(doc), self.window), np.int32)
    for row, (d, o) in enumerate(zip(doc, offset)):
      a = self.starts[d] + o
      out[row] = self.tokens[a:a + self.window]
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class TokenCorpus:
  """A byte corpus, its tokenizer and both splits in tokens."""
  bytes: text_corpus.Corpus
  tokenizer: tokenizers.Tokenizer
  token_bytes: np.ndarray  # [V] int64, bytes of text per id (0 for PAD..SEP)
  train: TokenSplit
  held_out: TokenSplit
  folder: pathlib.Path  # the cache folder it was read from

  @property
  def vocab_size(self) -> int:
    """The BPE's ids: the V asked for, or fewer when a small corpus runs
    out of pairs to merge (a model of V ids then leaves the rest unused)."""
    return len(self.token_bytes)

  def split(self, name: str) -> TokenSplit:
    self.bytes.split(name)  # the byte corpus's check of the name
    return self.train if name == "train" else self.held_out

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self.tokenizer.encode(text).ids, np.int32)

  def decode(self, ids) -> str:
    """The text of ids `[T]` (a cut multi-byte character is replaced)."""
    return self.tokenizer.decode([int(i) for i in np.ravel(ids)],
                                 skip_special_tokens=True)


def _new_tokenizer() -> tokenizers.Tokenizer:
  """Byte-level BPE without merges: GPT-2's pre-tokenisation (split
  before words, numbers, punctuation runs and whitespace), no prefix
  space added, so decoding gives back the text exactly."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                               use_regex=True)
  tok.decoder = decoders.ByteLevel()
  return _as_text(tok)


def _as_text(tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """`tok`, reading the specials' strings in text as text: a file that
  holds "<sep>" (the standard library's email parser does) gets the ids
  of its bytes, so ids 0-2 never come from text."""
  tok.encode_special_tokens = True
  return tok


@functools.lru_cache(maxsize=1)
def _byte_level_map() -> dict:
  """ByteLevel's character -> the byte it stands for: GPT-2's table maps
  the 188 printable latin-1 bytes to themselves and the other 68 to
  U+0100 onwards, in byte order."""
  keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(
      range(0xAE, 0x100))
  out, n = {}, 0
  for b in range(256):
    if b in keep:
      out[chr(b)] = b
    else:
      out[chr(256 + n)] = b
      n += 1
  return out


def _id_bytes(tok: tokenizers.Tokenizer, i: int) -> bytes:
  """The bytes of text that id `i` stands for."""
  table = _byte_level_map()
  return bytes(table[c] for c in tok.id_to_token(i))


def cache_key(corpus: text_corpus.Corpus, vocab_size: int) -> str:
  """Hex digest of the settings and of every document's bytes and side."""
  h = hashlib.sha256()
  h.update(json.dumps({"version": CACHE_VERSION, "vocab_size": vocab_size,
                       "specials": SPECIALS, "tokenizer": _new_tokenizer()
                       .to_str(), "tokenizers": tokenizers.__version__},
                      sort_keys=True).encode())
  for split in (corpus.train, corpus.held_out):
    h.update(f"\n{split.name} {len(split.documents)}\n".encode())
    for _, chunk in text_corpus.chunks(split):
      h.update(chunk.tobytes())
    h.update(json.dumps([d.size for d in split.documents]).encode())
  return h.hexdigest()


def check_vocab(vocab_size: int) -> None:
  if not isinstance(vocab_size, int) or not (
      MIN_VOCAB < vocab_size <= MAX_VOCAB):
    raise ValueError(
        f"config.task.vocab_size: a byte-level BPE needs more than "
        f"{MIN_VOCAB} ids ({len(SPECIALS)} reserved: PAD, BOS, SEP, and "
        f"{text_corpus.NUM_BYTES} bytes) and at most {MAX_VOCAB} (uint16 "
        f"ids), got {vocab_size!r}")


def train_tokenizer(corpus: text_corpus.Corpus,
                    vocab_size: int) -> tokenizers.Tokenizer:
  """A byte-level BPE of `vocab_size` ids trained on `corpus.train` only."""
  check_vocab(vocab_size)
  tok = _new_tokenizer()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIALS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False)
  tok.train_from_iterator((text_corpus.read_text(d)
                           for d in corpus.train.documents),
                          trainer=trainer)
  return tok


def _encode(tok, split) -> tuple[np.ndarray, np.ndarray]:
  """`(tokens uint16, starts [N + 1])` of every document of `split`."""
  ids = [e.ids for e in tok.encode_batch(
      [text_corpus.read_text(d) for d in split.documents],
      add_special_tokens=False)]
  starts = np.concatenate([[0], np.cumsum([len(i) for i in ids])])
  tokens = (np.concatenate([np.asarray(i, np.uint16) for i in ids])
            if starts[-1] else np.zeros(0, np.uint16))
  return tokens, starts.astype(np.int64)


def _build(corpus, vocab_size, folder: pathlib.Path) -> None:
  """Trains, encodes and writes the cache folder atomically."""
  tok = train_tokenizer(corpus, vocab_size)
  folder.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=folder.name + ".",
                                      dir=folder.parent))
  try:
    tok.save(str(tmp / TOKENIZER_FILE))
    info = {"vocab_size": tok.get_vocab_size(), "corpus": corpus.name,
            "tokenizers": tokenizers.__version__}
    for split in (corpus.train, corpus.held_out):
      tokens, starts = _encode(tok, split)
      np.save(tmp / f"{split.name}_tokens.npy", tokens)
      np.save(tmp / f"{split.name}_starts.npy", starts)
      info[split.name] = {"files": len(split.documents),
                          "bytes": split.num_bytes,
                          "tokens": int(starts[-1])}
    (tmp / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    try:
      tmp.rename(folder)
    except OSError:  # another process finished first: keep its copy
      if not (folder / "info.json").exists():
        raise
  finally:
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)


def _split(folder, byte_split, window) -> TokenSplit:
  starts = np.load(folder / f"{byte_split.name}_starts.npy")
  tokens = np.load(folder / f"{byte_split.name}_tokens.npy", mmap_mode="r")
  counts = np.maximum(0, np.diff(starts) - window + 1)
  return TokenSplit(byte_split.name, byte_split.documents, window,
                    np.cumsum(counts), tokens=tokens, starts=starts)


@functools.lru_cache(maxsize=8)
def load(corpus: text_corpus.Corpus, *, vocab_size: int, window: int,
         cache_dir="") -> TokenCorpus:
  """The corpus `corpus` in the tokens of its BPE (trained and cached on
  first use; see the module doc). `window`: W tokens per window."""
  check_vocab(vocab_size)
  root = pathlib.Path(cache_dir).expanduser() if cache_dir else (
      default_cache_dir())
  folder = root / f"bpe-{cache_key(corpus, vocab_size)[:20]}"
  if not (folder / "info.json").exists():
    _build(corpus, vocab_size, folder)
  tok = _as_text(tokenizers.Tokenizer.from_file(str(folder /
                                                    TOKENIZER_FILE)))
  token_bytes = np.asarray([0] * len(SPECIALS) + [
      len(_id_bytes(tok, i)) for i in range(len(SPECIALS),
                                            tok.get_vocab_size())], np.int64)
  out = TokenCorpus(corpus, tok, token_bytes,
                    _split(folder, corpus.train, window),
                    _split(folder, corpus.held_out, window), folder)
  for s in (out.train, out.held_out):
    if s.num_windows == 0:
      raise ValueError(
          f"config.task.seq_len: the {s.name} split of {corpus.name!r} "
          f"({len(s.documents)} files, {s.num_tokens} tokens) has no file "
          f"of at least {window} tokens (task.seq_len + 1)")
  return out


def counts(split: TokenSplit, vocab_size: int):
  """`(unigram [V], bigram_keys [P], bigram_counts [P], previous [V])`.

  Bigrams within one document only, kept sparse: `bigram_keys` are the
  sorted codes `a * V + b` of the pairs that occur and `previous[a]` the
  number of pairs that start with a.
  """
  uni = np.bincount(np.asarray(split.tokens, np.int64),
                    minlength=vocab_size)
  codes = []
  for i in range(len(split.documents)):
    t = split.document_tokens(i).astype(np.int64)
    codes.append(t[:-1] * vocab_size + t[1:])
  codes = np.concatenate(codes) if codes else np.zeros(0, np.int64)
  keys, n = np.unique(codes, return_counts=True)
  previous = np.bincount(keys // vocab_size, weights=n,
                         minlength=vocab_size)
  return uni, keys, n, previous
