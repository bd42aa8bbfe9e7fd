"""English prose from the Python standard library, as BERT sentence pairs.

The documents and their kept sentences are `experiments/stdlib_prose.py`'s.
Neighbouring kept sentences of one paragraph form the pairs
`[CLS] a [SEP] b [SEP]` that Clark et al. (2019) fed BERT.
"""

from __future__ import annotations

import numpy as np


def pairs(docs) -> list[dict]:
  """Every pair of neighbouring sentences within one paragraph:
  {"doc", "a", "b"}, in document order."""
  return [{"doc": name, "a": a, "b": b}
          for name, paras in docs.items() for para in paras
          for a, b in zip(para[:-1], para[1:])]


def ranking_triples(pairs_, n: int, *, seed: int) -> list[dict]:
  """`n` triples {"anchor", "positive", "negative"} for the ranking task:
  the positive is the sentence after the anchor in its paragraph, the
  negative a sentence of a different document, both drawn with `seed`."""
  rng = np.random.default_rng(seed)
  pick = rng.permutation(len(pairs_))[:n]
  out = []
  for i in pick:
    p = pairs_[i]
    while True:
      q = pairs_[int(rng.integers(len(pairs_)))]
      if q["doc"] != p["doc"]:
        break
    out.append({"anchor": p["a"], "positive": p["b"],
                "negative": q["a" if rng.random() < 0.5 else "b"],
                "doc": p["doc"]})
  return out
