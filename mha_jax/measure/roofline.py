"""The yardsticks a speed table divides by, timed in the same rounds as
what they measure.

A ratio to another library says who is faster; the share of a yardstick
says how far either is from what the machine does at its best on the same
kind of work:

- `matmul_yardstick(n)`: one jitted float32 `[n, n] x [n, n]` product,
  2 n^3 FLOPs. A step whose work is mostly matrix products (a training
  step, a forward or a gradient of many tokens) is measured by its
  matrix-multiply FLOPs over its time, against this product's rate:
  read from the jaxpr (`mha_jax.core.flops.jaxpr_matmul_flops`) where
  the program reads every product it asks for, else from the compiled
  program (`compiled_matmul_flops`), which leaves out what XLA drops.
- `stream_yardstick(rows, cols)`: one jitted float32 `[1, rows] x [rows,
  cols]` product, which reads its `rows * cols * 4` bytes of weights once
  and does almost nothing else with them. Decoding one token at a time
  reads every weight per token, so it is measured in weight bytes over
  its time, against this product's rate. The matrix is made larger than
  the CPU's caches (the default 512 MB), as a model's weights are.

`share` turns the times of one round into a fraction per round: a round
on a loaded machine slows the yardstick too, so the fraction moves less
than either time.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from mha_jax.measure import timing


def matmul_yardstick(n: int = 1024):
  """`(call, flops)`: a jitted float32 n x n x n product, warm, and its
  2 n^3 FLOPs."""
  if n < 1:
    raise ValueError(f"matmul_yardstick: n must be >= 1, got {n}")
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  mm = jax.jit(lambda a: a @ a).lower(a).compile()
  return (lambda: jax.block_until_ready(mm(a))), 2 * n ** 3


def stream_yardstick(rows: int = 2048, cols: int = 65536):
  """`(call, bytes)`: a jitted float32 `[1, rows] x [rows, cols]` product
  and the bytes of the matrix it reads per call (rows * cols * 4)."""
  if rows < 1 or cols < 1:
    raise ValueError(f"stream_yardstick: rows and cols must be >= 1, got "
                     f"{rows} and {cols}")
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(kx, (1, rows), jnp.float32)
  w = jax.random.normal(kw, (rows, cols), jnp.float32)
  mv = jax.jit(lambda x, w: x @ w).lower(x, w).compile()
  return (lambda: jax.block_until_ready(mv(x, w))), rows * cols * 4


def param_bytes(model) -> int:
  """Bytes of `model`'s `nnx.Param`s as stored: what decoding one token
  reads, the numerator measured against `stream_yardstick`."""
  return sum(x.size * x.dtype.itemsize
             for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def share(work: float, times, yard_work: float, yard_times) -> dict:
  """Per round, `work / time` over the yardstick's `yard_work /
  yard_time` in the same round: `{"median", "min", "max"}`.

  `times` and `yard_times` are seconds per round, in the same order
  (`timing.interleaved_times`)."""
  if len(times) != len(yard_times) or not times:
    raise ValueError(f"share: expected one yardstick time per round, got "
                     f"{len(times)} times and {len(yard_times)}")
  return timing.spread([(work / t) / (yard_work / y)
                        for t, y in zip(times, yard_times)])
