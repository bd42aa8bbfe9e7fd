"""The Pallas GPU kernel ("pallas_gpu") in Pallas' interpret mode on CPU,
against the float64 reference of the user rules (tests/core/
rule_reference.py): values and gradients to q, k, v and a rule's table
for the documented rules, the built-ins, GQA, sinks and empty rows; a
tampered block mask; the refusals. Tiny shapes and blocks of 4, so that
every call has several blocks, a padded last one and skipped ones; each
case compiles once (interpret mode is slow to trace)."""

import dataclasses
import types

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import score_rules
from mha_jax.core.kernels import pallas_gpu
from tests.core.rule_reference import reference
from tests.core.rule_reference import Rule

DH = 8
BLOCK = 4


def _inputs(rng, b, tq, tk, h, kh):
  q, k, v, w = (rng.normal(size=s).astype(np.float32) for s in
                ((b, tq, h, DH), (b, tk, kh, DH), (b, tk, kh, DH),
                 (b, tq, h, DH)))
  return q, k, v, w


def _run(q, k, v, w, make_rules, table, *, is_causal=False, blocks=True):
  """out and d sum(out * w) / d (q, k, v, table), jitted, on the kernel
  in interpret mode (blocks of 4 unless a block mask brings its own)."""
  def loss(q, k, v, table):
    rules = make_rules(table)
    attention.check_attend_inputs(q, k, v, None, None, "pallas_gpu",
                                  rules=rules, is_causal=is_causal)
    kw = dict(block_q=BLOCK, block_k=BLOCK) if blocks else {}
    out = pallas_gpu.pallas_gpu_attention(q, k, v, is_causal=is_causal,
                                          rules=rules, interpret=True, **kw)
    return jnp.sum(out * w), out
  (_, out), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, table)
  return np.asarray(out), [np.asarray(g) for g in grads]


def _close(out, grads, want_out, want_grads, what=""):
  np.testing.assert_allclose(out, want_out, atol=2e-5, err_msg=what)
  for got, want, name in zip(grads, want_grads, "qkv"):
    np.testing.assert_allclose(got, want, atol=5e-5,
                               err_msg=f"{what} d{name}")


def _table_grad(dmod, shape, tq, tk):
  """d loss / d table of `s + table[h, q - k + Tk - 1]` from the
  reference's d loss / d score `dmod [B, H, Tq, Tk]`."""
  want = np.zeros(shape)
  rel = (tk - tq + np.arange(tq))[:, None] - np.arange(tk)[None] + tk - 1
  for hi in range(shape[0]):
    np.add.at(want[hi], rel, dmod[:, hi].sum(0))
  return want


# The five rules of docs/score_rules.md, and rows that see nothing. GQA
# (two query heads per kv head), a padded last query and key block, and a
# block mask wherever the rule has a mask_mod.
@pytest.mark.parametrize("name", ["relative_bias", "documents", "prefix_lm",
                                  "soft_cap", "window_sinks", "empty_rows"])
def test_documented_rules_match_the_float64_reference(name):
  b, tq, tk, h, kh = 2, 7, 10, 4, 2
  rng = np.random.default_rng(11)
  rule = Rule(name, b, h, tk, rng)
  q, k, v, w = _inputs(rng, b, tq, tk, h, kh)
  bm = None
  if rule.mask_mod is not None:
    bm = block_mask.create(rule.mask_mod, b, None, tq, tk, BLOCK, BLOCK)
  table = jnp.zeros((1,)) if rule.table is None else jnp.asarray(rule.table)
  out, grads = _run(q, k, v, w, lambda t: rule.rules(t).replace(
      block_mask=bm), table, blocks=bm is None)
  want_out, *want_grads, dmod = reference(q, k, v, w, rule)
  _close(out, grads, want_out, want_grads, name)
  if rule.table is not None:  # the table's gradient, through score_mod
    np.testing.assert_allclose(
        grads[3], _table_grad(dmod, rule.table.shape, tq, tk), atol=5e-5)
  if name == "empty_rows":  # the project's policy: output 0, gradient 0
    odd = (tk - tq + np.arange(tq)) % 2 == 1  # rows at odd positions
    assert np.all(out[:, odd] == 0) and np.all(grads[0][:, odd] == 0)
  if bm is not None and name != "empty_rows":  # blocks were skipped
    assert bm.counts()["empty"] > 0


def _builtin_rule(b, h, tq, tk, rng):
  """Every built-in at once, for the library and the float64 reference:
  bottom-right causal, a window (3, 0), segments, ALiBi, a soft cap of 3,
  sinks and a scale of 0.5."""
  seg = np.sort(rng.integers(0, 2, size=(b, tk)), axis=1)
  slopes = np.abs(rng.normal(size=(h,))).astype(np.float32)
  sinks = rng.normal(size=(h,)).astype(np.float32)
  default = 1 / np.sqrt(DH)
  def pre(s, h, qi, ki):  # reference scores at the default scale
    return s / default * 0.5 - slopes[h] * np.abs(qi - ki)
  rule = types.SimpleNamespace(
      score_np=lambda s, b, h, qi, ki: 3 * np.tanh(pre(s, h, qi, ki) / 3),
      dscore_np=lambda s, b, h, qi, ki: (
          1 - np.tanh(pre(s, h, qi, ki) / 3) ** 2) * 0.5 / default,
      mask_np=lambda b, h, qi, ki: (ki <= qi) & (qi - ki <= 3) & (
          seg[b][qi] == seg[b][ki]),
      sinks=sinks)
  rules = score_rules.ScoreRules(
      local_window=(3, 0), soft_cap=3.0, scale=0.5,
      q_segment_ids=jnp.asarray(seg[:, tk - tq:]),
      kv_segment_ids=jnp.asarray(seg), alibi_slopes=jnp.asarray(slopes),
      sinks=jnp.asarray(sinks))
  return rule, rules


def test_builtin_rules_match_the_float64_reference_and_the_vmap_path():
  b, tq, tk, h, kh = 2, 9, 11, 4, 2
  rng = np.random.default_rng(5)
  rule, rules = _builtin_rule(b, h, tq, tk, rng)
  q, k, v, w = _inputs(rng, b, tq, tk, h, kh)
  out, grads = _run(q, k, v, w, lambda _: rules, jnp.zeros(1),
                    is_causal=True)
  want_out, *want_grads, _ = reference(q, k, v, w, rule)
  _close(out, grads, want_out, want_grads, "built-ins")
  # The sinks' and slopes' gradients against autodiff of the reference
  # path ("vmap", float32), itself checked against float64 in
  # tests/core/test_score_rules.py.
  def grads_of(run):
    def loss(sinks, slopes):
      r = rules.replace(sinks=sinks, alibi_slopes=slopes)
      return jnp.sum(run(r) * w)
    return jax.jit(jax.grad(loss, (0, 1)))(rules.sinks, rules.alibi_slopes)
  got = grads_of(lambda r: pallas_gpu.pallas_gpu_attention(
      q, k, v, is_causal=True, rules=r, block_q=BLOCK, block_k=BLOCK,
      interpret=True))
  want = grads_of(lambda r: attention.attend(
      q, k, v, is_causal=True, rules=r, implementation="vmap")[0])
  for g, wnt, what in zip(got, want, ("sinks", "alibi_slopes")):
    np.testing.assert_allclose(g, wnt, atol=5e-5, err_msg=what)


@pytest.mark.cpu_only("attend runs the kernel interpreted off GPU; on a "
                      "GPU it compiles for Triton, which refuses these "
                      "tiny widths and blocks")
def test_query_positions_and_attend_dispatch_match_the_vmap_path():
  # Decoding-style positions (the causal rule and ALiBi read them): no
  # static block skipping is possible, every block is walked and masked.
  rng = np.random.default_rng(2)
  q, k, v, _ = _inputs(rng, 2, 5, 9, 2, 1)
  pos = jnp.asarray(np.sort(rng.integers(0, 9, size=(2, 5)), axis=1),
                    jnp.int32)
  rules = score_rules.ScoreRules(q_positions=pos, alibi_slopes=jnp.asarray(
      [0.5, 0.25]), local_window=(4, 4))
  got, pattern = attention.attend(q, k, v, is_causal=True, rules=rules,
                                  implementation="pallas_gpu")
  want, _ = attention.attend(q, k, v, is_causal=True, rules=rules,
                             implementation="vmap")
  assert pattern is None
  np.testing.assert_allclose(got, want, atol=2e-5)


def test_a_learned_scalar_in_a_rule_gets_its_gradient():
  # A closed-over float of shape () (a learned temperature): hoisted into
  # the kernels as a [1] input, its gradient summed over every program.
  b, tq, tk, h, kh = 1, 6, 9, 2, 1
  rng = np.random.default_rng(6)
  q, k, v, w = _inputs(rng, b, tq, tk, h, kh)
  temp = np.float32(1.7)
  rule = types.SimpleNamespace(
      score_np=lambda s, *_: temp * s, dscore_np=lambda s, *_: temp + 0 * s,
      mask_np=lambda b, h, qi, ki: ki <= qi, sinks=None)
  out, grads = _run(q, k, v, w, lambda t: score_rules.ScoreRules(
      score_mod=lambda s, b, h, qi, ki: t * s,
      mask_mod=lambda b, h, qi, ki: ki <= qi), jnp.asarray(temp))
  want_out, *want_grads, dmod = reference(q, k, v, w, rule)
  _close(out, grads, want_out, want_grads, "temperature")
  s0 = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64),
                 np.repeat(k, h // kh, axis=2).astype(np.float64)) / np.sqrt(DH)
  np.testing.assert_allclose(grads[3], np.sum(dmod * s0), atol=5e-5)


def test_a_float_array_in_mask_mod_is_read_per_element():
  # mask_mod's arrays are read from memory element by element (never
  # differentiated), a float one too; the answer is the vmap path's.
  rng = np.random.default_rng(9)
  q, k, v, _ = _inputs(rng, 1, 7, 10, 2, 1)
  reach = jnp.asarray(rng.uniform(0.0, 10.0, size=(10,)), jnp.float32)
  rules = score_rules.ScoreRules(
      mask_mod=lambda b, h, qi, ki: (ki <= qi) & (ki >= qi - reach[qi]))
  got = pallas_gpu.pallas_gpu_attention(q, k, v, rules=rules,
                                        block_q=BLOCK, block_k=BLOCK,
                                        interpret=True)
  want, _ = attention.attend(q, k, v, rules=rules, implementation="vmap")
  np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("mark", ["empty", "full"])
def test_tampered_block_mask_changes_exactly_that_block(mark):
  # A block mask is trusted, as FlexAttention's is. Marking a needed block
  # empty must drop exactly its keys for its queries (it is never
  # visited, forward or backward); marking a partial block full must
  # allow all of its keys (mask_mod is not evaluated there). The float64
  # reference is told the same, and nothing else may change.
  b, t, h, kh = 1, 12, 2, 1
  rng = np.random.default_rng(8)
  rule = Rule("prefix_lm", b, h, t, rng)
  bm = block_mask.create(rule.mask_mod, None, None, t, t, BLOCK, BLOCK)
  want = block_mask.PARTIAL if mark == "full" else block_mask.FULL
  i, j = np.argwhere(bm.state[0, 0] == want)[-1]  # a needed block
  state, parts = bm.state.copy(), bm.parts.copy()
  state[0, 0, i, j] = getattr(block_mask, mark.upper())
  parts[0, 0, i, j] = mark == "full"
  tampered = dataclasses.replace(bm, state=state, parts=parts)
  keep = rule.mask_np
  in_block = lambda qi, ki: (qi // BLOCK == i) & (ki // BLOCK == j)
  if mark == "empty":
    rule.mask_np = lambda b, h, qi, ki: keep(b, h, qi, ki) & ~in_block(qi,
                                                                       ki)
  else:
    rule.mask_np = lambda b, h, qi, ki: keep(b, h, qi, ki) | in_block(qi,
                                                                      ki)
  q, k, v, w = _inputs(rng, b, t, t, h, kh)
  out, grads = _run(q, k, v, w, lambda _: rule.rules(None).replace(
      block_mask=tampered), jnp.zeros(1), blocks=False)
  want_out, *want_grads, _ = reference(q, k, v, w, rule)
  _close(out, grads, want_out, want_grads, f"marked {mark}")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_forward_is_within_its_rounding_of_float64(dtype):
  # The probabilities meet v in the input dtype (as in FlashAttention-2),
  # the sums are float32 and the output is rounded once: each adds at
  # most half an ulp of the largest |v| (eps / 2 each), so the output
  # is within eps * max|v| of float64 on the same (rounded) inputs.
  b, tq, tk, h, kh = 1, 9, 9, 4, 2
  rng = np.random.default_rng(4)
  rule = Rule("documents", b, h, tk, rng)
  bm = block_mask.create(rule.mask_mod, b, None, tq, tk, BLOCK, BLOCK)
  q, k, v, w = (np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))
                for x in _inputs(rng, b, tq, tk, h, kh))
  out = pallas_gpu.pallas_gpu_attention(
      *(jnp.asarray(x, dtype) for x in (q, k, v)),
      rules=rule.rules(None).replace(block_mask=bm), interpret=True)
  assert out.dtype == dtype
  want = reference(q, k, v, w, rule)[0]
  eps = float(jnp.finfo(dtype).eps)
  np.testing.assert_allclose(np.asarray(out, np.float64), want,
                             atol=eps * np.abs(v).max(), rtol=0)


@settings(max_examples=2, deadline=None, derandomize=True)
@given(tq=st.integers(3, 9), extra=st.integers(0, 4),
       heads=st.sampled_from([(2, 1), (2, 2)]), b=st.integers(1, 2))
def test_random_shapes_match_the_float64_reference(tq, extra, heads, b):
  # The documents rule (a mask_mod with a block mask) and a relative
  # table (a score_mod) together, on drawn lengths and head layouts.
  tk, (h, kh) = tq + extra, heads
  rng = np.random.default_rng(tq * 100 + extra)
  docs = Rule("documents", b, h, tk, rng)
  rel = Rule("relative_bias", b, h, tk, rng)
  rel.mask_np, rel.mask_mod = docs.mask_np, docs.mask_mod
  bm = block_mask.create(rel.mask_mod, b, None, tq, tk, BLOCK, BLOCK)
  q, k, v, w = _inputs(rng, b, tq, tk, h, kh)
  out, grads = _run(q, k, v, w, lambda t: rel.rules(t).replace(
      block_mask=bm), jnp.asarray(rel.table), blocks=False)
  want_out, *want_grads, dmod = reference(q, k, v, w, rel)
  _close(out, grads, want_out, want_grads, f"{tq}x{tk} {heads}")
  np.testing.assert_allclose(
      grads[3], _table_grad(dmod, rel.table.shape, tq, tk), atol=5e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(head_dim=12), "head width Dh=12 must be a power of two"),
    (dict(value_dim=512), "value width Dv=512 must be a power of two"),
    (dict(block_q=8), "`block_q`=8 must be a power of two >= 16"),
    (dict(block_k=48), "`block_k`=48 must be a power of two >= 16"),
    (dict(dtypes=("float32", "bfloat16", "float32")), "share one dtype"),
    (dict(mask=True), "no dense `mask`"),
    (dict(bias=True), "no dense `bias`"),
])
def test_the_triton_limits_are_refused_naming_the_argument(kwargs, match):
  call = dict(head_dim=64, value_dim=64, block_q=64, block_k=64,
              dtypes=("bfloat16",) * 3, mask=False, bias=False,
              interpret=False)
  assert pallas_gpu.unsupported(**call) is None
  assert match in pallas_gpu.unsupported(**{**call, **kwargs})
  # Interpret mode takes any width and block; the dtype, mask and bias
  # limits are the kernel's own.
  if not {"dtypes", "mask", "bias"} & set(kwargs):
    assert pallas_gpu.unsupported(**{**call, **kwargs,
                                     "interpret": True}) is None


def _dots(jaxpr):
  """(precision, operand dtype) of every dot in a jaxpr, kernels' too."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn.params["precision"], eqn.invars[0].aval.dtype
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _dots(sub)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_every_kernel_dot_follows_the_precision_policy(dtype):
  # docs/precision.md: float32 dots exact (HIGHEST), narrower ones left
  # to JAX; in all three kernels, forward and backward.
  x = jnp.zeros((1, 32, 2, 16), dtype)
  loss = lambda q, k, v: jnp.sum(pallas_gpu.pallas_gpu_attention(
      q, k, v, is_causal=True, interpret=True).astype(jnp.float32))
  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(x, x, x).jaxpr
  want = ((jax.lax.Precision.HIGHEST,) * 2 if dtype == jnp.float32
          else None)
  found = list(_dots(jaxpr))
  assert len(found) >= 7  # qk, pv forward; qk, dp, dq, dk, dv backward
  assert {(p, jnp.dtype(d)) for p, d in found} == {(want, jnp.dtype(dtype))}


def test_default_blocks_suit_triton_at_every_length():
  # Powers of two of at least 16 and at most the default, padding a
  # short length (a decoding step's single query) instead of clipping.
  for length, want in ((1, 16), (9, 16), (17, 32), (64, 64), (1000, 64)):
    assert pallas_gpu.default_block(length, 64) == want


def test_rules_the_triton_lowering_cannot_compile_are_refused_naming_them():
  gather = score_rules.ScoreRules(
      score_mod=lambda s, b, h, qi, ki: s + jnp.arange(8.0)[qi - ki])
  why = pallas_gpu.untraceable(gather)
  assert why.startswith("`score_mod` uses `dynamic_slice` (indexing a "
                        "float array the rule closes over")
  # Integer arrays (document ids) are read per element: no refusal.
  ids = jnp.arange(12) // 5
  docs = score_rules.ScoreRules(
      mask_mod=lambda b, h, qi, ki: (ids[qi] == ids[ki]) & (ki <= qi),
      score_mod=lambda s, b, h, qi, ki: s - 1.0 * (ids[ki] == 0))
  assert pallas_gpu.untraceable(docs) is None
  # mask_mod's arrays are never differentiated: a float one is read too.
  limits = jnp.linspace(0.0, 11.0, 12)
  assert pallas_gpu.untraceable(score_rules.ScoreRules(
      mask_mod=lambda b, h, qi, ki: ki <= limits[qi])) is None
  fine = score_rules.ScoreRules(
      score_mod=lambda s, b, h, qi, ki: 2.0 * jnp.tanh(s / 2.0),
      mask_mod=lambda b, h, qi, ki: (ki <= qi) | (ki < 3))
  assert pallas_gpu.untraceable(fine) is None


def test_attend_refuses_a_dense_mask_and_dropout_naming_them():
  q = jnp.zeros((1, 4, 2, DH))
  with pytest.raises(ValueError, match="no dense `mask`"):
    attention.attend(q, q, q, mask=jnp.ones((4, 4), bool),
                     implementation="pallas_gpu")
  with pytest.raises(ValueError, match="implementation='pallas_gpu' has no "
                     "attention dropout"):
    attention.attend(q, q, q, implementation="pallas_gpu",
                     dropout_rate=0.1, dropout_rng=jax.random.key(0))


def test_the_triton_lowering_takes_forward_and_backward():
  # Lowered for CUDA from this CPU (cross-platform lowering): Pallas turns
  # each kernel into Triton IR, one `xla.gpu.triton` call each (forward,
  # dq, dk/dv), with every built-in and both user rules traced in. What
  # this cannot show: that Triton compiles the IR and that it runs fast
  # (that needs a GPU: experiments/gpu_bench/flex.py).
  q = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16)
  k = jax.ShapeDtypeStruct((2, 128, 2, 64), jnp.bfloat16)
  seg = jnp.zeros((2, 128), jnp.int32)
  rules = score_rules.ScoreRules(
      mask_mod=lambda b, h, qi, ki: (ki <= qi) | (ki < 16), soft_cap=20.0,
      score_mod=lambda s, b, h, qi, ki: s + 0.1 * (qi - ki),
      local_window=(64, 0), q_segment_ids=seg, kv_segment_ids=seg,
      sinks=jnp.zeros(4), alibi_slopes=jnp.ones(4))
  def loss(q, k, v):
    out = pallas_gpu.pallas_gpu_attention(q, k, v, rules=rules,
                                          is_causal=True, interpret=False)
    return jnp.sum(out.astype(jnp.float32))
  text = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, k, k).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call @__gpu$xla.gpu.triton") == 3
  # Packed documents as FlexAttention users write them, reading document
  # ids the rule closes over (the kernel loads them per element), with a
  # block mask.
  ids = jnp.arange(128, dtype=jnp.int32) // 37
  docs = lambda b, h, qi, ki: (ids[qi] == ids[ki]) & (ki <= qi)
  rules = score_rules.ScoreRules(mask_mod=docs, block_mask=block_mask.create(
      docs, None, None, 128, 128, 64, 64))
  def doc_loss(q, k, v):
    out = pallas_gpu.pallas_gpu_attention(q, k, v, rules=rules,
                                          interpret=False)
    return jnp.sum(out.astype(jnp.float32))
  text = jax.jit(jax.grad(doc_loss, (0, 1, 2))).trace(q, k, k).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call @__gpu$xla.gpu.triton") == 3
  # A decoding step: one query at a traced position, its block padded.
  one = jax.ShapeDtypeStruct((2, 1, 4, 64), jnp.bfloat16)
  step = score_rules.ScoreRules(q_positions=jnp.full((2, 1), 100),
                                soft_cap=20.0)
  text = jax.jit(lambda q, k, v: pallas_gpu.pallas_gpu_attention(
      q, k, v, rules=step, is_causal=True, interpret=False)).trace(
          one, k, k).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call @__gpu$xla.gpu.triton") == 1
