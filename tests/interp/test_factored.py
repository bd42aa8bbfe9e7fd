"""`Factored` against NumPy's decompositions of the full product."""

import re

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.interp.factored import Factored

U32 = 2.0 ** -24

def draw(seed, lead, m, r, n):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((lead, m, r)).astype(np.float32)
  b = rng.standard_normal((lead, r, n)).astype(np.float32)
  return a, b, a.astype(np.float64) @ b.astype(np.float64)


@jax.jit
def decompose(f):
  return f.svd(), f.norm()


# (lead, m, r, n): a thin inner width, one wider than either side, one
# wider than n only, a single row, a square one. Each compiles once.
@pytest.mark.parametrize("shape", [(3, 6, 2, 5), (3, 3, 5, 4), (3, 5, 4, 2),
                                   (3, 1, 3, 4), (3, 4, 4, 4)])
def test_singular_values_and_norm_match_numpy_on_the_full_product(shape):
  a, b, full = draw(sum(shape), *shape)
  f = Factored(a, b)
  k = min(shape[1:])
  want = np.linalg.svd(full, compute_uv=False)[..., :k]  # [lead, k]
  scale = np.linalg.norm(a, axis=(-2, -1)) * np.linalg.norm(b, axis=(-2, -1))
  tol = 64 * U32 * scale[:, None]  # ||a|| ||b|| bounds every entry's error
  (u, s, vh), norm = decompose(f)
  assert np.all(np.abs(np.asarray(s) - want) <= tol)
  assert u.shape == (shape[0], shape[1], k) and vh.shape == (
      shape[0], k, shape[3])
  assert np.all(np.abs(np.asarray((u * s[..., None, :]) @ vh) - full)
                <= tol[..., None])
  np.testing.assert_allclose(np.asarray(norm),
                             np.linalg.norm(full, axis=(-2, -1)),
                             rtol=64 * U32, atol=64 * U32 * scale.max())


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(st.integers(2, 7), st.integers(1, 4), st.integers(0, 2 ** 16))
def test_eigenvalues_are_the_nonzero_eigenvalues_of_the_product(m, r, seed):
  hypothesis.assume(r < m)  # so that a @ b has m - r zero eigenvalues
  a, b, full = draw(seed, 1, m, r, m)
  got = np.sort_complex(np.asarray(Factored(a, b).eigenvalues)[0])
  lam = np.linalg.eigvals(full[0])
  # The m - r smallest in modulus are the zeros of a rank-r product.
  want = np.sort_complex(lam[np.argsort(np.abs(lam))[m - r:]])
  assert got.shape == (r,)
  scale = np.linalg.norm(a) * np.linalg.norm(b)
  # Eigenvalues of a nonnormal matrix move by up to sqrt(eps) near a
  # defective one; compare as multisets within that.
  for g in got:
    assert np.min(np.abs(want - g)) < 1e-3 * scale


def test_products_transpose_and_indexing_stay_factored():
  a, b, full = draw(0, 3, 5, 2, 4)
  f = Factored(a, b)
  assert f.shape == (3, 5, 4) and (f.ldim, f.mdim, f.rdim) == (5, 2, 4)
  np.testing.assert_allclose(np.asarray(f.full()), full, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(f.T.full()), full.swapaxes(-1, -2),
                             rtol=1e-5, atol=1e-5)
  c = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
  e = np.random.default_rng(2).standard_normal((7, 5)).astype(np.float32)
  left = e @ f @ c  # NumPy array @ Factored @ NumPy array
  assert isinstance(left, Factored) and left.mdim == 2
  np.testing.assert_allclose(np.asarray(left.full()), e @ full @ c,
                             rtol=1e-4, atol=1e-4)
  both = f @ Factored(np.ones((3, 4, 1), np.float32), np.ones((3, 1, 2),
                                                          np.float32))
  assert both.mdim == 1 and both.shape == (3, 5, 2)
  np.testing.assert_allclose(np.asarray(both.full()),
                             full @ np.ones((3, 4, 2)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(f[1].full()), full[1], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(f.get_corner(2)), full[:, :2, :2],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray((2.0 * f).full()), 2 * full,
                             rtol=1e-5, atol=1e-5)


def test_it_is_a_pytree_under_jit_and_vmap():
  a, b, full = draw(3, 4, 6, 3, 6)
  f = Factored(a, b)
  assert len(jax.tree.leaves(f)) == 2
  s = jax.jit(lambda f: f.S)(f)
  s_each = jax.vmap(lambda f: f.S)(f)  # vmap over the leading axis
  want = np.linalg.svd(full, compute_uv=False)[..., :3]
  np.testing.assert_allclose(np.asarray(s), want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(s_each), want, rtol=1e-4, atol=1e-4)
  doubled = jax.tree.map(lambda x: 2 * x, f)
  np.testing.assert_allclose(np.asarray(doubled.full()), 4 * full,
                             rtol=1e-5, atol=1e-5)


def test_errors_name_the_argument():
  with pytest.raises(ValueError, match=re.escape(
      "Factored: `a` must have rank >= 2 ([..., m, r] and [..., r, n]), "
      "got shape [3]")):
    Factored(jnp.ones(3), jnp.ones((3, 2)))
  with pytest.raises(ValueError, match=re.escape(
      "Factored: the inner widths differ: `a` is [4, 2] ([..., m, r]) and "
      "`b` is [3, 5] ([..., r, n]); a.shape[-1] must equal b.shape[-2]")):
    Factored(jnp.ones((4, 2)), jnp.ones((3, 5)))
  with pytest.raises(ValueError, match=re.escape(
      "Factored: the leading axes of `a` [2, 4, 2] and `b` [3, 2, 5] do not "
      "broadcast")):
    Factored(jnp.ones((2, 4, 2)), jnp.ones((3, 2, 5)))
  f = Factored(jnp.ones((4, 2)), jnp.ones((2, 5)))
  with pytest.raises(ValueError, match=re.escape(
      "Factored.BA: needs a square product, got [m, n]=[4, 5]")):
    _ = f.eigenvalues
  with pytest.raises(ValueError, match=re.escape(
      "Factored @ array: `other` must be [..., 5, k], got shape [4, 3]")):
    _ = f @ jnp.ones((4, 3))
  with pytest.raises(ValueError, match=re.escape(
      "array @ Factored: `other` must be [..., k, 4], got shape [3, 5]")):
    _ = np.ones((3, 5), np.float32) @ f
  with pytest.raises(ValueError, match=re.escape(
      "Factored @ Factored: [4, 5] @ [4, 5]: columns 5 != rows 4")):
    _ = f @ f
  with pytest.raises(IndexError, match=re.escape(
      "Factored[...]: index (0,) must pick leading axes only (of []), "
      "without `...`; the matrix axes [m, n]=[4, 5] stay whole")):
    _ = f[0]
