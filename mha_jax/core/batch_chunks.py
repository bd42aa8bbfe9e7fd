"""The einsum path on CPU, in independent chunks of the batch.

Shape letters: B batch, H query heads, Tq query length, Tk key length.

XLA's CPU backend runs each batched attention product (the `[B, H]`
small matrices of the scores and of the weights times the values) on one
thread, and a training step is mostly a chain of operations, each
waiting for the last; the second core idles through much of it
(`python -m experiments.benchmark.attention_products`,
docs/performance.md). XLA's runtime does run independent operations side
by side. So when the scores are large, the einsum path computes its
attention in `count()` chunks of the batch, each its own chain of
products and softmax, and concatenates their outputs `[b, Tq, H, Dv]`
(never the scores: an earlier split of the products alone concatenated
the `[B, H, Tq, Tk]` scores, and those copies cost more than the second
core gained). Every batch row's attention depends on its own row only,
so each chunk computes exactly what the whole batch computes for it; the
rows' user rules see their own batch index (`rows`).

The rule, measured on 2 AMD EPYC cores (family 25 model 17) in the
train-step benchmark's shapes, each step against the unchunked one in the
same process, alternating (docs/performance.md, "The einsum path in
batch chunks"): at `text_size` (B16 H8 T256, 32 MiB of float32 scores)
4 chunks took 0.86-0.89x the step's time, 2 chunks 0.89-0.91x, 8 chunks
0.95x; at the `random` shape (2 MiB of scores) 0.96-1.00x, and at the
induction experiment's (1 MiB) 0.92-1.11x, within the spread. So: on
CPU, 4 chunks (fewer when the batch is smaller) once the float32 scores
reach `MIN_SCORE_BYTES`; never elsewhere (a GPU or TPU runs a batched
product on the whole device), never when a hook reads or replaces the
weights (a hook sees the whole batch's `scores` and `pattern`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mha_jax.hooks import sites

# The float32 scores [B, H, Tq, Tk] from which the batch is chunked (module
# docstring: 32 MiB gained, 2 MiB did not).
MIN_SCORE_BYTES = 16 * 2**20
# Chunks at most: two per core of the 2-core machine it was measured on.
MAX_CHUNKS = 4


def count(b: int, h: int, tq: int, tk: int, hooks) -> int:
  """How many chunks the einsum path splits a batch of `b` into (1: none)."""
  if jax.default_backend() != "cpu" or b < 2:
    return 1
  if any(hooks.wants(s) for s in sites.WEIGHT_SITES):
    return 1
  if 4 * b * h * tq * tk < MIN_SCORE_BYTES:
    return 1
  return min(MAX_CHUNKS, b)


def bounds(b: int, n: int) -> list[tuple[int, int]]:
  """`n` contiguous `[start, stop)` row ranges covering `range(b)`, their
  sizes differing by at most one."""
  edges = [b * i // n for i in range(n + 1)]
  return list(zip(edges[:-1], edges[1:]))


def rows(x, b: int, start: int, stop: int):
  """`x [b?, ...]`'s rows `start:stop` when its first axis is the batch;
  as it is when that axis broadcasts (size 1) or it is None."""
  if x is None or jnp.ndim(x) == 0 or jnp.shape(x)[0] != b:
    return x
  return x[start:stop]


def rules_rows(rules, b: int, start: int, stop: int):
  """`rules` (a `score_rules.ScoreRules`) with its per-row arrays
  (`q_segment_ids`, `kv_segment_ids`, `q_positions`, each `[B, T]`)
  cut to rows `start:stop`; the per-head and static fields as they are."""
  return dataclasses.replace(
      rules, **{f: rows(getattr(rules, f), b, start, stop)
                for f in ("q_segment_ids", "kv_segment_ids", "q_positions")})
