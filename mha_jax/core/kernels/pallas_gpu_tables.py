"""Arrays a user rule closes over, read per element inside the Pallas GPU
kernel (document ids, a segment table, a mask_mod's thresholds).

Shape letters: Bq / Bk query / key block lengths.

A rule such as `doc[q_idx] == doc[kv_idx]` indexes an array it closes
over. Traced over a block's grid of indices that is a `gather`, which
JAX's Triton lowering (jax 0.10) does not lower; loading the whole array
into the kernel and gathering from the value would not lower either. A
load from a ref at an array of offsets does (`ref[offsets]`, Triton's
pointer load). So the kernel evaluates the rule's jaxpr with `evaluate`
below: each array mask_mod closes over, and each non-float one of
score_mod's, stays a `Table` (its ref, flattened, and its shape), and a
point gather or dynamic slice of one becomes a load at the flat offsets
of the indices, clipped or filled as the gather's mode says. Any other
use of a table loads it whole. score_mod's float arrays (a bias table)
are not read this way: their gradient would be a scatter-add, which the
Triton lowering lacks too (`pallas_gpu_plan.untraceable` refuses them
on a GPU).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.extend
from jax import lax
import jax.numpy as jnp
import numpy as np


class Table(NamedTuple):
  """A closed-over array left in memory: its flattened ref and shape."""
  ref: object
  shape: tuple

  def load(self):
    return self.ref[...].reshape(self.shape)


def _offsets(shape, starts):
  """Flat offsets of the (already clipped) start indices along `shape`."""
  strides = np.cumprod((1,) + tuple(shape[::-1]))[:-1][::-1]
  flat = 0
  for start, stride in zip(starts, strides):
    flat = flat + start * int(stride)
  return flat


def _clip(i, n):
  return jnp.clip(i, 0, n - 1)


def _point_gather(table, indices, params, out_shape):
  """`table[indices]` for a gather of single elements, or None for any
  other gather. indices `[..., n]` index the dims `start_index_map`."""
  dn = params["dimension_numbers"]
  if dn.operand_batching_dims or any(s != 1 for s in params["slice_sizes"]):
    return None
  n = indices.shape[-1]
  parts = ([jnp.squeeze(indices, -1)] if n == 1 else
           [jnp.squeeze(p, -1) for p in lax.split(
               indices, (1,) * n, axis=indices.ndim - 1)])
  starts = [jnp.zeros((), jnp.int32)] * len(table.shape)
  ok = True
  for j, d in enumerate(dn.start_index_map):
    ok = ok & (parts[j] >= 0) & (parts[j] < table.shape[d])
    starts[d] = _clip(parts[j], table.shape[d])
  val = table.ref[_offsets(table.shape, starts)]
  if params["mode"] == lax.GatherScatterMode.FILL_OR_DROP:
    fill = params["fill_value"]
    if fill is None:  # JAX's defaults for an out-of-range gather
      dtype = val.dtype
      fill = (jnp.nan if jnp.issubdtype(dtype, jnp.inexact) else
              True if dtype == jnp.bool_ else
              jnp.iinfo(dtype).min if jnp.issubdtype(dtype, jnp.signedinteger)
              else jnp.iinfo(dtype).max)
    val = jnp.where(ok, val, jnp.asarray(fill, val.dtype))
  return val.reshape(out_shape)


def _point_slice(table, starts, params, out_shape):
  """A dynamic slice of one element of `table` (scalar starts)."""
  if any(s != 1 for s in params["slice_sizes"]):
    return None
  starts = [_clip(s, n) for s, n in zip(starts, table.shape)]
  return table.ref[_offsets(table.shape, starts)].reshape(out_shape)


def _inner(eqn):
  """The closed jaxpr of a call primitive (jit), or None."""
  for key in ("jaxpr", "call_jaxpr"):
    sub = eqn.params.get(key)
    if sub is not None and hasattr(sub, "jaxpr"):
      return sub
  return None


def evaluate(jaxpr, consts, args):
  """`jax.core.eval_jaxpr`, where `args` may hold `Table`s: a point gather
  or dynamic slice of a table reads its elements from the ref; any other
  use loads the table whole."""
  env = {}
  read = lambda v: (v.val if isinstance(v, jax.extend.core.Literal)
                    else env[v])
  for v, x in zip(jaxpr.constvars, consts):
    env[v] = x
  for v, x in zip(jaxpr.invars, args):
    env[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    out = None
    if any(isinstance(x, Table) for x in invals):
      name, first = eqn.primitive.name, invals[0]
      rest_plain = not any(isinstance(x, Table) for x in invals[1:])
      shape = eqn.outvars[0].aval.shape
      if name == "gather" and isinstance(first, Table) and rest_plain:
        out = _point_gather(first, invals[1], eqn.params, shape)
      elif name == "dynamic_slice" and isinstance(first, Table) and rest_plain:
        out = _point_slice(first, invals[1:], eqn.params, shape)
      elif _inner(eqn) is not None:
        sub = _inner(eqn)
        out = evaluate(sub.jaxpr, sub.consts, invals)
      if out is None:
        invals = [x.load() if isinstance(x, Table) else x for x in invals]
    if out is None:
      with eqn.ctx.manager:
        out = eqn.primitive.bind(
            *invals, **eqn.primitive.get_bind_params(eqn.params))
    outs = out if eqn.primitive.multiple_results or isinstance(
        out, list) else [out]
    for v, x in zip(eqn.outvars, outs):
      env[v] = x
  return [read(v) for v in jaxpr.outvars]


def on_grid(fn, tables, *args):
  """`fn(tables, *args)` (one array out) with the tables' point reads
  from their refs: `fn` is traced with the tables as arrays, then
  evaluated by `evaluate`."""
  avals = [jax.ShapeDtypeStruct(t.shape, t.ref.dtype) for t in tables]
  closed = jax.make_jaxpr(lambda ts, *a: fn(ts, *a))(avals, *args)
  return evaluate(closed.jaxpr, closed.consts, [*tables, *args])[0]
