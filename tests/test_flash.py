"""The blockwise path and the jax.nn delegates agree with the vmap reference.

Shape letters: B batch, Tq/Tk query/key lengths, H query heads, K kv heads,
Dh head width.
"""

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax import attention
from mha_jax import flash
from mha_jax import masks
from mha_jax import multi_head
from mha_jax import params as params_lib

_SETTINGS = dict(max_examples=10, deadline=None, derandomize=True,
                 suppress_health_check=[hypothesis.HealthCheck.too_slow])


def _reference(q, k, v, mask, bias, is_causal):
  return attention.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                          implementation="vmap")[0]


def _inputs(seed, b, tq, tk, h, kh, dh, mask_kind, bias_kind,
            dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  normal = lambda *s: jnp.asarray(rng.normal(size=s), dtype)
  q, k, v = normal(b, tq, h, dh), normal(b, tk, kh, dh), normal(b, tk, kh, dh)
  mask = {
      "none": None,
      # Key padding, some sequences with no valid key at all (empty rows).
      "padding": masks.padding_mask(jnp.asarray(rng.integers(0, tk + 1, b)),
                                    tk),
      "full": jnp.asarray(rng.random((b, h, tq, tk)) < 0.7),
  }[mask_kind]
  bias = {
      "none": None,
      "heads": jnp.asarray(rng.normal(size=(1, h, tq, tk)), jnp.float32),
      "keys": jnp.asarray(rng.normal(size=(b, 1, 1, tk)), jnp.float32),
  }[bias_kind]
  return q, k, v, mask, bias


def _loss_and_grads(fn, q, k, v, bias, ct):
  """Values and gradients w.r.t. q, k, v (and bias) of <fn(...), ct>."""
  def loss(q, k, v, bias):
    return jnp.sum(fn(q, k, v, bias).astype(jnp.float32) * ct)
  argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  # One jitted program per case: op-by-op dispatch would dominate the time.
  both = jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums)(*a)))
  return both(q, k, v, bias)


def _assert_tree_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x, np.float32),
                               np.asarray(y, np.float32), atol=atol, rtol=0)


@hypothesis.settings(**_SETTINGS)
@hypothesis.given(
    seed=st.integers(0, 2**16),
    b=st.integers(1, 2),
    tq=st.integers(1, 21),
    tk=st.integers(1, 21),
    heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),  # MHA, GQA, MQA
    block=st.sampled_from([(4, 4), (8, 3), (5, 16)]),
    is_causal=st.booleans(),
    mask_kind=st.sampled_from(["none", "padding", "full"]),
    bias_kind=st.sampled_from(["none", "heads", "keys"]),
)
def test_flash_matches_reference_values_and_grads(
    seed, b, tq, tk, heads, block, is_causal, mask_kind, bias_kind):
  """Shapes that do and do not divide the blocks; Tq != Tk; empty rows."""
  h, kh = heads
  q, k, v, mask, bias = _inputs(seed, b, tq, tk, h, kh, 4, mask_kind,
                                bias_kind)
  ct = jnp.asarray(np.random.default_rng(seed + 1).normal(size=q.shape),
                   jnp.float32)
  fl = lambda q, k, v, bias: flash.flash_attention(
      q, k, v, mask=mask, bias=bias, is_causal=is_causal, block_q=block[0],
      block_k=block[1])
  ref = lambda q, k, v, bias: _reference(q, k, v, mask, bias, is_causal)
  got, got_grads = _loss_and_grads(fl, q, k, v, bias, ct)
  want, want_grads = _loss_and_grads(ref, q, k, v, bias, ct)
  _assert_tree_close(got, want, atol=1e-5)
  _assert_tree_close(got_grads, want_grads, atol=1e-4)


def test_fully_masked_rows_give_zero_output_and_finite_grads():
  # Tq > Tk with bottom-right causality: the first Tq - Tk queries see nothing;
  # query row 3 is also emptied by the mask.
  q, k, v, _, _ = _inputs(0, 1, 9, 5, 2, 2, 4, "none", "none")
  mask = jnp.ones((1, 1, 9, 5), bool).at[:, :, 6].set(False)
  fl = jax.jit(lambda q, k, v: flash.flash_attention(
      q, k, v, mask=mask, is_causal=True, block_q=4, block_k=2))
  out = fl(q, k, v)
  np.testing.assert_array_equal(np.asarray(out[:, :4]), 0.0)
  np.testing.assert_array_equal(np.asarray(out[:, 6]), 0.0)
  assert np.all(np.abs(np.asarray(out[:, 4:6])) > 0)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(fl(*a) ** 2), (0, 1, 2)))(
      q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  np.testing.assert_array_equal(np.asarray(grads[0][:, :4]), 0.0)
  _assert_tree_close(out, _reference(q, k, v, mask, None, True), atol=1e-6)


def test_bf16_accumulates_in_float32():
  """bf16 flash is no further from exact float32 than the bf16 reference."""
  q, k, v, mask, bias = _inputs(3, 2, 40, 40, 4, 2, 16, "full", "heads",
                                dtype=jnp.bfloat16)
  fl = jax.jit(lambda q, k, v: flash.flash_attention(
      q, k, v, mask=mask, bias=bias, is_causal=True, block_q=16,
      block_k=8))(q, k, v)
  assert fl.dtype == jnp.bfloat16
  f32 = lambda x: x.astype(jnp.float32)
  ref = jax.jit(lambda q, k, v: _reference(q, k, v, mask, bias, True))
  exact, ref16 = ref(f32(q), f32(k), f32(v)), ref(q, k, v)
  err_flash = float(jnp.max(jnp.abs(f32(fl) - exact)))
  err_ref = float(jnp.max(jnp.abs(f32(ref16) - exact)))
  assert err_flash <= max(err_ref, 2 ** -8)
  # Gradients of a bf16 call stay bf16 and near the float32 ones.
  g16 = jax.jit(jax.grad(lambda q: jnp.sum(f32(flash.flash_attention(
      q, k, v, is_causal=True, block_q=16, block_k=8)))))(q)
  g32 = jax.jit(jax.grad(lambda q: jnp.sum(_reference(
      q, f32(k), f32(v), None, None, True))))(f32(q))
  assert g16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(f32(g16)), np.asarray(g32), atol=0.05)


@pytest.mark.parametrize("tq,tk,bq,bk", [(16, 16, 4, 4), (7, 19, 3, 5),
                                         (19, 7, 5, 3), (8, 8, 8, 2)])
def test_causal_visits_exactly_the_blocks_with_a_visible_key(tq, tk, bq, bk):
  cfg = flash._Config(tq=tq, tk=tk, bq=bq, bk=bk, is_causal=True)
  nq, nk = -(-tq // bq), -(-tk // bk)
  visible = np.zeros((nq * bq, nk * bk), bool)
  visible[:tq, :tk] = np.asarray(masks.causal_mask(tq, tk))
  for i in range(nq):
    rows = visible[i * bq:(i + 1) * bq].reshape(bq, nk, bk).any(axis=(0, 2))
    want = 0 if not rows.any() else int(np.nonzero(rows)[0].max()) + 1
    assert int(flash._num_kv_blocks(i, nk, cfg)) == want
    assert not rows[want:].any()  # nothing visible is skipped


def _largest_intermediate(fn, *args):
  """Largest array size anywhere in fn's jaxpr, sub-jaxprs included."""
  sizes = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      sizes.extend(int(np.prod(v.aval.shape)) for v in eqn.outvars)
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return max(sizes)


def test_no_score_matrix_in_forward_or_backward():
  t, dh = 2048, 16
  x = jnp.ones((1, t, 1, dh), jnp.float32)
  loss = lambda impl: lambda q, k, v: jnp.sum(attention.attend(
      q, k, v, is_causal=True, implementation=impl)[0])
  grad_flash = jax.grad(loss("flash"), (0, 1, 2))
  biggest = _largest_intermediate(grad_flash, x, x, x)
  # The largest arrays are q/k/v-sized ([T, Dh]) or one [Bq, Bk] block, both
  # far below one [Tq, Tk] score matrix.
  assert biggest <= max(t * dh, flash.DEFAULT_BLOCK_Q * flash.DEFAULT_BLOCK_K)
  assert biggest * 16 <= t * t
  # The check can fail: the einsum path does build [Tq, Tk].
  assert _largest_intermediate(jax.grad(loss("einsum"), (0, 1, 2)),
                               x, x, x) >= t * t


class FlashInMultiHeadTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_multi_head_attention_flash_matches_vmap(self):
    params = params_lib.init_mha_params(jax.random.PRNGKey(0), 16, 4,
                                        num_kv_heads=2, use_bias=True)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 11, 16))
    mask = masks.padding_mask(jnp.array([11, 6]), 11)
    run = lambda impl: self.variant(lambda p, x: multi_head.multi_head_attention(
        p, x, mask=mask, is_causal=True, implementation=impl))(params, x)
    np.testing.assert_allclose(run("flash"), run("vmap"), atol=1e-5)

  def test_unbatched_and_refusals(self):
    params = params_lib.init_mha_params(jax.random.PRNGKey(0), 8, 2)
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 8))
    mha = jax.jit(multi_head.multi_head_attention,
                  static_argnames="implementation")
    np.testing.assert_allclose(mha(params, x, implementation="flash"),
                               mha(params, x), atol=1e-5)
    with self.assertRaisesRegex(ValueError, "return_weights"):
      multi_head.multi_head_attention(params, x, implementation="flash",
                                      return_weights=True)
    with self.assertRaisesRegex(ValueError, "dropout"):
      multi_head.multi_head_attention(params, x, implementation="flash",
                                      dropout_rate=0.1,
                                      dropout_rng=jax.random.PRNGKey(2))
    with self.assertRaisesRegex(ValueError, "block_q"):
      flash.flash_attention(x[None, :, None], x[None, :, None],
                            x[None, :, None], block_q=0)


@pytest.mark.parametrize("tq,tk,heads,mask_kind,bias_kind,is_causal", [
    (6, 6, (4, 4), "none", "none", True),  # native top-left == bottom-right
    (5, 9, (4, 2), "full", "heads", True),  # Tq < Tk: explicit causal mask
    (9, 5, (4, 1), "padding", "keys", True),  # Tq > Tk: empty rows zeroed
    (7, 7, (2, 2), "padding", "none", False),  # whole empty sequences
])
def test_xla_matches_reference(tq, tk, heads, mask_kind, bias_kind, is_causal):
  q, k, v, mask, bias = _inputs(5, 3, tq, tk, *heads, 8, mask_kind, bias_kind)
  _, weights = attention.attend(q, k, v, mask=mask, bias=bias,
                                is_causal=is_causal, implementation="xla")
  assert weights is None
  run = lambda impl: _loss_and_grads(
      lambda q, k, v, bias: attention.attend(
          q, k, v, mask=mask, bias=bias, is_causal=is_causal,
          implementation=impl)[0], q, k, v, bias, jnp.ones_like(q))
  got, got_grads = run("xla")
  want, want_grads = run("vmap")
  _assert_tree_close(got, want, atol=1e-5)
  _assert_tree_close(got_grads, want_grads, atol=1e-4)


def test_xla_and_cudnn_refusals_name_the_problem():
  q = jnp.ones((1, 4, 2, 8))
  with pytest.raises(ValueError, match="Dv"):
    attention.attend(q, q, jnp.ones((1, 4, 2, 4)), implementation="xla")
  if jax.default_backend() != "gpu":
    with pytest.raises(ValueError, match="CUDA GPU"):
      attention.attend(q, q, q, implementation="cudnn")


def test_auto_picks_a_correct_path():
  q, k, v, mask, bias = _inputs(7, 2, 9, 12, 4, 2, 8, "full", "keys")
  assert attention.choose_implementation(q, k) == "flash"  # CPU, measured
  assert attention.choose_implementation(q, k, dropout=True) == "einsum"
  assert attention.choose_implementation(q, k, backend="gpu") == "xla"
  long_q = jax.ShapeDtypeStruct((1, 32768, 8, 64), jnp.float32)
  assert attention.choose_implementation(long_q, long_q,
                                         backend="gpu") == "flash"
  run = jax.jit(lambda q, k, v: attention.attend(
      q, k, v, mask=mask, bias=bias, is_causal=True,
      implementation="auto")[0])
  np.testing.assert_allclose(run(q, k, v),
                             _reference(q, k, v, mask, bias, True), atol=1e-5)
  # Dropout falls back to einsum: the same keep pattern, the same numbers.
  drop = lambda impl: attention.attend(
      q, k, v, implementation=impl, dropout_rate=0.3,
      dropout_rng=jax.random.PRNGKey(3))[0]
  np.testing.assert_allclose(drop("auto"), drop("einsum"), atol=1e-6)
