"""Counting the matrix-multiply FLOPs of a function, four ways.

Shape letters: B batch, n sequence length, D d_model, H heads.

  * `jaxpr_matmul_flops(f, *args)`: walk the jaxpr of `f` (and every
    sub-jaxpr: pjit, custom_vjp/jvp, scan, while, cond, remat) and add up
    2 * M * N * K for each `dot_general`, batch dimensions included. This is
    exactly what the program asks for, before XLA fuses or rewrites anything.
  * `compiled_matmul_flops(compiled)`: the same sum over the `dot`
    instructions of the program XLA compiled, each while loop's body
    times its trip count. Products whose results are never read are gone
    from it, so this is the work the program does, where the jaxpr's count
    is the work it asks for.
  * `xla_flops(f, *args)`: XLA's own estimate from the compiled HLO, which
    also counts elementwise work (scaling, softmax, masking).
  * `analytic_mha_flops(batch, n, d_model)`: FORMULAS.md's closed form for one
    self-attention forward pass without bias, 8 B n D^2 + 4 B n^2 D. It does
    not depend on the number of heads: the source's cost claim.

A multiply-add counts as 2 FLOPs everywhere, as in FORMULAS.md.
"""

from __future__ import annotations

import math
import re
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


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([^\s(]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%([^\s=]+)\s*=\s*"
    r"(?:[a-z]\w*\[([\d,]*)\]\S*|\(.*?\)|\S+)\s+([a-z][\w\-]*)\((.*)$")
# Custom calls a backend hands its products to (cuBLAS, cuDNN, oneDNN): a
# dot count that skipped them would be quietly short.
_PRODUCT_CALL = re.compile(r"custom_call_target=\"[^\"]*"
                           r"(gemm|matmul|cudnn|onednn|cublas)", re.I)


def _dims(name: str, text: str) -> list[int]:
  """The ints of `name={...}` in an instruction's text; [] without it."""
  found = re.search(name + r"=\{([\d,]*)\}", text)
  return [int(d) for d in found.group(1).split(",") if d] if found else []


def _parse_hlo(text: str):
  """`({computation: [(name, dims, opcode, rest)]}, entry)` from an HLO
  module's text; `dims` is the array shape, or None for tuples/tokens."""
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      current = comps.setdefault(head.group(1), [])
      if line.startswith("ENTRY"):
        entry = head.group(1)
      continue
    if line.strip() == "}":
      current = None
      continue
    ins = _INSTRUCTION.match(line) if current is not None else None
    if ins:
      name, dims, opcode, rest = ins.groups()
      shape = None if dims is None else tuple(int(d) for d in dims.split(",")
                                              if d)
      current.append((name, shape, opcode, rest))
  if entry is None:
    raise ValueError("compiled_matmul_flops: expected an HLO module with an "
                     "ENTRY computation, got text without one")
  return comps, entry


def _computation_flops(comps, name: str, memo: dict) -> int:
  if name in memo:
    return memo[name]
  shapes = {n: s for n, s, _, _ in comps[name]}
  total = 0
  for ins_name, shape, opcode, rest in comps[name]:
    if opcode == "dot":
      lhs = re.match(r"\s*%([^\s,)]+)", rest).group(1)
      contract = _dims("lhs_contracting_dims", rest)
      total += 2 * math.prod(shape) * math.prod(shapes[lhs][d]
                                                for d in contract)
      continue
    if opcode == "custom-call" and _PRODUCT_CALL.search(rest):
      raise ValueError(
          f"compiled_matmul_flops: instruction %{ins_name} hands a product to "
          f"a custom call ({_PRODUCT_CALL.search(rest).group(0)}...); only "
          f"`dot` instructions are counted, so the count would be short")
    called = re.findall(r"(?:calls|to_apply|body)=%([^\s,}]+)", rest)
    branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
    if opcode == "while":
      trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
      if trip is None:
        raise ValueError(
            f"compiled_matmul_flops: while loop %{ins_name} has no known trip "
            f"count, so its body's products cannot be counted; expected a "
            f"loop of static length (lax.scan, fori_loop with static bounds)")
      total += int(trip.group(1)) * sum(
          _computation_flops(comps, c, memo) for c in called)
    elif branches is not None:  # one branch runs: the dearest is counted
      total += max(_computation_flops(comps, c.strip().lstrip("%"), memo)
                   for c in branches.group(1).split(","))
    else:
      total += sum(_computation_flops(comps, c, memo) for c in called)
  memo[name] = total
  return total


def compiled_matmul_flops(compiled) -> int:
  """Matrix-multiply FLOPs of a compiled program: 2 * prod(result) * prod(
  contracted lhs dims) for each `dot` it runs.

  `compiled` is a `jax.stages.Compiled` (`jax.jit(f).lower(*args).compile()`)
  or its `as_text()`. Fusions and calls are followed; a while loop's body
  counts its known trip count times (XLA knows it for `lax.scan`), and a
  loop without one is refused by name; a conditional counts its dearest
  branch. Products XLA removed because nothing reads them are not counted:
  this is the work the program does. A product handed to a library's
  custom call (cuBLAS on a GPU, oneDNN) is refused rather than missed; on
  the CPU backend's defaults every product stays a `dot` (YNNPACK fusions
  keep theirs inside).
  """
  text = compiled if isinstance(compiled, str) else compiled.as_text()
  comps, entry = _parse_hlo(text)
  return _computation_flops(comps, entry, {})


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
