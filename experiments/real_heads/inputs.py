"""The inputs: random tokens repeated, English prose, copies at a distance.

Shape letters: N inputs, T tokens.

* repeated (`mha_jax.sae.buffer.repeated_tokens`): `[BOS, x_1..x_n,
  x_1..x_n]`, the x drawn without replacement, so the only earlier copy
  of a second-half token is its first-half twin; `second_copy` and
  `first_copy` mark its targets.
* `prose`: the first `T` tokens of documents of the standard library's
  English prose (the pydoc topics and module docstrings of
  experiments/stdlib_prose.py, paragraphs joined by blank lines), as the
  model's tokenizer writes them; shipped with Python, so nothing is
  downloaded.
* `at_distance`: `[BOS, A, F, A]` with A `segment` random tokens and F
  random filler, so every token of the second A has its copy exactly
  `distance` tokens back.
"""

from __future__ import annotations

import functools

import numpy as np

from experiments import stdlib_prose
from mha_jax.sae import buffer


def second_copy(length: int) -> np.ndarray:
  """`[2 length]` bool over the targets of a `repeated` row (target t is
  token t + 1): True where the target lies in the second copy and its
  first occurrence is visible, i.e. all but the second copy's first
  token, which nothing predicts."""
  t = np.zeros(2 * length, bool)
  t[length + 1:] = True
  return t


def first_copy(length: int) -> np.ndarray:
  """`[2 length]` bool: targets in the first copy (no repeat to use)."""
  t = np.zeros(2 * length, bool)
  t[1:length] = True
  return t


def at_distance(n: int, distance: int, segment: int, token_range, bos: int,
                *, seed: int) -> np.ndarray:
  """`[N, distance + segment + 1]`: BOS, a segment, filler, the segment
  again `distance` tokens after it."""
  if distance < segment:
    raise ValueError(f"at_distance: `distance`={distance} must be at least "
                     f"`segment`={segment} (the copies would overlap)")
  x = buffer.distinct_tokens(n, distance, token_range, seed=seed)
  # The segment, then filler.
  return np.concatenate([np.full((n, 1), bos, np.int32), x,
                         x[:, :segment]], 1)


@functools.lru_cache(maxsize=1)
def prose_documents() -> tuple[str, ...]:
  """The prose documents, in a fixed order: each one's kept paragraphs
  joined by blank lines."""
  docs = stdlib_prose.documents()
  return tuple("\n\n".join(" ".join(p) for p in paras)
               for _, paras in sorted(docs.items()))


def prose(encode, n: int, length: int, *, seed: int, skip: int = 0
          ) -> np.ndarray:
  """`[N, length]` token ids: the first `length` tokens of `n` documents
  long enough, drawn with `seed` after leaving out the first `skip` of
  the drawn order (so two calls with `skip` 0 and n are disjoint)."""
  docs = prose_documents()
  order = np.random.default_rng(seed).permutation(len(docs))
  # One call for every document (a tokenizer call has a fixed cost of its
  # own), each cut to its start: a token is rarely over 8 characters.
  encoded = encode([docs[i][:8 * length] for i in order])
  rows = [ids[:length] for ids in encoded if len(ids) >= length]
  if len(rows) < skip + n:
    raise ValueError(f"prose: only {len(rows)} documents have {length} "
                     f"tokens; {skip + n} were asked for")
  return np.stack(rows[skip:skip + n]).astype(np.int32)
