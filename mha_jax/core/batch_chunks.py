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
so each chunk runs the same operations on its rows as the whole batch
does; a user rule reads each row's index in the whole batch (the einsum
path's `row0`).

The rule, measured on 2 AMD EPYC cores (family 25 model 17), each train
step against the same step unchunked in one process, alternating
(`python -m experiments.benchmark.batch_chunks`; docs/performance.md,
"The einsum path in batch chunks"): at the benchmark's `text_size` (B16
H8 T256, 32 MiB of float32 scores) the chunked step took 0.91x the
whole one's time in each of 3 processes, with the same loss to the
bit; 2 chunks gained less (0.93x) and 8 chunks less again (0.96x). The
same step with smaller scores, 4 chunks against none: 16 MiB (B8 or H4)
0.90x and 0.93x, 8 MiB 0.96x, 4 MiB 1.02x. So: on CPU, 4 chunks (fewer
when the batch is smaller) once the float32 scores reach
`MIN_SCORE_BYTES`; never elsewhere (a GPU or TPU runs a batched product
on the whole device), nor in a process of several devices (host devices
on a data mesh, docs/performance.md "Both cores through host devices",
already run the batch's shards side by side, and a chunk of the global
batch would cut across them), nor when a hook reads or replaces the
weights (a hook sees the whole batch's `scores` and `pattern`). XLA may
compile a chunk's smaller batch with other roundings than the whole
batch's; the tests' calls and the `text_size` step gave the same bits.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mha_jax.hooks import sites

# The float32 scores [B, H, Tq, Tk] from which the batch is chunked (module
# docstring: 8 MiB and more gained, 4 MiB did not).
MIN_SCORE_BYTES = 8 * 2**20
# Chunks at most: two per core of the 2-core machine it was measured on.
MAX_CHUNKS = 4


def count(b: int, h: int, tq: int, tk: int, hooks) -> int:
  """How many chunks the einsum path splits a batch of `b` into (1: none)."""
  # Several devices (host devices on a CPU) already split a batch over a
  # mesh; chunks of the global batch would cut across their shards.
  if jax.default_backend() != "cpu" or jax.device_count() > 1 or b < 2:
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
