"""The five stages end to end: `multi_head_attention` on params and inputs.

Known answers (the source's worked example through the whole pipeline) and
hypothesis properties: permutation equivariance, causality (values and
exactly-zero gradients), head independence, the h = 1 special case, and
agreement of the vmap and einsum paths (MHA/GQA/MQA, biases, masks).
"""

import functools

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax.core import multi_head
from mha_jax.core import worked_example as wx

IMPLS = ("vmap", "einsum")
SETTINGS = hypothesis.settings(max_examples=20, deadline=None)
THREE_DECIMALS = dict(rtol=0, atol=5e-4)

_mha = jax.jit(mha_jax.multi_head_attention,
               static_argnames=("implementation", "is_causal",
                                "return_weights"))


class WorkedExampleTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_cat_through_the_five_stages(self):
    params, x = wx.params(), wx.inputs()
    for impl in IMPLS:
      mha = self.variant(lambda p, x, impl=impl: mha_jax.multi_head_attention(
          p, x, implementation=impl, return_weights=True))
      out, w = mha(params, x)  # unbatched [T, D] in, [T, D] out
      # W^O = I, so the output row of "cat" is the concatenation of heads.
      np.testing.assert_allclose(out[1], [1.000, 1.203, 0.822, 0.266],
                                 **THREE_DECIMALS)
      np.testing.assert_allclose(w[0, 1], [0.198, 0.401, 0.401],
                                 **THREE_DECIMALS)
      np.testing.assert_allclose(w[1, 1], [0.178, 0.734, 0.088],
                                 **THREE_DECIMALS)
      # FORMULAS.md rounds the concatenation to two decimals.
      np.testing.assert_allclose(out[1], [1.00, 1.20, 0.82, 0.27], atol=5e-3)

  def test_projection_of_the_toy_input_gives_the_formulas_matrices(self):
    q, k, v = mha_jax.project_qkv(wx.params(), wx.inputs()[None])
    # [1, T, H, Dh] -> [H, T, Dh], the layout FORMULAS.md writes.
    for got, want in ((q, wx.Q), (k, wx.K), (v, wx.V)):
      np.testing.assert_array_equal(jnp.transpose(got[0], (1, 0, 2)), want)


# ---------------------------------------------------------------------------
# Random layers. (B, Tq, Tk, D, H, K): MHA, GQA, MQA, cross-attention.
# (h = 1 has its own test below.) Few shapes: compile once, vary values.
SHAPES = [(2, 4, 4, 8, 2, 2), (1, 3, 5, 8, 4, 2), (2, 5, 2, 6, 3, 1)]


def _normal(shape, seed, scale=1.0):
  # numpy, not jax.random: eager jax.random compiles anew for every shape.
  rng = np.random.default_rng(seed)
  return jnp.asarray(scale * rng.normal(size=shape), jnp.float32)


def _random_params(d, h, kh, *, use_bias=False, seed=0):
  """Params with the layout of init_mha_params, including non-zero biases."""
  dh = d // h
  shapes = {"w_q": (d, h, dh), "w_k": (d, kh, dh), "w_v": (d, kh, dh),
            "w_o": (h, dh, d)}
  if use_bias:
    shapes.update(b_q=(h, dh), b_k=(kh, dh), b_v=(kh, dh), b_o=(d,))
  return {n: _normal(s, seed + i, s[0] ** -0.5)
          for i, (n, s) in enumerate(shapes.items())}


@st.composite
def layers(draw, *, cross=True, bias=False):
  b, tq, tk, d, h, kh = draw(st.sampled_from(SHAPES))
  tk = tk if cross else tq
  use_bias = bias  # with non-zero biases on every projection
  seed = draw(st.integers(0, 2**31))
  params = _random_params(d, h, kh, use_bias=use_bias, seed=seed)
  rng = np.random.default_rng(seed + 1)
  x_q = jnp.asarray(rng.normal(size=(b, tq, d)), jnp.float32)
  x_kv = (jnp.asarray(rng.normal(size=(b, tk, d)), jnp.float32) if cross
          else None)
  return params, x_q, x_kv


@SETTINGS
@hypothesis.given(layers(cross=False), st.sampled_from(IMPLS), st.data())
def test_self_attention_is_permutation_equivariant(layer, impl, data):
  params, x, _ = layer
  perm = np.array(data.draw(st.permutations(range(x.shape[1]))))
  out = _mha(params, x, implementation=impl)
  out_perm = _mha(params, x[:, perm], implementation=impl)
  np.testing.assert_allclose(out_perm, out[:, perm], rtol=1e-5, atol=1e-6)


@functools.partial(jax.jit, static_argnames=("impl", "is_causal"))
@jax.grad
def _grad_of_output_at(x, params, t, mask, *, impl, is_causal):
  """d sum(out[:, t]) / dx, for a traced position t."""
  out = mha_jax.multi_head_attention(params, x, mask=mask,
                                     is_causal=is_causal, implementation=impl)
  return jnp.sum(out[:, t])


@SETTINGS
@hypothesis.given(layers(cross=False), st.sampled_from(IMPLS), st.data())
def test_causal_output_ignores_the_future(layer, impl, data):
  params, x, _ = layer
  t = data.draw(st.integers(0, x.shape[1] - 1))
  # Changing every token after t leaves outputs 0..t unchanged.
  x2 = np.array(x)
  x2[:, t + 1:] = x2[:, t + 1:] * -3.0 + 1.0
  out = _mha(params, x, implementation=impl, is_causal=True)
  out2 = _mha(params, x2, implementation=impl, is_causal=True)
  np.testing.assert_array_equal(out[:, :t + 1], out2[:, :t + 1])
  # ... and their gradient to every later token is exactly zero.
  grad = _grad_of_output_at(x, params, t, None, impl=impl, is_causal=True)
  np.testing.assert_array_equal(grad[:, t + 1:], 0.0)
  assert bool(jnp.any(grad[:, :t + 1] != 0.0))


@pytest.mark.parametrize("impl", IMPLS)
def test_causal_mask_array_and_is_causal_are_the_same_rule(impl):
  params = _random_params(8, 2, 2)
  x = _normal((2, 4, 8), 5)
  by_flag = _mha(params, x, is_causal=True, implementation=impl)
  by_mask = _mha(params, x, mask=mha_jax.causal_mask(4), implementation=impl)
  np.testing.assert_allclose(by_flag, by_mask, rtol=1e-6, atol=1e-7)
  # The gradient from position 1 to positions 2, 3 is zero with the mask too.
  grad = _grad_of_output_at(x, params, 1, mha_jax.causal_mask(4), impl=impl,
                            is_causal=False)
  np.testing.assert_array_equal(grad[:, 2:], 0.0)


@functools.partial(jax.jit, static_argnames="impl")
def _head_outputs(params, x, impl):
  q, k, v = mha_jax.project_qkv(params, x)
  return mha_jax.attend(q, k, v, implementation=impl)  # [B,Tq,H,Dv], weights


@SETTINGS
@hypothesis.given(layers(), st.sampled_from(IMPLS), st.data())
def test_perturbing_one_query_head_changes_only_that_head(layer, impl, data):
  params, x_q, _ = layer
  h = params["w_q"].shape[1]
  i = data.draw(st.integers(0, h - 1))
  w_q = np.array(params["w_q"])
  w_q[:, i] += 0.5  # head i's disjoint column slice of W^Q
  out, w = _head_outputs(params, x_q, impl=impl)
  out2, w2 = _head_outputs(dict(params, w_q=w_q), x_q, impl=impl)
  others = np.arange(h) != i
  np.testing.assert_array_equal(out[:, :, others], out2[:, :, others])
  np.testing.assert_array_equal(w[:, others], w2[:, others])
  # Every shape has Tk >= 2, so head i's softmax really moves.
  assert not np.allclose(w[:, i], w2[:, i])
  assert not np.allclose(out[:, :, i], out2[:, :, i])


@pytest.mark.parametrize("impl", IMPLS)
def test_one_head_with_identity_w_o_is_single_head_attention(impl):
  d = 6
  params = {n: _normal((d, 1, d), seed) for seed, n in
            enumerate(("w_q", "w_k", "w_v"))}
  params["w_o"] = jnp.eye(d)[None]  # [H=1, Dv=D, D]
  x = _normal((5, d), 3)  # unbatched [T, D]
  out = mha_jax.multi_head_attention(params, x, implementation=impl)
  q, k, v = (x @ params[n][:, 0] for n in ("w_q", "w_k", "w_v"))
  ref, _ = mha_jax.scaled_dot_product_attention(q, k, v)
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


@st.composite
def options(draw):
  params, x_q, x_kv = draw(layers(bias=True))
  b, tq = x_q.shape[:2]
  tk = x_kv.shape[1]
  lengths = np.array(draw(st.lists(st.integers(1, tk), min_size=b,
                                   max_size=b)))
  mask = draw(st.sampled_from([None, "padding"]))
  mask = None if mask is None else mha_jax.padding_mask(lengths, tk)
  return params, x_q, x_kv, mask, draw(st.booleans())


@functools.partial(jax.jit, static_argnames="is_causal")
def _both_paths(params, x_q, x_kv, mask, *, is_causal):
  """Both implementations in one compilation (hypothesis varies values)."""
  return [mha_jax.multi_head_attention(
      params, x_q, x_kv, mask=mask, is_causal=is_causal, implementation=impl,
      return_weights=True) for impl in IMPLS]


@SETTINGS
@hypothesis.given(options())
def test_vmap_and_einsum_paths_agree(case):
  params, x_q, x_kv, mask, is_causal = case
  (out_a, w_a), (out_b, w_b) = _both_paths(params, x_q, x_kv, mask,
                                           is_causal=is_causal)
  np.testing.assert_allclose(out_a, out_b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w_a, w_b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
def test_return_weights_does_not_change_the_output(impl):
  params = _random_params(8, 4, 2)
  x = _normal((2, 5, 8), 9)
  out = _mha(params, x, is_causal=True, implementation=impl)
  out_w, w = _mha(params, x, is_causal=True, implementation=impl,
                  return_weights=True)
  np.testing.assert_array_equal(out, out_w)  # bit-identical
  assert w.shape == (2, 4, 5, 5)


def test_works_under_vmap_and_matches_the_batched_call():
  params = _random_params(8, 2, 2)
  x = _normal((3, 4, 8), 9)
  per_example = jax.jit(jax.vmap(
      lambda x: mha_jax.multi_head_attention(params, x, is_causal=True)))
  np.testing.assert_allclose(per_example(x),
                             _mha(params, x, is_causal=True),
                             rtol=1e-6, atol=1e-7)


def test_attention_layer_is_bidirectional_unless_asked():
  """Without a causal spec, the one attention path looks both ways: the
  first token's output changes when the last token does."""
  params = mha_jax.init_mha_params(jax.random.PRNGKey(0), 8, 2)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 5, 8))
  y = multi_head.attention_layer(params, x)[0]
  y2 = multi_head.attention_layer(params, x.at[:, -1].add(1.0))[0]
  assert float(jnp.max(jnp.abs(y2[:, 0] - y[:, 0]))) > 1e-3
  causal = mha_jax.AttentionSpec.of_params(params, causal=True)
  y3 = multi_head.attention_layer(params, x.at[:, -1].add(1.0),
                                  spec=causal)[0]
  y4 = multi_head.attention_layer(params, x, spec=causal)[0]
  np.testing.assert_array_equal(y3[:, 0], y4[:, 0])
