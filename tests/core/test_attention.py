"""Stage 3: scaled dot-product attention for one head and for all heads.

Known answers (the source's worked example), a float64 NumPy reference,
hypothesis properties, the fully-masked-row policy and the float32-softmax
dtype policy (bf16 on every implementation in `attention.IMPLEMENTATIONS`
that runs on CPU).
"""

import functools

import chex
import hypothesis
from hypothesis import strategies as st
import jax
from jax.test_util import check_grads
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core import reference
from mha_jax.core import softmax
from mha_jax import hooks as hooks_lib
from mha_jax.core import worked_example as wx
from tests import jaxprs

IMPLS = ("vmap", "einsum")
SETTINGS = hypothesis.settings(max_examples=20, deadline=None)

# FORMULAS.md, query "cat" (row 1): scores, weights, output for each head.
CAT_SCORES = [[0.0, 0.707, 0.707], [0.0, 1.414, -0.707]]
CAT_WEIGHTS = [[0.198, 0.401, 0.401], [0.178, 0.734, 0.088]]
CAT_OUTPUT = [[1.000, 1.203], [0.822, 0.266]]
THREE_DECIMALS = dict(rtol=0, atol=5e-4)


class WorkedExampleTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_cat_row_of_each_head(self):
    sdpa = self.variant(reference.scaled_dot_product_attention)
    for h in range(2):
      out, w = sdpa(wx.Q[h], wx.K[h], wx.V[h])
      np.testing.assert_allclose(w[1], CAT_WEIGHTS[h], **THREE_DECIMALS)
      np.testing.assert_allclose(out[1], CAT_OUTPUT[h], **THREE_DECIMALS)
      # The softmax fixes scores up to a constant; "The" scores 0 in both
      # heads, so log(w_j / w_The) recovers the scaled scores themselves.
      scores = jnp.log(w[1] / w[1, 0])
      np.testing.assert_allclose(scores, CAT_SCORES[h], **THREE_DECIMALS)


# ---------------------------------------------------------------------------
# Random all-head inputs for the properties.


# (B, Tq, Tk, K, G, Dh, Dv): multi-head, grouped-query, multi-query, a single
# query against a longer cache, and Tq > Tk. Few shapes, so that the jitted
# functions below compile once per shape and hypothesis spends its examples
# on values, masks and options rather than on recompiling.
SHAPES = [(2, 4, 4, 3, 1, 2, 3), (1, 3, 5, 2, 2, 4, 2), (2, 1, 6, 1, 4, 2, 2),
          (1, 5, 3, 2, 3, 1, 1)]

_attend = jax.jit(attention.attend,
                  static_argnames=("implementation", "is_causal"))


@st.composite
def attend_inputs(draw, *, masked=False):
  """q [B,Tq,H,Dh], k [B,Tk,K,Dh], v [B,Tk,K,Dv] (+ mask, no empty row)."""
  b, tq, tk, kh, g, dh, dv = draw(st.sampled_from(SHAPES))
  rng = np.random.default_rng(draw(st.integers(0, 2**31)))
  q = rng.normal(size=(b, tq, kh * g, dh)).astype(np.float32)
  k = rng.normal(size=(b, tk, kh, dh)).astype(np.float32)
  v = rng.normal(size=(b, tk, kh, dv)).astype(np.float32)
  if not masked:
    return q, k, v
  mask = rng.random((b, kh * g, tq, tk)) < 0.6
  mask[..., rng.integers(tk)] = True  # every row keeps at least one key
  return q, k, v, mask


@SETTINGS
@hypothesis.given(attend_inputs(), st.sampled_from(IMPLS))
def test_unmasked_weight_rows_sum_to_one(inputs, impl):
  _, w = _attend(*inputs, implementation=impl)
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
  assert bool(jnp.all(w > 0))


@SETTINGS
@hypothesis.given(attend_inputs(masked=True), st.sampled_from(IMPLS))
def test_masked_keys_are_ignored(inputs, impl):
  q, k, v, mask = inputs
  out, w = _attend(q, k, v, mask=mask, implementation=impl)
  assert bool(jnp.all(jnp.where(mask, True, w == 0.0)))  # exactly zero
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
  # Keys masked for EVERY query of every head can be replaced by anything.
  dead = ~mask.any(axis=(1, 2))  # [B, Tk]
  junk = 1e3 * np.ones_like(k)
  k2 = np.where(dead[:, :, None, None], junk, k)
  v2 = np.where(dead[:, :, None, None], -junk[..., :1], v)
  out2, _ = _attend(q, k2, v2, mask=mask, implementation=impl)
  np.testing.assert_array_equal(out, out2)


def _numpy_attention(q, k, v, mask):
  """Independent float64 reference: per head, scores -> -inf where masked
  -> softmax over the allowed keys only (empty rows 0) -> weights @ V."""
  b, tq, h, dh = q.shape
  g = h // k.shape[2]
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  weights = np.zeros((b, h, tq, k.shape[1]))
  out = np.zeros((b, tq, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      s = q[bi, :, hi] @ k[bi, :, hi // g].T / np.sqrt(dh)  # [Tq, Tk]
      s = np.where(mask[bi, hi], s, -np.inf)
      for t in range(tq):
        if np.isfinite(s[t]).any():
          e = np.exp(s[t] - s[t].max())
          weights[bi, hi, t] = e / e.sum()
      out[bi, :, hi] = weights[bi, hi] @ v[bi, :, hi // g]
  return out, weights


@SETTINGS
@hypothesis.given(attend_inputs(masked=True), st.sampled_from(IMPLS))
def test_masked_weights_and_outputs_match_a_float64_numpy_reference(inputs,
                                                                   impl):
  """The mask acts before the softmax: the weights are the softmax over the
  allowed keys alone (a mask applied after the softmax would leave rows
  summing to less than 1, and fail here)."""
  q, k, v, mask = inputs
  out, w = _attend(q, k, v, mask=mask, implementation=impl)
  want_out, want_w = _numpy_attention(q, k, v, mask)
  np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_row_gives_zero_output_weights_and_finite_grads(impl):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(2, 3, 4, 2)).astype(np.float32)
  k = rng.normal(size=(2, 5, 2, 2)).astype(np.float32)
  v = rng.normal(size=(2, 5, 2, 3)).astype(np.float32)
  mask = np.ones((2, 4, 3, 5), bool)
  mask[0, 1, 2] = False  # batch 0, head 1, query 2 sees nothing
  mask[1, :, 0] = False  # batch 1, query 0 sees nothing in any head

  def loss(q, k, v):
    out, w = attention.attend(q, k, v, mask=mask, implementation=impl)
    return jnp.sum(out ** 2) + jnp.sum(w ** 2), (out, w)

  grads, (out, w) = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(
      q, k, v)
  np.testing.assert_array_equal(w[0, 1, 2], 0.0)
  np.testing.assert_array_equal(out[0, 2, 1], 0.0)
  np.testing.assert_array_equal(w[1, :, 0], 0.0)
  np.testing.assert_array_equal(out[1, 0], 0.0)
  for g in grads:
    assert bool(jnp.all(jnp.isfinite(g)))
  # An empty query row receives no gradient at all.
  np.testing.assert_array_equal(grads[0][1, 0], 0.0)
  # Rows that are not empty are untouched by the policy.
  np.testing.assert_allclose(w[0, 0].sum(-1), 1.0, rtol=1e-6)


def test_single_head_fully_masked_row():
  q = k = v = jnp.ones((2, 2))
  mask = jnp.array([[True, True], [False, False]])
  out, w = reference.scaled_dot_product_attention(q, k, v, mask=mask)
  np.testing.assert_array_equal(out[1], 0.0)
  np.testing.assert_array_equal(w[1], 0.0)
  np.testing.assert_allclose(w[0], [0.5, 0.5])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs_keep_softmax_in_float32(impl, dtype):
  # Logits 1e4/sqrt(2) and (1e4 - 1)/sqrt(2): at that magnitude bf16 and f16
  # cannot tell them apart (spacing 32 and 4), float32 can. A softmax in the
  # input dtype would give [0.5, 0.5] or [1, 0]; float32 gives the true split.
  q = jnp.array([100.0, 1.0], dtype).reshape(1, 1, 1, 2)
  k = jnp.array([[100.0, 0.0], [100.0, -1.0]], dtype).reshape(1, 2, 1, 2)
  v = jnp.array([[1.0], [0.0]], dtype).reshape(1, 2, 1, 1)
  out, w = attention.attend(q, k, v, implementation=impl)
  gap = 1.0 / np.sqrt(2.0)
  expected = np.array([1.0, np.exp(-gap)]) / (1.0 + np.exp(-gap))
  # The returned pattern is the float32 softmax itself (the `pattern` hook
  # site); only the weighted sum is cast back to the input dtype.
  assert w.dtype == jnp.float32 and out.dtype == dtype
  assert bool(jnp.all(jnp.isfinite(w))) and bool(jnp.all(jnp.isfinite(out)))
  # float32 rounds each ~7071-sized logit to half an ulp (2.4e-4), so the
  # gap is off by at most 4.9e-4 and the split by p (1 - p) times that.
  np.testing.assert_allclose(np.asarray(w).ravel(), expected, atol=1.1e-4)
  tol = 2.0 ** -7  # one rounding of the result to bf16/f16
  np.testing.assert_allclose(float(out.ravel()[0]), expected[0], atol=tol)
  # The scores are 1e4-sized, the softmax of them stays finite with masks too.
  _, w_masked = attention.attend(q, k, v, mask=jnp.array([False, True]),
                                 implementation=impl)
  np.testing.assert_array_equal(np.asarray(w_masked, np.float32).ravel(),
                                [0.0, 1.0])


BF16_U = 2.0 ** -8  # bf16 rounding to nearest: 8 significant bits


def _attend_and_vjp(impl, mask, bias, is_causal=True):
  """A jitted `(q, k, v, ct) -> (out, (dq, dk, dv))` for one path."""
  def f(q, k, v, ct):
    out, vjp = jax.vjp(lambda q, k, v: attention.attend(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal,
        implementation=impl)[0], q, k, v)
    return out, vjp(ct.astype(out.dtype))
  return jax.jit(f)


@pytest.fixture(scope="module")
def bf16_case():
  """bf16 q, k, v (GQA, causal, a padding-like mask, a float32 bias), and
  the float32 reference on the same bf16 values, computed once."""
  rng = np.random.default_rng(0)
  b, tq, tk, h, kh, dh = 2, 16, 16, 4, 2, 8
  normal = lambda *s: jnp.asarray(rng.normal(size=s), jnp.bfloat16)
  q, k, v = normal(b, tq, h, dh), normal(b, tk, kh, dh), normal(b, tk, kh, dh)
  mask = jnp.asarray(rng.random((b, 1, tq, tk)) < 0.7)
  bias = jnp.asarray(rng.normal(size=(1, h, tq, tk)), jnp.float32)
  ct = normal(b, tq, h, dh)
  f32 = lambda x: x.astype(jnp.float32)
  ref = _attend_and_vjp("vmap", mask, bias)
  want, want_grads = ref(f32(q), f32(k), f32(v), f32(ct))
  scale, _ = ref(f32(q), f32(k), jnp.abs(f32(v)), f32(ct))
  return (q, k, v, ct, mask, bias), (want, want_grads, scale)


@pytest.mark.parametrize("impl", ["vmap", "einsum", "flash", "xla", "auto"])
def test_bf16_every_path_within_two_roundings_of_float32(impl, bf16_case):
  """The policy rounds to bf16 only the probabilities that multiply V (u =
  2**-8 relative each) and each result once (u): every output element is
  within 2 u of sum_j p_ij |v_j| (the float32 reference on |v|), and every
  gradient within 2 u in norm relative to float32 (measured 0.5 to 0.8 u
  on every path). A path that took the softmax or an accumulator into
  bf16 would not be.
  """
  (q, k, v, ct, mask, bias), (want, want_grads, scale) = bf16_case
  out, grads = _attend_and_vjp(impl, mask, bias)(q, k, v, ct)
  assert out.dtype == jnp.bfloat16
  assert all(g.dtype == jnp.bfloat16 for g in grads)
  err = np.abs(np.asarray(out, np.float32) - np.asarray(want))
  assert np.all(err <= 2 * BF16_U * np.asarray(scale)), err.max()
  for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads, strict=True):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    rel = np.linalg.norm(g - w) / np.linalg.norm(w)
    assert rel <= 2 * BF16_U, (name, rel / BF16_U)


# ---------------------------------------------------------------------------
# The two implementations agree on everything attend accepts.


@st.composite
def attend_options(draw):
  q, k, v, mask = draw(attend_inputs(masked=True))
  b, tq, h, _ = q.shape
  tk = k.shape[1]
  rng = np.random.default_rng(draw(st.integers(0, 2**31)))
  mask_shape = draw(st.sampled_from(
      [None, (b, h, tq, tk), (b, 1, 1, tk), (1, h, tq, tk), (tq, tk)]))
  use_mask = None if mask_shape is None else mask[tuple(
      slice(0, 1) if s == 1 else slice(None) for s in
      (1,) * (4 - len(mask_shape)) + mask_shape)].reshape(mask_shape)
  bias_shape = draw(st.sampled_from([None, (b, h, tq, tk), (1, 1, tq, tk)]))
  bias = (None if bias_shape is None else
          rng.normal(size=bias_shape).astype(np.float32))
  return q, k, v, use_mask, bias, draw(st.booleans())


@SETTINGS
@hypothesis.given(attend_options())
def test_vmap_and_einsum_agree(case):
  q, k, v, mask, bias, is_causal = case
  results = [_attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                     implementation=impl) for impl in IMPLS]
  (out_a, w_a), (out_b, w_b) = results
  np.testing.assert_allclose(out_a, out_b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w_a, w_b, rtol=1e-5, atol=1e-7)


def test_dropout_keep_pattern_is_shared_by_implementations():
  rng = np.random.default_rng(1)
  q = rng.normal(size=(2, 3, 4, 2)).astype(np.float32)
  k = rng.normal(size=(2, 5, 2, 2)).astype(np.float32)
  v = rng.normal(size=(2, 5, 2, 2)).astype(np.float32)
  key = jax.random.key(0)
  (out_a, w_a), (out_b, w_b) = [
      jax.jit(attention.attend,
              static_argnames=("implementation", "dropout_rate"))(
          q, k, v, dropout_rate=0.5, dropout_rng=key, implementation=impl)
      for impl in IMPLS]
  np.testing.assert_allclose(w_a, w_b, rtol=1e-6)
  np.testing.assert_allclose(out_a, out_b, rtol=1e-5, atol=1e-6)
  # The returned pattern is the softmax before dropout; the output is not.
  out_c, w_c = attention.attend(q, k, v, implementation="einsum")
  np.testing.assert_allclose(w_a, w_c, rtol=1e-6)
  assert float(jnp.max(jnp.abs(out_a - out_c))) > 1e-2  # something dropped


def test_einsum_path_never_materialises_repeated_keys_or_values():
  # GQA with H = 4 query heads on K = 2 kv heads: no intermediate may hold
  # B * Tk * H * Dh elements, the size of K or V repeated to every head.
  b, tq, tk, h, kh, dh = 1, 7, 5, 4, 2, 3
  q, k, v = (jnp.ones((b, tq, h, dh)), jnp.ones((b, tk, kh, dh)),
             jnp.ones((b, tk, kh, dh)))
  jaxpr = jax.make_jaxpr(functools.partial(
      attention.attend, implementation="einsum"))(q, k, v).jaxpr

  def sizes(jaxpr):  # every intermediate, inside nested jaxprs too
    for eqn in jaxpr.eqns:
      yield from (int(np.prod(var.aval.shape)) for var in eqn.outvars)
      for sub in jaxprs.jaxprs_in_params(eqn.params):
        yield from sizes(sub)

  found = set(sizes(jaxpr))
  assert b * tq * h * dh in found  # the walk does see head-sized arrays
  assert b * tk * h * dh not in found


def test_masked_softmax_derivatives_match_finite_differences():
  # The softmax carries a hand-written derivative rule; check it (forward
  # and reverse mode, first and second order) against finite differences,
  # on rows with masked keys and one row with no allowed key at all.
  logits = np.random.default_rng(0).normal(size=(3, 5))
  mask = np.array([[1, 1, 1, 1, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]], bool)
  f = lambda x: softmax.masked_softmax(x, mask)
  check_grads(f, (logits,), order=2, modes=("fwd", "rev"),
                 atol=1e-3, rtol=1e-3)
  jacobian = jax.jacfwd(f)(logits)  # [3, 5, 3, 5]
  assert np.all(jacobian[1][:, 1, [1, 3, 4]] == 0)  # masked keys: no gradient
  assert np.all(jacobian[2] == 0)  # the empty row is constant 0


def _select_rule_attention(q, k, v, allowed, patch=None):
  """The same attention built from jnp.where and jax.nn.softmax, whose own
  derivative rules zero every forbidden key's tangent; `patch` acts on the
  masked scores [B, H, Tq, Tk] as a `scores` hook patch would."""
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  s = jnp.where(allowed, s, -jnp.inf)
  w = jax.nn.softmax(s if patch is None else patch(s), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", w, v)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("patched", [False, True])
def test_masked_scores_differentiate_like_the_select_rule(impl, patched):
  # `score_rules.forbid` passes the tangent of a forbidden key through
  # (the softmax's weight 0 removes it); gradients and forward-mode
  # tangents must equal those of the plain select, also when a `scores`
  # patch writes finite values over forbidden keys (clipping at -2, and
  # opening key 0 to every query).
  rng = np.random.default_rng(5)
  b, t, h, d = 2, 5, 2, 4
  q, k, v = (jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
             for _ in range(3))
  pad = jnp.asarray([[True] * 5, [True] * 3 + [False] * 2])  # [B, Tk]
  mask = pad[:, None, None, :]
  allowed = mask & jnp.tril(jnp.ones((1, 1, t, t), bool))
  patch = None
  if patched:
    patch = lambda s: jnp.maximum(s, -2.0).at[..., 0].set(0.5)
  hooks = hooks_lib.Hooks(patch={"scores": patch} if patched else {})

  def ours(q, k, v):
    out, _ = attention.attend(q, k, v, mask=mask, is_causal=True,
                              implementation=impl, hooks=hooks)
    return out

  theirs = lambda q, k, v: _select_rule_attention(q, k, v, allowed, patch)
  cot = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * cot)
  grads = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
  expected = jax.grad(loss(theirs), argnums=(0, 1, 2))(q, k, v)
  for got, want in zip(grads, expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  tangents = tuple(jnp.asarray(rng.normal(size=x.shape), jnp.float32)
                   for x in (q, k, v))
  _, jvp = jax.jvp(ours, (q, k, v), tangents)
  _, jvp_want = jax.jvp(theirs, (q, k, v), tangents)
  np.testing.assert_allclose(jvp, jvp_want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_dropout_rescales_the_kept_weights_by_one_over_keep_probability(impl):
  """Inverted dropout: a kept weight becomes w / (1 - p), a dropped one 0.
  With one-hot values (v_j = e_j) the output row IS the mixed weights."""
  rng = np.random.default_rng(2)
  tk, p = 6, 0.25
  q = rng.normal(size=(2, 4, 2, 3)).astype(np.float32)
  k = rng.normal(size=(2, tk, 2, 3)).astype(np.float32)
  v = np.broadcast_to(np.eye(tk, dtype=np.float32)[None, :, None, :],
                      (2, tk, 2, tk))
  out, w = attention.attend(q, k, v, dropout_rate=p,
                            dropout_rng=jax.random.key(3), implementation=impl)
  out = np.moveaxis(np.asarray(out), 2, 1)  # [B, H, Tq, Tk] like w
  kept = out != 0
  assert 0 < kept.mean() < 1  # some weights kept, some dropped
  np.testing.assert_allclose(out[kept], np.asarray(w)[kept] / (1 - p),
                             rtol=1e-5)
