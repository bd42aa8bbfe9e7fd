"""A mask or bias that broadcasts over some of the kernel's five block
axes `[B, K, G, Tq', Tk']`, cut and summed block by block: its
`[.., Bq, Bk]` block at the query and key starts `qs`, `ks` (`slice_block`),
a block's gradient summed back over the axes it broadcasts (`reduce_to`)
and added into the bias' gradient (`add_bias_block`). The kernel's
arithmetic on such arrays, apart from the online softmax itself.
"""

from __future__ import annotations

from jax import lax
import jax.numpy as jnp


def slice_block(x, qs, ks, cfg):
  """The `[.., Bq, Bk]` block of a 5-d mask or bias (broadcast axes stay)."""
  if x is None:
    return None
  if x.shape[3] != 1:
    x = lax.dynamic_slice_in_dim(x, qs, cfg.bq, axis=3)
  if x.shape[4] != 1:
    x = lax.dynamic_slice_in_dim(x, ks, cfg.bk, axis=4)
  return x


def reduce_to(x, shape):
  """Sum `x` over the axes where `shape` broadcasts (size 1), keeping them."""
  axes = tuple(a for a, (n, s) in enumerate(zip(shape, x.shape))
               if n == 1 and s != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def add_bias_block(dbias, block, qs, ks, cfg):
  """dbias[.., qs:qs+Bq, ks:ks+Bk] += block, on the axes bias does not share."""
  starts = [0, 0, 0, qs if dbias.shape[3] != 1 else 0,
            ks if dbias.shape[4] != 1 else 0]
  current = lax.dynamic_slice(dbias, starts, block.shape)
  return lax.dynamic_update_slice(dbias, current + block, starts)
