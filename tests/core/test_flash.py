"""The blockwise path and the jax.nn delegates agree with the vmap reference.

Shape letters: B batch, Tq/Tk query/key lengths, H query heads, K kv heads,
Dh head width.
"""

import functools

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core.kernels import flash
from mha_jax.core import masks
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.core import score_rules
from tests import jaxprs

_SETTINGS = dict(max_examples=4, deadline=None, derandomize=True,
                 suppress_health_check=[hypothesis.HealthCheck.too_slow])
# bf16 keeps 8 significant bits: rounding to nearest errs by at most 2**-8
# relative. A result rounded once from inputs rounded once is within 2 u.
BF16_U = 2.0 ** -8


def _reference(q, k, v, mask, bias, is_causal):
  return attention.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                          implementation="vmap")[0]


def _mask(rng, kind, b, h, tq, tk):
  """A boolean mask of `kind`; every kind but "none" empties some rows."""
  if kind == "none":
    return None
  if kind == "padding":  # [B, 1, 1, Tk]; with B > 1 sequence 0 has no key
    lengths = rng.integers(1, tk + 1, b)
    lengths[0] = 0 if b > 1 else lengths[0]
    return masks.padding_mask(jnp.asarray(lengths), tk)
  shape = {"full": (b, h, tq, tk), "2d": (tq, tk), "heads": (1, h, 1, tk),
           "rows": (b, 1, tq, tk)}[kind]
  m = rng.random(shape) < 0.6
  if kind != "heads":
    m[..., min(1, tq - 1), :] = False  # an empty query row
  else:
    m[:, -1] = False  # the last head sees nothing
  return jnp.asarray(m)


BIAS_SHAPES = {
    "none": None, "full": lambda b, h, tq, tk: (b, h, tq, tk),
    "heads": lambda b, h, tq, tk: (1, h, tq, tk),
    "keys": lambda b, h, tq, tk: (b, 1, 1, tk),
    "2d": lambda b, h, tq, tk: (tq, tk),
    "head_keys": lambda b, h, tq, tk: (h, 1, tk),  # rank 3
    "batch_rows": lambda b, h, tq, tk: (b, 1, tq, tk),
    "1d": lambda b, h, tq, tk: (tk,),
}
# (A bias constant along the keys would change no output and have a zero
# gradient: every shape here varies along Tk.)


def _inputs(seed, b, tq, tk, h, kh, dh, mask_kind, bias_kind,
            dtype=jnp.float32, dv=None):
  rng = np.random.default_rng(seed)
  normal = lambda *s: jnp.asarray(rng.normal(size=s), dtype)
  q, k = normal(b, tq, h, dh), normal(b, tk, kh, dh)
  v = normal(b, tk, kh, dh if dv is None else dv)
  mask = _mask(rng, mask_kind, b, h, tq, tk)
  shape = BIAS_SHAPES[bias_kind]
  bias = (None if shape is None else
          jnp.asarray(rng.normal(size=shape(b, h, tq, tk)), jnp.float32))
  return q, k, v, mask, bias


def _loss_and_grads(fn, q, k, v, bias, ct):
  """Values and gradients w.r.t. q, k, v (and bias) of <fn(...), ct>."""
  def loss(q, k, v, bias):
    return jnp.sum(fn(q, k, v, bias).astype(jnp.float32) * ct)
  argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  # One jitted program per case: op-by-op dispatch would dominate the time.
  both = jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums)(*a)))
  return both(q, k, v, bias)


def _flash_and_reference(q, k, v, mask, bias, ct, *, is_causal, block,
                         head_loop):
  """(flash, reference) values and gradients, in ONE compiled program."""
  def value_and_grads(fn):
    def f(q, k, v, bias):
      out, vjp = jax.vjp(lambda *a: fn(*a, bias), q, k, v) if bias is None \
          else jax.vjp(fn, q, k, v, bias)
      return out, vjp(ct.astype(out.dtype))
    return f
  fl = lambda q, k, v, bias=None: flash.flash_attention(
      q, k, v, mask=mask, bias=bias, is_causal=is_causal, block_q=block[0],
      block_k=block[1], head_loop=head_loop)
  ref = lambda q, k, v, bias=None: _reference(q, k, v, mask, bias, is_causal)
  return jax.jit(lambda *a: (value_and_grads(fl)(*a),
                             value_and_grads(ref)(*a)))(q, k, v, bias)


def _assert_tree_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float32),
                               np.asarray(y, np.float32), atol=atol, rtol=0)


# The deterministic grid: every case names what it adds. Each mask kind but
# "none" empties some query rows; tk % bk == 0 in the non-causal masked
# cases, so neither causality nor key padding is there to apply a mask the
# kernel forgot, and one unmasked non-causal case pads its keys. Dh is 2,
# 4, 6 or 8 and Dv differs from Dh in most cases.
# (id, is_causal, (B, Tq, Tk), (H, K), (Dh, Dv), (Bq, Bk), mask, bias)
GRID = [
    ("mha-full-mask-full-bias", False, (2, 7, 8), (4, 4), (6, 3), (4, 4),
     "full", "full"),
    ("gqa-padding-head-bias", False, (2, 6, 8), (4, 2), (8, 5), (4, 4),
     "padding", "heads"),
    ("mqa-2d-mask-key-bias", False, (2, 5, 6), (4, 1), (2, 4), (2, 3),
     "2d", "keys"),
    ("gqa6-head-mask-2d-bias", False, (1, 5, 10), (6, 3), (4, 4), (4, 5),
     "heads", "2d"),
    ("gqa-causal-more-queries", True, (2, 9, 6), (4, 2), (6, 3), (4, 4),
     "rows", "batch_rows"),
    ("mqa-causal-fewer-queries", True, (2, 5, 11), (4, 1), (8, 2), (2, 4),
     "padding", "head_keys"),
    ("mha-causal-1d-bias", True, (1, 8, 8), (2, 2), (4, 6), (4, 4),
     "none", "1d"),
    # Only the kernel's own position test keeps the padding keys out here
    # (no mask, not causal, Tk = 7 in blocks of 3).
    ("gqa-padded-keys-no-mask", False, (2, 6, 7), (4, 2), (4, 4), (4, 3),
     "none", "none"),
]


@pytest.mark.parametrize("head_loop", [False, True],
                         ids=["batched", "head_loop"])
@pytest.mark.parametrize("case", GRID, ids=[c[0] for c in GRID])
def test_flash_grid_values_and_all_four_grads(case, head_loop):
  """Values, dq, dk, dv and dbias against the vmap reference, for the
  batched kernel and for one (batch, kv head) at a time."""
  _, is_causal, (b, tq, tk), (h, kh), (dh, dv), block, mask_kind, \
      bias_kind = case
  q, k, v, mask, bias = _inputs(GRID.index(case), b, tq, tk, h, kh, dh,
                                mask_kind, bias_kind, dv=dv)
  ct = jnp.asarray(np.random.default_rng(1).normal(size=(b, tq, h, dv)),
                   jnp.float32)
  (got, got_grads), (want, want_grads) = _flash_and_reference(
      q, k, v, mask, bias, ct, is_causal=is_causal, block=block,
      head_loop=head_loop)
  assert got.shape == (b, tq, h, dv)
  assert len(got_grads) == (3 if bias is None else 4)
  _assert_tree_close(got, want, atol=1e-5)
  _assert_tree_close(got_grads, want_grads, atol=1e-4)
  if bias is not None:
    assert got_grads[3].shape == bias.shape


def test_grid_covers_what_it_claims():
  kinds = {(c[1], c[6] != "none") for c in GRID}
  assert kinds == {(False, False), (False, True), (True, False), (True, True)}
  assert {c[3][0] // c[3][1] for c in GRID} >= {1, 2, 4}  # MHA, GQA, MQA
  assert {c[6] for c in GRID} == set(["none", "padding", "full", "2d",
                                      "heads", "rows"])
  assert {c[7] for c in GRID} == set(BIAS_SHAPES)
  assert any(c[4][0] != c[4][1] for c in GRID)
  assert any(not c[1] and c[6] != "none" and c[2][2] % c[5][1] == 0
             for c in GRID)  # masked, non-causal, no padded keys
  assert any(not c[1] and c[6] == "none" and c[2][2] % c[5][1] != 0
             for c in GRID)  # padded keys, nothing else hiding them


@hypothesis.settings(**_SETTINGS)
@hypothesis.given(
    seed=st.integers(0, 2**16),
    b=st.integers(1, 2),
    tq=st.integers(1, 21),
    tk=st.integers(1, 21),
    heads=st.sampled_from([(2, 2), (4, 2), (4, 1), (6, 3), (6, 2)]),
    widths=st.sampled_from([(4, 4), (2, 6), (6, 3), (8, 8)]),
    block=st.sampled_from([(4, 4), (8, 3), (5, 16)]),
    is_causal=st.booleans(),
    mask_kind=st.sampled_from(["none", "padding", "full", "2d", "rows"]),
    bias_kind=st.sampled_from(["none", "heads", "keys", "2d", "head_keys"]),
    head_loop=st.booleans(),
)
def test_flash_matches_reference_values_and_grads(
    seed, b, tq, tk, heads, widths, block, is_causal, mask_kind, bias_kind,
    head_loop):
  """Random lengths that do and do not divide the blocks; Tq != Tk. (The
  grid above pins the combinations; this varies lengths and blocks.)"""
  h, kh = heads
  dh, dv = widths
  q, k, v, mask, bias = _inputs(seed, b, tq, tk, h, kh, dh, mask_kind,
                                bias_kind, dv=dv)
  ct = jnp.asarray(np.random.default_rng(seed + 1).normal(
      size=(b, tq, h, dv)), jnp.float32)
  (got, got_grads), (want, want_grads) = _flash_and_reference(
      q, k, v, mask, bias, ct, is_causal=is_causal, block=block,
      head_loop=head_loop)
  _assert_tree_close(got, want, atol=1e-5)
  _assert_tree_close(got_grads, want_grads, atol=1e-4)


def test_fully_masked_rows_under_gqa_with_bias_match_the_reference():
  """Empty rows (causal Tq > Tk, a masked row, a head that sees nothing):
  output 0, no gradient from them, and dq, dk, dv, dbias equal to the
  reference's (not only finite)."""
  b, tq, tk, h, kh = 1, 9, 5, 4, 2
  q, k, v, _, bias = _inputs(0, b, tq, tk, h, kh, 4, "none", "heads", dv=3)
  mask = np.ones((b, h, tq, tk), bool)
  mask[:, :, 6] = False  # query 6 sees nothing in any head
  mask[:, 3, 7] = False  # query 7 sees nothing in head 3 (group 1)
  mask = jnp.asarray(mask)
  ct = jnp.asarray(np.random.default_rng(2).normal(size=(b, tq, h, 3)),
                   jnp.float32)
  (out, grads), (want, want_grads) = _flash_and_reference(
      q, k, v, mask, bias, ct, is_causal=True, block=(4, 2), head_loop=True)
  dq, dk, dv, dbias = grads
  # Tq > Tk with bottom-right causality: queries 0..3 see no key.
  empty = [(slice(None), slice(0, 4)), (slice(None), 6), (3, 7)]
  for heads, rows in empty:
    np.testing.assert_array_equal(np.asarray(out[:, rows, heads]), 0.0)
    np.testing.assert_array_equal(np.asarray(dq[:, rows, heads]), 0.0)
    np.testing.assert_array_equal(np.asarray(dbias[:, heads, rows]), 0.0)
  assert np.all(np.abs(np.asarray(out[:, 4:6])) > 0)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  _assert_tree_close(out, want, atol=1e-6)
  _assert_tree_close(grads, want_grads, atol=1e-5)
  assert float(jnp.max(jnp.abs(dk))) > 0 and float(jnp.max(jnp.abs(dv))) > 0


def _norm_rel_err(got, want):
  """||got - want|| / ||want|| in float64."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return np.linalg.norm(got - want) / np.linalg.norm(want)


def test_bf16_forward_and_backward_within_two_roundings_of_float32():
  """bf16 inputs against the float32 reference on the same (bf16) values.

  A correct path rounds to bf16 only where the policy says: the softmax
  probabilities before they multiply V (u = 2**-8 relative each) and each
  result once at the end (u), everything else accumulating in float32. So
  every output element is within 2 u of sum_j p_ij |v_j| (the reference
  run on |v|), and each gradient within 2 u in norm relative to the float32
  gradient (measured 0.4 to 0.6 u). Many key blocks (256) make an
  accumulator kept in bf16 visible: dq accumulated in bf16 across them
  measured 3.8 to 6 u.
  """
  b, tq, tk, h, kh, dh = 1, 4, 1024, 2, 1, 8
  q, k, v, mask, bias = _inputs(3, b, tq, tk, h, kh, dh, "full", "heads",
                                dtype=jnp.bfloat16)
  ct = jnp.asarray(np.random.default_rng(4).normal(size=q.shape),
                   jnp.bfloat16)
  f32 = lambda x: x.astype(jnp.float32)

  @jax.jit
  def bf16_flash(q, k, v, bias):
    out, vjp = jax.vjp(lambda *a: flash.flash_attention(
        *a[:3], mask=mask, bias=a[3], block_q=4, block_k=4), q, k, v, bias)
    return out, vjp(ct)

  @jax.jit
  def reference(q, k, v, bias):
    ref = lambda q, k, v, bias: _reference(q, k, v, mask, bias, False)
    out, vjp = jax.vjp(ref, q, k, v, bias)
    return out, vjp(f32(ct)), ref(q, k, jnp.abs(v), bias)

  out, grads = bf16_flash(q, k, v, bias)
  assert out.dtype == jnp.bfloat16
  assert [g.dtype for g in grads] == [jnp.bfloat16] * 3 + [jnp.float32]
  want, want_grads, scale = reference(f32(q), f32(k), f32(v), bias)
  err = np.abs(np.asarray(f32(out)) - np.asarray(want))
  assert np.all(err <= 2 * BF16_U * np.asarray(scale)), err.max()
  for name, g, w in zip(("dq", "dk", "dv", "dbias"), grads, want_grads,
                        strict=True):
    assert _norm_rel_err(f32(g), w) <= 2 * BF16_U, name


@pytest.mark.parametrize("window", [None, (3, 2), (0, 6), (9, 0)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk,bq,bk", [(16, 16, 4, 4), (7, 19, 3, 5),
                                         (19, 7, 5, 3), (8, 8, 8, 2)])
def test_visits_exactly_the_blocks_with_a_visible_key(tq, tk, bq, bk, causal,
                                                      window):
  # Visibility written from the definitions, for every row the kernel
  # runs (padded rows continue the positions: query i sits at Tk - Tq + i).
  rules = score_rules.ScoreRules(local_window=window)
  cfg = flash.BlockConfig(tq=tq, tk=tk, bq=bq, bk=bk, bwd_bq=bq, bwd_bk=bk,
                          padded_keys=tk % bk != 0,
                          is_causal=causal,
                          rules=rules, scale=1.0)
  ex = flash.Extras(None, None, None, None, None)
  nq, nk = -(-tq // bq), -(-tk // bk)
  q_pos = np.arange(nq * bq)[:, None] + (tk - tq)
  k_pos = np.arange(nk * bk)[None, :]
  visible = np.broadcast_to(k_pos < tk, (nq * bq, nk * bk))
  if causal:
    visible = visible & (k_pos <= q_pos)
  if window is not None:
    visible = visible & (k_pos >= q_pos - window[0]) & (
        k_pos <= q_pos + window[1])
  for i in range(nq):
    blocks = visible[i * bq:(i + 1) * bq].reshape(bq, nk, bk).any(axis=(0, 2))
    lo, hi = (int(x) for x in flash.kv_block_range(i, nk, ex, cfg))
    if not blocks.any():
      assert hi <= lo
      continue
    seen = np.nonzero(blocks)[0]
    assert (lo, hi) == (seen.min(), seen.max() + 1)


def _largest_intermediate(fn, *args):
  """Largest array size anywhere in fn's jaxpr, sub-jaxprs included."""
  sizes = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      sizes.extend(int(np.prod(v.aval.shape)) for v in eqn.outvars)
      for sub in jaxprs.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return max(sizes)


@pytest.mark.parametrize("head_loop,block", [
    (False, flash.DEFAULT_BLOCK_Q * flash.DEFAULT_BLOCK_K),
    (True, flash.HEAD_LOOP_BLOCK ** 2)])
def test_no_score_matrix_in_forward_or_backward(head_loop, block):
  t, dh = 4096, 16
  x = jnp.ones((2, t, 2, dh), jnp.float32)
  loss = lambda impl: lambda q, k, v: jnp.sum(attention.attend(
      q, k, v, is_causal=True, implementation=impl)[0])
  grad_flash = jax.grad(lambda q, k, v: jnp.sum(flash.flash_attention(
      q, k, v, is_causal=True, head_loop=head_loop)), (0, 1, 2))
  biggest = _largest_intermediate(grad_flash, x, x, x)
  # The largest arrays are q/k/v-sized ([B, T, H, Dh]) or one block (of
  # all B*H heads batched, or of one head at a time), both far below one
  # [Tq, Tk] score matrix.
  assert biggest <= max(x.size, 4 * block if not head_loop else block)
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


def test_bias_and_param_grads_through_multi_head_attention_flash():
  """The docs promise bias gradients for any broadcastable shape on the
  flash path: three shapes the kernel reduces differently, through the
  whole layer (with GQA and projection biases), against vmap."""
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), 16, 4,
                                      num_kv_heads=2, use_bias=True)
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.normal(size=(2, 7, 16)), jnp.float32)
  ct = jnp.asarray(rng.normal(size=(2, 7, 16)), jnp.float32)
  biases = {name: jnp.asarray(rng.normal(size=shape), jnp.float32)
            for name, shape in (("2d", (7, 7)), ("heads_keys", (4, 1, 7)),
                                ("batch_keys", (2, 1, 1, 7)))}

  def grads(impl):
    def loss(params, biases):
      return sum(jnp.sum(multi_head.multi_head_attention(
          params, x, bias=b, is_causal=True, implementation=impl) * ct)
                 for b in biases.values())
    return jax.grad(loss, argnums=(0, 1))

  got, want = jax.jit(lambda p, b: (grads("flash")(p, b),
                                    grads("vmap")(p, b)))(params, biases)
  for name, b in biases.items():
    assert got[1][name].shape == b.shape
    assert float(jnp.max(jnp.abs(got[1][name]))) > 0, name
  _assert_tree_close(got, want, atol=1e-4)


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
    with pytest.raises(ValueError, match="implementation='cudnn' runs on "
                       "gpu only, but the JAX backend is"):
      attention.attend(q, q, q, implementation="cudnn")
  else:  # asked by name, refused with auto's reason before jax.nn fails
    with pytest.raises(ValueError, match="float16/bfloat16 only"):
      attention.attend(q, q, q, implementation="cudnn")


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="'cudnn' needs a CUDA GPU")
def test_cudnn_equals_the_reference_in_bf16():
  """cuDNN's fused attention against the float32 vmap reference on the
  same bf16 inputs, causal and padded, values and gradients: within a few
  bf16 roundings of outputs and gradients of order 1."""
  ks = jax.random.split(jax.random.key(3), 4)
  q = jax.random.normal(ks[0], (2, 64, 4, 64), jnp.bfloat16)
  k = jax.random.normal(ks[1], (2, 64, 2, 64), jnp.bfloat16)
  v = jax.random.normal(ks[2], (2, 64, 2, 64), jnp.bfloat16)
  w = jax.random.normal(ks[3], (2, 64, 4, 64), jnp.float32)

  def loss(impl, q, k, v):
    out = attention.attend(q, k, v, is_causal=True, implementation=impl)[0]
    return jnp.sum(out.astype(jnp.float32) * w), out

  def run(impl, dtype):
    args = [x.astype(dtype) for x in (q, k, v)]
    (_, out), grads = jax.jit(jax.value_and_grad(
        functools.partial(loss, impl), argnums=(0, 1, 2), has_aux=True))(
            *args)
    return out.astype(jnp.float32), [g.astype(jnp.float32) for g in grads]

  got, got_grads = run("cudnn", jnp.bfloat16)
  want, want_grads = run("vmap", jnp.float32)
  # bf16 keeps 8 bits: outputs of order 1 round by up to 2**-8; the
  # gradients sum 64 such terms.
  np.testing.assert_allclose(got, want, atol=2 ** -6, rtol=2 ** -7)
  for g, r in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, r, atol=2 ** -3, rtol=2 ** -6)


@pytest.mark.cpu_only("choose_implementation without a backend picks "
                      "einsum on CPU for float32 scores under 32 MiB (a "
                      "GPU picks xla)")
def test_auto_picks_a_correct_path():
  q, k, v, mask, bias = _inputs(7, 2, 9, 12, 4, 2, 8, "full", "keys")
  # CPU, measured: float32 scores of at most 32 MiB go to einsum.
  assert attention.choose_implementation(q, k) == "einsum"
  assert attention.choose_implementation(q, k, dropout=True) == "einsum"
  assert attention.choose_implementation(q, k, backend="gpu") == "xla"
  long_q = jax.ShapeDtypeStruct((1, 32768, 8, 64), jnp.float32)
  assert attention.choose_implementation(long_q, long_q) == "flash"
  # On a GPU cuDNN takes no float32; the Pallas GPU kernel (O(T) memory
  # too) takes Dh = 64, where Dh = 8 above is below its Triton widths.
  assert attention.choose_implementation(long_q, long_q,
                                         backend="gpu") == "pallas_gpu"
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


def test_window_and_segments_build_no_score_matrix_and_skip_blocks():
  # A sliding window and packed segments: the mask comes from positions
  # and ids per block, so no [Tq, Tk] array exists in forward or backward
  # (the largest is a q/k/v-sized array or one block).
  t, dh = 1024, 16
  x = jnp.ones((2, t, 2, dh), jnp.float32)
  seg = jnp.repeat(jnp.arange(4), t // 4)[None].repeat(2, 0)
  rules = score_rules.ScoreRules(local_window=(64, 0), q_segment_ids=seg,
                                 kv_segment_ids=seg)
  loss = lambda q, k, v: jnp.sum(attention.attend(
      q, k, v, is_causal=True, implementation="flash", rules=rules)[0])
  assert _largest_intermediate(jax.grad(loss, (0, 1, 2)), x, x, x) < t * t
  # With a window of 64 each query block of 128 visits at most 2 key
  # blocks (not up to 8).
  cfg = flash.BlockConfig(tq=t, tk=t, bq=128, bk=128, bwd_bq=64, bwd_bk=64,
                          padded_keys=False,
                          is_causal=True,
                          rules=rules, scale=1.0)
  ex = flash.Extras(None, None, None, None, None)
  spans = [int(hi - lo) for lo, hi in
           (flash.kv_block_range(i, t // 128, ex, cfg) for i in range(8))]
  assert max(spans) == 2 and spans[0] == 1


@pytest.mark.parametrize("tq,tk,causal", [(200, 200, True),
                                          (130, 192, False)])
def test_default_blocks_backward_on_halved_blocks_with_padding(tq, tk,
                                                               causal):
  # The forward runs on blocks of 128 and the backward on blocks of 64
  # (BACKWARD_BLOCK), over arrays padded to whole forward blocks: whole
  # backward blocks of padding must get no weight, and the float32 scale
  # folded into q must give the reference's gradients.
  ks = jax.random.split(jax.random.key(3), 4)
  q = jax.random.normal(ks[0], (1, tq, 2, 8))
  k = jax.random.normal(ks[1], (1, tk, 1, 8))
  v = jax.random.normal(ks[2], (1, tk, 1, 8))
  bias = jax.random.normal(ks[3], (1, 2, tq, tk))
  loss = lambda impl: lambda q, k, v, bias: jnp.sum(jnp.sin(attention.attend(
      q, k, v, bias=bias, is_causal=causal, implementation=impl)[0]))
  want = jax.grad(loss("vmap"), (0, 1, 2, 3))(q, k, v, bias)
  # The batched kernel's defaults (one head at a time is the CPU default).
  batched = lambda q, k, v, bias: jnp.sum(jnp.sin(flash.flash_attention(
      q, k, v, bias=bias, is_causal=causal, head_loop=False)))
  got = jax.grad(batched, (0, 1, 2, 3))(q, k, v, bias)
  for name, g, w in zip(("dq", "dk", "dv", "dbias"), got, want, strict=True):
    np.testing.assert_allclose(g, w, atol=2e-5, err_msg=name)
