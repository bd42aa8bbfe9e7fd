"""MultiHeadAttention (NNX) against the pure core and an independent RoPE."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx

import mha_jax
from mha_jax.models import modules

D, H = 16, 4


def _x(seed, b=2, t=5, d=D):
  return jax.random.normal(jax.random.key(seed), (b, t, d), jnp.float32)


def _module(*, dtype=None, param_dtype=jnp.float32, **spec):
  """A module of width D with H heads; `spec`: the rest of its spec."""
  return modules.MultiHeadAttention(
      mha_jax.AttentionSpec(D, H, **spec), dtype=dtype,
      param_dtype=param_dtype, rngs=nnx.Rngs(params=0))


def _weights(m, x, **kw):
  """`(y, pattern)`: the module's output and its captured weights."""
  hooks = mha_jax.Hooks(capture=("pattern",))
  y, _ = m(x, hooks=hooks, **kw)
  return y, hooks.read("pattern")


class ModuleMatchesCoreTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ("mha", dict()), ("gqa_bias", dict(num_kv_heads=2, use_bias=True)),
      ("mqa_einsum_wide", dict(num_kv_heads=1, head_dim=6,
                               implementation="einsum")))
  def test_output_equals_pure_function(self, kw):
    m = _module(**kw)
    params = m.core_params()
    x, ctx = _x(1), _x(2, t=7)
    mask = jax.random.bernoulli(jax.random.key(3), 0.7, (2, 1, 5, 7))
    head_mask = jnp.array([1.0, 0.0, 0.5, 2.0])
    impl = kw.get("implementation", "vmap")

    @self.variant
    def both(x, ctx):
      got, _ = m(x, ctx, mask=mask, head_mask=head_mask)
      want = mha_jax.multi_head_attention(
          params, x, ctx, mask=mask, head_mask=head_mask,
          implementation=impl)
      return got, want

    got, want = both(x, ctx)
    np.testing.assert_array_equal(got, want)

  def test_params_have_core_layout(self):
    m = _module(num_kv_heads=2, use_bias=True)
    want = mha_jax.init_mha_params(jax.random.key(0), D, H, num_kv_heads=2,
                                   use_bias=True)
    got = m.core_params()
    self.assertEqual(sorted(got), sorted(want))
    for name in want:
      self.assertEqual(got[name].shape, want[name].shape, name)
      self.assertIsInstance(getattr(m, name), nnx.Param)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(False, True)
  def test_capturing_weights_changes_nothing(self, rotary):
    m = _module(num_kv_heads=2, causal=True,
                rotary_base=10000.0 if rotary else None)
    x = _x(4)

    @self.variant
    def run(x):
      plain, _ = m(x)
      y, w = _weights(m, x)
      return plain, y, w

    plain, y, w = run(x)
    np.testing.assert_array_equal(plain, y)  # bit-identical
    if not rotary:
      _, want_w = mha_jax.multi_head_attention(
          m.core_params(), x, is_causal=True, return_weights=True)
      np.testing.assert_array_equal(w, want_w)
    self.assertEqual(w.shape, (2, H, 5, 5))
    np.testing.assert_allclose(jnp.sum(w, -1), 1.0, rtol=1e-6)


def _rope_complex(x, positions, base=10000.0):
  """Independent RoPE: pairs (i, i + Dh/2) as complex numbers, times e^ipw."""
  half = x.shape[-1] // 2
  z = x[..., :half] + 1j * x[..., half:]
  w = base ** (-np.arange(half) * 2.0 / x.shape[-1])
  z = z * np.exp(1j * positions[..., None, None] * w)  # [B, T, H, Dh/2]
  return np.concatenate([z.real, z.imag], axis=-1)


def _reference_rotary_attention(params, x, positions):
  """Causal self-attention with RoPE, in NumPy float64, no mha_jax code."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  x = np.asarray(x, np.float64)
  q = np.einsum("btd,dhe->bthe", x, p["w_q"])
  k = np.einsum("btd,dhe->bthe", x, p["w_k"])
  v = np.einsum("btd,dhe->bthe", x, p["w_v"])
  q, k = _rope_complex(q, positions), _rope_complex(k, positions)
  s = np.einsum("bqhe,bkhe->bhqk", q, k) / np.sqrt(q.shape[-1])
  t = x.shape[1]
  s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
  a = np.exp(s - s.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  o = np.einsum("bhqk,bkhe->bqhe", a, v)
  return np.einsum("bqhe,hed->bqd", o, p["w_o"])


class RotaryTest(parameterized.TestCase):

  def test_matches_independent_reference(self):
    m = _module(rotary_base=10000.0, causal=True)
    x = _x(5, t=6)
    positions = np.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    got, _ = m(x, positions=jnp.asarray(positions))
    want = _reference_rotary_attention(m.core_params(), x, positions)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  def test_weights_depend_only_on_relative_offset(self):
    m = _module(rotary_base=10000.0, causal=True)
    x = _x(6, b=1, t=6)
    pos = jnp.arange(6)[None]
    _, w0 = _weights(m, x, positions=pos)
    _, w1 = _weights(m, x, positions=pos + 37)
    np.testing.assert_allclose(w0, w1, atol=1e-5)


class OptionsTest(parameterized.TestCase):

  def test_dropout_only_when_not_deterministic(self):
    m = _module(dropout_rate=0.5)
    x = _x(7)
    key = jax.random.key(0)
    base, _ = m(x)
    np.testing.assert_array_equal(m(x, rngs=key)[0], base)
    dropped, _ = m(x, deterministic=False, rngs=key)
    self.assertGreater(float(jnp.max(jnp.abs(dropped - base))), 1e-3)
    with pytest.raises(ValueError, match="needs `rngs`"):
      m(x, deterministic=False)

  def test_dropout_from_rngs_as_nnx_dropout_takes_them(self):
    # An nnx.Rngs gives its dropout stream's next key (its default stream
    # without one), a stream its own next key, a key itself: as
    # nnx.Dropout, so the three routes drop the same entries.
    m = _module(dropout_rate=0.5)
    x = _x(7)
    key = nnx.Rngs(dropout=3).dropout()
    want, _ = m(x, deterministic=False, rngs=key)
    for rngs in (nnx.Rngs(dropout=3), nnx.Rngs(3), nnx.Rngs(3).default):
      got, _ = m(x, deterministic=False, rngs=rngs)
      np.testing.assert_array_equal(got, want)
    # A stream advances by one draw per dropping call, not when
    # deterministic, so a second call drops other entries.
    rngs = nnx.Rngs(dropout=3)
    m(x, rngs=rngs)
    first, _ = m(x, deterministic=False, rngs=rngs)
    second, _ = m(x, deterministic=False, rngs=rngs)
    np.testing.assert_array_equal(first, want)
    self.assertGreater(float(jnp.max(jnp.abs(second - first))), 1e-3)

  def test_compute_and_param_dtypes(self):
    m = _module(dtype=jnp.bfloat16, param_dtype=jnp.float32)
    self.assertEqual(m.w_q[...].dtype, jnp.float32)
    y, w = _weights(m, _x(8))
    self.assertEqual(y.dtype, jnp.bfloat16)
    ref = mha_jax.multi_head_attention(
        {k: v.astype(jnp.float32) for k, v in m.core_params().items()},
        _x(8).astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(y.astype(jnp.float32), ref, atol=0.05)
    self.assertEqual(w.shape, (2, H, 5, 5))

  def test_bad_options_name_the_argument(self):
    with pytest.raises(ValueError, match="implementation"):
      _module(implementation="flash9")
    with pytest.raises(ValueError, match="dropout_rate"):
      _module(dropout_rate=1.0)
    with pytest.raises(ValueError, match="head_dim"):
      _module(head_dim=5, rotary_base=10000.0)
