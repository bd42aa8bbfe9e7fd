"""`x @ W` for a weight matrix `W`, with its weight gradient in the
layout XLA's CPU matmul kernel reads.

Every projection of the library (q, k, v, the output, the MLPs' and the
models' linear layers) multiplies activations `x [..., K]` by a weight
`W [K, N]`. Reverse mode then needs `dW = x^T dy`, a product whose left
operand is read transposed (it contracts its rows). JAX's transpose rule
writes it as `dot(dy, x)` followed by a transpose, which XLA folds into
one dot reading both operands transposed; XLA's CPU backend gives
YNNPACK, its fast matmul, only products in the plain GEMM layout, so
every weight gradient ran as an Eigen contraction instead, at 1.9x
torch's time against 1.2x for the products beside it
(`python -m experiments.benchmark.attention_products`,
docs/performance.md).

`product(x, w)` computes the same forward (the same dot, the same bits)
and defines its derivative by a JVP (`jax.custom_jvp`, so `jax.jvp`,
`jax.hessian` and `jax.linearize` keep working) whose weight term reads a
copy of `x` transposed once, `x^T [K, rows]`, behind an optimization
barrier. Reverse mode transposes that term into `x^T @ dy`, a plain GEMM
XLA cannot fold back. Torch multiplies a view `x.t()`; here it costs one
copy of the input, made only when a weight's derivative is asked for (a
gradient with respect to the activations alone, as in attribution
patching, never makes it).

Only on CPU backends: cuBLAS and TPUs read transposed operands as they
are, so elsewhere the weight term is the plain `x @ dW`. On CPU the
weight gradients change in their last bits (another kernel sums in
another order); the forward and the gradients with respect to `x` are
the same bits as `precision.matmul`'s (tests/core/test_weight_product.py).
Measured on 2 Intel Xeon cores against the code before it, fresh
processes alternating (docs/performance.md): SmolLM2-135M's loss and
gradient at 512 tokens 0.89x its time (0.87-0.89), the train step 0.95x
at the induction and random shapes and 1.00x (0.95-1.00) at the text
size. Not used by the sparse autoencoders, whose 16x step (a `[1024,
576] x [576, 9216]` encoder) was 4% slower with it: there Eigen's
transposed product was not the slow one.
"""

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero
import jax.numpy as jnp

from mha_jax.core import precision as precision_lib


def _dims(x):
  """x's last dim against the weight's first, no batch dims."""
  return (((x.ndim - 1,), (0,)), ((), ()))


@jax.custom_jvp
def product(x: jax.Array, w: jax.Array) -> jax.Array:
  """`x [..., K] @ w [K, N] -> [..., N]` at the precision policy's
  precision (module docstring: its derivative)."""
  if jnp.ndim(w) != 2 or jnp.ndim(x) < 1 or x.shape[-1] != w.shape[0]:
    raise ValueError(f"weight_product.product: expected x [..., K] and a "
                     f"weight w [K, N]; got x {jnp.shape(x)}, w "
                     f"{jnp.shape(w)}")
  return lax.dot_general(x, w, _dims(x),
                         precision=precision_lib.dot_precision(x, w))


def _jvp(primals, tangents):
  x, w = primals
  dx, dw = tangents
  y = product(x, w)
  prec = precision_lib.dot_precision(x, w)
  terms = []
  if not isinstance(dx, SymbolicZero):
    terms.append(lax.dot_general(dx, w, _dims(dx), precision=prec))
  if not isinstance(dw, SymbolicZero):
    if jax.default_backend() == "cpu":
      # x^T [K, rows], made once and kept apart from the dot by the
      # barrier, so that the transposed term is x^T @ dy with both
      # operands in the plain GEMM layout (module docstring).
      rows = x.reshape(-1, x.shape[-1])
      xt = lax.optimization_barrier(rows.T)
      t = lax.dot_general(xt, dw, (((0,), (0,)), ((), ())), precision=prec)
      terms.append(t.reshape(*x.shape[:-1], w.shape[1]))
    else:
      terms.append(lax.dot_general(x, dw, _dims(x), precision=prec))
  if not terms:
    return y, jnp.zeros_like(y)
  return y, terms[0] if len(terms) == 1 else terms[0] + terms[1]


product.defjvp(_jvp, symbolic_zeros=True)


def dot_general(lhs, rhs, dimension_numbers, precision=None, **kwargs):
  """`precision.dot_general`, through `product` when it is a weight's
  product (`rhs [K, N]`, lhs's last dim against rhs's first, no batch
  dims, no other option given): the `dot_general=` of the models'
  `nnx.Linear` layers, whose kernels are such weights."""
  (lc, rc), (lb, rb) = dimension_numbers
  weight = (jnp.ndim(rhs) == 2 and tuple(lc) == (jnp.ndim(lhs) - 1,)
            and tuple(rc) == (0,) and not tuple(lb) and not tuple(rb))
  if weight and precision is None and all(v is None for v in kwargs.values()):
    return product(lhs, rhs)
  return precision_lib.dot_general(lhs, rhs, dimension_numbers, precision,
                                   **kwargs)
