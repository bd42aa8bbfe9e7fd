"""Agreement with independent implementations on the same weights.

`jax.nn.dot_product_attention` for stage 3, `flax.linen` and `flax.nnx`
attention layers (through `mha_jax.core.converters`) for the whole layer. All in
float32; the relative error ||ours - theirs|| / ||theirs|| is compared on
the query rows that are not fully masked (there the libraries differ on
purpose: mha_jax returns 0, others NaN or the mean of V).
"""

import functools

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax

IMPLS = ("vmap", "einsum")
REL_TOL = 1e-5


def _normal(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape),
                     jnp.float32)


def _assert_rel_close(ours, theirs, live_rows=None):
  """||ours - theirs|| / ||theirs|| < REL_TOL over rows where live_rows."""
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  if live_rows is not None:  # [B, Tq] or [B, Tq, H]: keep rows that see a key
    live = np.broadcast_to(live_rows.reshape(live_rows.shape +
                                             (1,) * (ours.ndim -
                                                     live_rows.ndim)),
                           ours.shape)
    ours, theirs = ours[live], theirs[live]
  err = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
  assert err < REL_TOL, f"relative error {err:.2e} >= {REL_TOL}"


# ---------------------------------------------------------------------------
# Stage 3 against jax.nn.dot_product_attention (q [B,T,N,H] layout = ours).

# (B, Tq, Tk, H, K, Dh): multi-head, grouped-query, multi-query.
NN_SHAPES = [(2, 5, 5, 4, 4, 8), (2, 5, 5, 4, 2, 8), (1, 6, 6, 4, 1, 4),
             (2, 3, 7, 6, 2, 4)]


def _qkv(b, tq, tk, h, kh, dh, seed=0):
  return (_normal((b, tq, h, dh), seed), _normal((b, tk, kh, dh), seed + 1),
          _normal((b, tk, kh, dh), seed + 2))


@functools.partial(jax.jit, static_argnames=("impl", "is_causal"))
def _ours(q, k, v, mask, bias, *, impl, is_causal):
  return mha_jax.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                        implementation=impl)[0]


@functools.partial(jax.jit, static_argnames=("is_causal",))
def _jax_nn(q, k, v, mask, bias, *, is_causal):
  return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask,
                                      is_causal=is_causal,
                                      implementation="xla")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", NN_SHAPES)
def test_jax_nn_unmasked_with_bias(shape, impl):
  q, k, v = _qkv(*shape)
  b, tq, tk, h = shape[:4]
  bias = _normal((b, h, tq, tk), 7)
  _assert_rel_close(_ours(q, k, v, None, bias, impl=impl, is_causal=False),
                    _jax_nn(q, k, v, None, bias, is_causal=False))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [s for s in NN_SHAPES if s[1] == s[2]])
def test_jax_nn_is_causal_when_lengths_match(shape, impl):
  # jax.nn aligns is_causal top-left, mha_jax bottom-right: equal for Tq == Tk.
  q, k, v = _qkv(*shape)
  _assert_rel_close(_ours(q, k, v, None, None, impl=impl, is_causal=True),
                    _jax_nn(q, k, v, None, None, is_causal=True))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tq,tk", [(3, 7), (6, 4)])
def test_jax_nn_causal_cross_lengths_and_padding_via_explicit_mask(
    tq, tk, impl):
  b, h, kh, dh = 2, 6, 2, 4
  q, k, v = _qkv(b, tq, tk, h, kh, dh, seed=3)
  lengths = jnp.array([tk, 2])
  # Ours builds the bottom-right causal rule itself; jax.nn gets it spelled
  # out together with the padding mask.
  padding = mha_jax.padding_mask(lengths, tk)  # [B, 1, 1, Tk]
  explicit = jnp.broadcast_to(
      mha_jax.combine_masks(padding, mha_jax.causal_mask(tq, tk)),
      (b, h, tq, tk))
  ours = _ours(q, k, v, padding, None, impl=impl, is_causal=True)
  theirs = _jax_nn(q, k, v, explicit, None, is_causal=False)
  live = np.asarray(explicit.any(-1)).transpose(0, 2, 1)  # [B, Tq, H]
  # With Tq > Tk the first queries sit before key 0: empty rows.
  assert live.all() == (tq <= tk)
  _assert_rel_close(ours, theirs, live)
  np.testing.assert_array_equal(np.asarray(ours)[~live], 0.0)


# ---------------------------------------------------------------------------
# Whole layers: flax.linen and flax.nnx through the converters.


_mha = jax.jit(mha_jax.multi_head_attention,
               static_argnames=("implementation", "is_causal"))


@pytest.mark.parametrize("use_bias", [False, True])
def test_flax_linen_multi_head_dot_product_attention(use_bias):
  b, tq, tk, d, h = 2, 4, 6, 12, 3
  layer = nn.MultiHeadDotProductAttention(
      num_heads=h, use_bias=use_bias,
      bias_init=nn.initializers.normal(0.1))  # non-zero biases
  x_q, x_kv = _normal((b, tq, d), 0), _normal((b, tk, d), 1)
  variables = jax.jit(layer.init)(jax.random.key(0), x_q, x_kv)
  mask = mha_jax.padding_mask(jnp.array([6, 3]), tk)  # [B, 1, 1, Tk]
  theirs = jax.jit(layer.apply)(variables, x_q, x_kv, mask=mask)
  params = mha_jax.from_linen_mha(variables)
  assert ("b_q" in params) == use_bias
  for impl in IMPLS:
    _assert_rel_close(_mha(params, x_q, x_kv, mask=mask, implementation=impl),
                      theirs)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_flax_nnx_multi_head_attention(num_kv_heads):
  b, t, d, h = 2, 5, 16, 4
  layer = nnx.MultiHeadAttention(
      num_heads=h, in_features=d, num_kv_heads=num_kv_heads, decode=False,
      bias_init=nnx.initializers.normal(0.1), rngs=nnx.Rngs(0))
  x = _normal((b, t, d), 2)
  causal = mha_jax.causal_mask(t)[None, None]  # [1, 1, T, T]
  theirs = nnx.jit(lambda m, x, mask: m(x, mask=mask))(
      layer, x, jnp.broadcast_to(causal, (b, h, t, t)))
  for source in (layer, nnx.state(layer)):
    params = mha_jax.from_nnx_mha(source)
    assert params["w_k"].shape[1] == num_kv_heads
    for impl in IMPLS:
      _assert_rel_close(_mha(params, x, is_causal=True, implementation=impl),
                        theirs)


def test_converters_refuse_what_mha_jax_does_not_model():
  layer = nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False,
                                 normalize_qk=True, rngs=nnx.Rngs(0))
  # QK-norm converts (tests/core/test_score_rules.py checks the numbers); a
  # norm with a bias is not Flax's and is refused.
  for source in (layer, nnx.state(layer)):
    assert mha_jax.from_nnx_mha(source)["q_norm"].shape == (4,)
  tree = nnx.to_pure_dict(nnx.state(layer))
  tree["query_ln"]["bias"] = jnp.zeros(4)
  with pytest.raises(ValueError, match="query_ln.*only a `scale`"):
    mha_jax.from_nnx_mha(tree)
  wide = nn.MultiHeadDotProductAttention(num_heads=2, out_features=6)
  variables = wide.init(jax.random.key(0), jnp.ones((1, 3, 4)))
  with pytest.raises(ValueError, match="output widths must all equal d_model"):
    mha_jax.from_linen_mha(variables)
