"""Counting the matrix-multiply FLOPs of a function, three ways.

Shape letters: B batch, n sequence length, D d_model, H heads.

  * `jaxpr_matmul_flops(f, *args)`: walk the jaxpr of `f` (and every
    sub-jaxpr: pjit, custom_vjp/jvp, scan, while, cond, remat) and add up
    2 * M * N * K for each `dot_general`, batch dimensions included. This is
    exactly what the program asks for, before XLA fuses or rewrites anything.
  * `xla_flops(f, *args)`: XLA's own estimate from the compiled HLO, which
    also counts elementwise work (scaling, softmax, masking).
  * `analytic_mha_flops(batch, n, d_model)`: FORMULAS.md's closed form for one
    self-attention forward pass without bias, 8 B n D^2 + 4 B n^2 D. It does
    not depend on the number of heads: the source's cost claim.

A multiply-add counts as 2 FLOPs everywhere, as in FORMULAS.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
from jax.extend import core as jex_core


def dot_general_flops(lhs_shape, rhs_shape, dimension_numbers) -> int:
  """2 * prod(lhs dims) * prod(rhs free dims) for one `dot_general`.

  Every lhs dimension (batch, contracting, free) appears once in the product;
  the rhs contributes only its free dimensions. That is 2 * M * N * K per
  batch element, times the batch size.
  """
  (_, rhs_contract), (_, rhs_batch) = dimension_numbers
  rhs_free = [s for i, s in enumerate(rhs_shape)
              if i not in rhs_contract and i not in rhs_batch]
  return 2 * math.prod(lhs_shape) * math.prod(rhs_free)


def _sub_jaxprs(value) -> list:
  """Jaxprs held in one equation parameter (possibly inside tuples/lists)."""
  if isinstance(value, jex_core.ClosedJaxpr):
    return [value.jaxpr]
  if isinstance(value, jex_core.Jaxpr):
    return [value]
  if isinstance(value, (tuple, list)):
    return [j for v in value for j in _sub_jaxprs(v)]
  return []


def _jaxpr_flops(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
      total += dot_general_flops(lhs, rhs, eqn.params["dimension_numbers"])
      continue
    if name == "cond":
      # Only one branch runs: count the most expensive one.
      total += max((_jaxpr_flops(b) for b in
                    _sub_jaxprs(eqn.params["branches"])), default=0)
      continue
    inner = sum(_jaxpr_flops(j) for v in eqn.params.values()
                for j in _sub_jaxprs(v))
    # A scan body runs `length` times. A while body's trip count is unknown
    # statically, so it is counted once (callers should unroll if they care).
    total += inner * eqn.params.get("length", 1) if name == "scan" else inner
  return total


def jaxpr_matmul_flops(f: Callable[..., Any], *args, **kwargs) -> int:
  """Matrix-multiply FLOPs of `f(*args, **kwargs)`, read from its jaxpr.

  Only `dot_general` is counted (einsum, @ and matmul all lower to it).
  Elementwise work such as scaling and the softmax is deliberately left out,
  as in FORMULAS.md's exact count.
  """
  closed = jax.make_jaxpr(lambda *a: f(*a, **kwargs))(*args)
  return _jaxpr_flops(closed.jaxpr)


def xla_cost_analysis(f: Callable[..., Any], *args, **kwargs) -> dict:
  """XLA's cost analysis of `jax.jit(f)` compiled for `args`, as one dict.

  Recent JAX returns a dict; older releases returned a list with one dict per
  computation. Both are normalised to a single dict here.
  """
  compiled = jax.jit(lambda *a: f(*a, **kwargs)).lower(*args).compile()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    merged: dict[str, float] = {}
    for part in cost:
      for key, val in (part or {}).items():
        merged[key] = merged.get(key, 0.0) + val
    cost = merged
  return dict(cost or {})


def xla_flops(f: Callable[..., Any], *args, **kwargs) -> float:
  """XLA's FLOP count for `jax.jit(f)(*args)` (matmuls plus elementwise)."""
  return float(xla_cost_analysis(f, *args, **kwargs).get("flops", 0.0))


def analytic_mha_flops(batch: int, n: int, d_model: int) -> int:
  """FORMULAS.md: 8 B n D^2 (four projections) + 4 B n^2 D (QK^T and AV).

  One self-attention forward pass, length n, no bias, Dh * H = D. The number
  of heads does not appear: splitting D into heads does not change the cost.
  """
  return 8 * batch * n * d_model ** 2 + 4 * batch * n ** 2 * d_model
