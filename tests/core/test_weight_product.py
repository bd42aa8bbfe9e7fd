"""mha_jax/core/weight_product.py: `x @ W` with a CPU-friendly weight
gradient. The forward and the activations' gradient are the same bits as
`precision.matmul`'s; the weight's gradient agrees with float64 NumPy and
is, on CPU, one plain-layout product that XLA gives to YNNPACK."""

import collections

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.benchmark import attention_products
from mha_jax.core import precision
from mha_jax.core import weight_product


def _operands(lead, k, n, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((*lead, k)).astype(np.float32)
  w = rng.standard_normal((k, n)).astype(np.float32)
  dy = rng.standard_normal((*lead, n)).astype(np.float32)
  return jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy)


def _vjp(fn, x, w, dy):
  y, pull = jax.vjp(fn, x, w)
  return (y, *pull(dy))


_shapes = st.tuples(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),  # leading dims
    st.integers(1, 9), st.integers(1, 9))


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(_shapes)
def test_forward_and_input_gradient_are_matmuls_bits(shape):
  lead, k, n = shape
  x, w, dy = _operands(lead, k, n)
  y, dx, dw = jax.jit(lambda *a: _vjp(weight_product.product, *a))(x, w, dy)
  y0, dx0, _ = jax.jit(lambda *a: _vjp(precision.matmul, *a))(x, w, dy)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y0))
  np.testing.assert_array_equal(np.asarray(dx), np.asarray(dx0))
  # The weight's gradient against float64 NumPy: x^T dy over every row.
  rows = np.asarray(x, np.float64).reshape(-1, k)
  want = rows.T @ np.asarray(dy, np.float64).reshape(-1, n)
  np.testing.assert_allclose(np.asarray(dw), want, rtol=1e-5,
                             atol=1e-5 * np.abs(want).max())


def test_forward_mode_and_second_order_derivatives():
  x, w, _ = _operands((3, 4), 5, 6)
  tx, tw, _ = _operands((3, 4), 5, 6, seed=1)
  y, t = jax.jvp(weight_product.product, (x, w), (tx, tw))
  y0, t0 = jax.jvp(precision.matmul, (x, w), (tx, tw))
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y0))
  np.testing.assert_allclose(np.asarray(t), np.asarray(t0), rtol=1e-5,
                             atol=1e-5)

  def loss(mm):
    return lambda w: jnp.sum(jnp.tanh(mm(x, w)) ** 2)

  h = jax.hessian(loss(weight_product.product))(w)
  h0 = jax.hessian(loss(precision.matmul))(w)
  np.testing.assert_allclose(np.asarray(h), np.asarray(h0), rtol=1e-4,
                             atol=1e-4)


def test_vmap_over_the_weight():
  x, _, _ = _operands((4,), 5, 6)
  ws = jnp.asarray(np.random.default_rng(2).standard_normal((3, 5, 6)),
                   jnp.float32)
  grad = jax.vmap(jax.grad(lambda w: jnp.sum(weight_product.product(x, w)
                                              ** 2)))(ws)
  grad0 = jax.vmap(jax.grad(lambda w: jnp.sum(precision.matmul(x, w)
                                               ** 2)))(ws)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(grad0),
                             rtol=1e-5, atol=1e-5)


def _barriers(fn, *args):
  jaxpr = jax.make_jaxpr(fn)(*args)
  return str(jaxpr).count("optimization_barrier")


def test_the_transposed_copy_is_made_only_for_a_weights_gradient():
  x, w, _ = _operands((2, 3), 4, 5)
  of_x = jax.grad(lambda x: jnp.sum(weight_product.product(x, w)))
  of_w = jax.grad(lambda w: jnp.sum(weight_product.product(x, w)))
  assert _barriers(of_x, x) == 0
  assert _barriers(of_w, w) == 1


def test_off_cpu_the_weight_term_is_the_plain_product(monkeypatch):
  """Another backend reads transposed operands itself: no copy, and the
  weight's gradient is then JAX's own (here the same bits)."""
  x, w, dy = _operands((2, 3), 4, 5)
  monkeypatch.setattr(weight_product.jax, "default_backend", lambda: "gpu")
  _, _, dw = _vjp(weight_product.product, x, w, dy)
  assert _barriers(jax.grad(
      lambda w: jnp.sum(weight_product.product(x, w))), w) == 0
  _, _, dw0 = _vjp(precision.matmul, x, w, dy)
  np.testing.assert_array_equal(np.asarray(dw), np.asarray(dw0))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU "
                    "kernels")
def test_on_cpu_the_weight_gradient_is_a_plain_layout_product():
  """The point of the module: in the compiled gradient of a projection
  the weight's product reads both operands untransposed, so XLA gives it
  to YNNPACK; with `precision.matmul` it is an Eigen dot reading both
  transposed."""
  x, w, dy = _operands((8, 64), 128, 96)

  def kernels(mm):
    fn = jax.jit(lambda x, w, dy: _vjp(mm, x, w, dy)[2])
    dots = attention_products.step_dots(fn.lower(x, w, dy).compile()
                                        .as_text())
    return collections.Counter((d["kernel"], attention_products.form_of(d))
                               for d in dots)

  assert kernels(weight_product.product) == {("YNNPACK", "NN"): 1}
  assert kernels(precision.matmul) == {("Eigen", "TT"): 1}


def test_models_linear_layers_route_weight_products_only():
  x, w, _ = _operands((2, 3), 4, 5)
  dims = (((2,), (0,)), ((), ()))
  y = weight_product.dot_general(x, w, dims, precision=None,
                                 preferred_element_type=None)
  assert _barriers(jax.grad(lambda w: jnp.sum(weight_product.dot_general(
      x, w, dims))), w) == 1
  np.testing.assert_array_equal(np.asarray(y),
                                np.asarray(precision.matmul(x, w)))
  # A batched product is not a weight's: the plain policy dot.
  a = jnp.ones((2, 3, 4))
  b = jnp.ones((2, 4, 5))
  assert _barriers(jax.grad(lambda b: jnp.sum(weight_product.dot_general(
      a, b, (((2,), (1,)), ((0,), (0,)))))), b) == 0


def test_a_weight_that_is_not_a_matrix_is_refused_by_name():
  with pytest.raises(ValueError, match=r"weight w \[K, N\].*w \(4, 5, 6\)"):
    weight_product.product(jnp.ones((2, 4)), jnp.ones((4, 5, 6)))
  with pytest.raises(ValueError, match=r"x \(2, 3\), w \(4, 5\)"):
    weight_product.product(jnp.ones((2, 3)), jnp.ones((4, 5)))
