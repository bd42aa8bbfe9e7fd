"""Real text as bytes: a corpus of files, split by file, read in windows.

Shape letters: B batch (windows), W window length in bytes (T + 1 for a
model of length T: inputs and targets are the window shifted by one).

A corpus is named by a string:
  * "stdlib": the Python standard library's own `.py` files, found through
    `sysconfig` (third-party packages installed below it, in site-packages
    or dist-packages, are left out, and so are the few test fixtures that
    are deliberately not UTF-8), so every machine that runs this code has
    tens of MB of code, comments and docstrings without downloading
    anything;
  * a directory: every file below it whose name matches `glob` (hidden
    folders and `__pycache__` skipped), in sorted order;
  * a file: cut into `pieces` contiguous parts of near-equal size, which
    play the role of files for the split.
Each file (or piece) is one document. The documents are shuffled by a
NumPy generator seeded with `split_seed` and the first
`ceil(held_out_fraction * N)` are held out, so held-out text never appears
in training, and the same seed gives the same split on every machine that
has the same files.

A window is `W` consecutive bytes inside one document, never across two
(the boundary between two unrelated files is no text). Windows are drawn
uniformly among all windows of a split; a document shorter than `W` bytes
has none. Bytes become token ids `byte + first_id`, so the ids below
`first_id` (PAD, BOS, SEP in `mha_jax.training.tasks`) stay reserved.

Nothing is read into memory at once: `load` lists the files and checks
that each decodes as UTF-8 by streaming it in chunks; windows are sliced
from a memory map of their document; the byte counts of the n-gram
baselines are accumulated chunk by chunk. A corpus larger than memory
works. A corpus that is missing, empty, too short for one window in each
split, or not UTF-8 fails in `load` with a ValueError naming it.
"""

from __future__ import annotations

import codecs
import dataclasses
import fnmatch
import functools
import math
import os
import pathlib
import sysconfig

import numpy as np

STDLIB = "stdlib"
NUM_BYTES = 256
_CHUNK = 1 << 20  # bytes per streamed read
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class Document:
  """`size` bytes of `path` from byte `start` on (a file or a piece)."""
  path: pathlib.Path
  start: int
  size: int

  @property
  def name(self) -> str:
    return (str(self.path) if self.start == 0 else
            f"{self.path}[{self.start}:{self.start + self.size}]")


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
  """The documents of one side of the split, and its windows of `W` bytes.

  `ends[i]`: the number of windows in documents 0..i (window k lies in the
  first document with `ends > k`). Documents without a window are kept
  (the n-gram counts read them) but hold no window.
  """
  name: str
  documents: tuple[Document, ...]
  window: int
  ends: np.ndarray  # [N] int64, cumulative window counts

  @property
  def num_windows(self) -> int:
    return int(self.ends[-1]) if len(self.ends) else 0

  @property
  def num_bytes(self) -> int:
    return sum(d.size for d in self.documents)

  def locate(self, index) -> tuple[np.ndarray, np.ndarray]:
    """`(document, byte offset in it)` of window numbers `index [B]`."""
    index = np.asarray(index, np.int64)
    if np.any(index < 0) or np.any(index >= self.num_windows):
      raise ValueError(f"window index outside [0, {self.num_windows}) of the "
                       f"{self.name} split")
    doc = np.searchsorted(self.ends, index, side="right")
    before = np.where(doc > 0, self.ends[np.maximum(doc - 1, 0)], 0)
    return doc, index - before

  def windows(self, index, *, first_id: int = 0) -> np.ndarray:
    """Token ids `[B, W]` (int32) of windows `index [B]`: bytes + first_id."""
    doc, offset = self.locate(index)
    out = np.empty((len(doc), self.window), np.int32)
    for row, (d, o) in enumerate(zip(doc, offset)):
      out[row] = _memmap(self.documents[d])[o:o + self.window]
    return out + first_id

  def windows_from_bits(self, bits, *, first_id: int = 0) -> np.ndarray:
    """`windows` of the window numbers that random `bits [B, 2]` (uint32)
    pick: the 64-bit number `hi * 2**32 + lo` modulo the window count, so
    a split of more than 2**31 windows is still covered (the modulo bias
    is below 2**-32 per window)."""
    bits = np.asarray(bits, np.uint64)
    number = (bits[:, 0] << np.uint64(32)) | bits[:, 1]
    return self.windows((number % np.uint64(self.num_windows)).astype(
        np.int64), first_id=first_id)


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """A corpus split by document into "train" and "held_out"."""
  name: str  # as given (the corpus argument)
  root: pathlib.Path
  train: Split
  held_out: Split

  def split(self, name: str) -> Split:
    if name not in ("train", "held_out"):
      raise ValueError(f"config.task.split: expected 'train' or 'held_out', "
                       f"got {name!r}")
    return self.train if name == "train" else self.held_out


def stdlib_root() -> pathlib.Path:
  """The standard library's folder of this Python (`sysconfig`)."""
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _files(root: pathlib.Path, glob: str, skip: frozenset) -> list:
  """Regular files below `root` whose name matches `glob`, sorted; hidden
  files and folders and the folders named in `skip` are not entered."""
  out = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip]
    out += [pathlib.Path(folder) / n for n in names
            if not n.startswith(".") and fnmatch.fnmatch(n, glob)]
  return sorted(p for p in out if p.is_file())


def is_utf8(doc: Document) -> tuple[bool, int]:
  """`(decodes, byte offset of the first bad byte)`, streamed in chunks."""
  decoder = codecs.getincrementaldecoder("utf-8")()
  with doc.path.open("rb") as f:
    f.seek(doc.start)
    done = 0
    while done < doc.size:
      chunk = f.read(min(_CHUNK, doc.size - done))
      if not chunk:
        break
      try:
        decoder.decode(chunk, final=done + len(chunk) >= doc.size)
      except UnicodeDecodeError as e:
        return False, doc.start + done + e.start
      done += len(chunk)
  return True, -1


def _documents(corpus: str, glob: str, pieces: int):
  """`(root, documents)` of the corpus named `corpus` (see module doc)."""
  if corpus == STDLIB:
    root = stdlib_root()
    docs = [Document(p, 0, p.stat().st_size)
            for p in _files(root, "*.py", _STDLIB_SKIP)]
    # The standard library's tests hold a few files in other encodings on
    # purpose (test_source_encoding and friends): they are not UTF-8 text.
    return root, [d for d in docs if d.size and is_utf8(d)[0]]
  path = pathlib.Path(corpus).expanduser()
  if not path.exists():
    raise ValueError(f"config.task.corpus: {corpus!r} does not exist (give "
                     f"'{STDLIB}', a text file or a directory of text files)")
  if path.is_file():
    whole = [Document(path, 0, path.stat().st_size)]
    root = path.parent
  else:
    whole = [Document(p, 0, p.stat().st_size)
             for p in _files(path, glob, frozenset({"__pycache__"}))]
    root = path
  whole = [d for d in whole if d.size]
  if not whole:
    what = "is empty" if path.is_file() else (
        f"holds no non-empty file matching {glob!r} (config.task.corpus_glob)")
    raise ValueError(f"config.task.corpus: {corpus!r} {what}")
  for d in whole:
    ok, at = is_utf8(d)
    if not ok:
      raise ValueError(f"config.task.corpus: {corpus!r}: {d.path} is not "
                       f"UTF-8 text (undecodable byte at offset {at}); give "
                       "text files only (config.task.corpus_glob selects "
                       "them)")
  return root, _cut(whole[0], pieces) if path.is_file() else whole


def _cut(doc: Document, pieces: int) -> list:
  """`doc` in `pieces` contiguous parts of near-equal size, each cut moved
  to just after the next newline (within 4 KiB) so that no line, and no
  multi-byte character of a line, is split between the two sides."""
  data = _memmap(doc)
  cuts = [0]
  for i in range(1, pieces):
    at = doc.size * i // pieces
    newline = np.flatnonzero(np.asarray(data[at:at + 4096]) == 10)
    cuts.append(at + int(newline[0]) + 1 if newline.size else at)
  cuts.append(doc.size)
  cuts = sorted(set(cuts))
  return [Document(doc.path, doc.start + a, b - a)
          for a, b in zip(cuts, cuts[1:]) if b > a]


def split_of(name: str, docs, window: int) -> Split:
  """The `Split` called `name` of documents `docs`, windows of `window`."""
  counts = np.asarray([max(0, d.size - window + 1) for d in docs], np.int64)
  return Split(name, tuple(docs), window, np.cumsum(counts))


@functools.lru_cache(maxsize=16)
def load(corpus: str = STDLIB, *, window: int, split_seed: int = 0,
         held_out_fraction: float = 0.1, glob: str = "*.py",
         pieces: int = 20) -> Corpus:
  """The corpus `corpus`, split by document, with windows of `window` bytes.

  Cached per arguments: every batch of a run reuses one listing. Raises
  ValueError naming the corpus when it is missing, empty, not UTF-8, has
  fewer than two documents, or a split has no window of `window` bytes.
  """
  if not 0.0 < held_out_fraction < 1.0:
    raise ValueError(f"config.task.held_out_fraction: must be in (0, 1), got "
                     f"{held_out_fraction}")
  if pieces < 2:
    raise ValueError(f"config.task.pieces: a single-file corpus is cut into "
                     f"`pieces` >= 2 documents, got {pieces}")
  root, docs = _documents(corpus, glob, pieces)
  if len(docs) < 2:
    raise ValueError(f"config.task.corpus: {corpus!r} has {len(docs)} "
                     "non-empty document; the held-out split is by file and "
                     "needs at least 2")
  order = np.random.default_rng(split_seed).permutation(len(docs))
  n_held = min(len(docs) - 1, max(1, math.ceil(held_out_fraction * len(docs))))
  held = sorted(order[:n_held])
  train = sorted(order[n_held:])
  out = Corpus(corpus, root,
               split_of("train", [docs[i] for i in train], window),
               split_of("held_out", [docs[i] for i in held], window))
  for s in (out.train, out.held_out):
    if s.num_windows == 0:
      raise ValueError(
          f"config.task.corpus: the {s.name} split of {corpus!r} "
          f"({len(s.documents)} documents, {s.num_bytes} bytes) has no "
          f"document of at least {window} bytes (task.seq_len + 1)")
  return out


@functools.lru_cache(maxsize=256)
def _memmap(doc: Document) -> np.ndarray:
  """The document's bytes, memory-mapped (read only when sliced)."""
  return np.memmap(doc.path, dtype=np.uint8, mode="r", offset=doc.start,
                   shape=(doc.size,))


def read_text(doc: Document) -> str:
  """The whole text of a document (`load` has checked it is UTF-8)."""
  return bytes(_memmap(doc)).decode("utf-8")


def chunks(split: Split):
  """Every document's bytes in order, as `(document index, uint8 chunk)`."""
  for i, doc in enumerate(split.documents):
    data = _memmap(doc)
    for a in range(0, doc.size, _CHUNK):
      yield i, np.asarray(data[a:a + _CHUNK])


def byte_counts(split: Split) -> tuple[np.ndarray, np.ndarray]:
  """`(unigram [256], bigram [256, 256])` counts over the split's bytes.

  `bigram[a, b]` counts byte b right after byte a within one document
  (pairs across a document boundary do not exist in any window).
  Streamed: memory stays at one chunk.
  """
  uni = np.zeros(NUM_BYTES, np.int64)
  bi = np.zeros(NUM_BYTES * NUM_BYTES, np.int64)
  last_doc, last_byte = -1, None
  for i, chunk in chunks(split):
    uni += np.bincount(chunk, minlength=NUM_BYTES)
    seq = chunk.astype(np.int64)
    if i == last_doc and last_byte is not None:
      seq = np.concatenate([[last_byte], seq])
    bi += np.bincount(seq[:-1] * NUM_BYTES + seq[1:],
                      minlength=NUM_BYTES * NUM_BYTES)
    last_doc, last_byte = i, int(chunk[-1])
  return uni, bi.reshape(NUM_BYTES, NUM_BYTES)


def text_of(ids, *, first_id: int = 0) -> str:
  """The text of token ids `[T]` (bytes + first_id), undecodable bytes
  replaced (a window may cut a multi-byte character)."""
  data = bytes(int(i) - first_id for i in np.asarray(ids).ravel()
               if int(i) >= first_id)
  return data.decode("utf-8", errors="replace")


def byte_label(token: int, *, first_id: int = 0) -> str:
  """A readable one-cell label of a byte id: the character, or a symbol
  for whitespace and control bytes (newline, space, tab), or its hex."""
  b = int(token) - first_id
  if b < 0:
    return f"<{int(token)}>"
  named = {10: "\u23ce", 32: "\u2423", 9: "\u21e5", 13: "\u240d"}
  if b in named:
    return named[b]
  if 33 <= b < 127:
    return chr(b)
  return f"x{b:02x}"
