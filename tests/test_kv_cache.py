"""Cached decoding equals the full causal forward pass, and fails loudly.

The reference for every exactness test is the forward with no cache:
`multi_head_attention(..., is_causal=True)` (or, with rotary, the same
attention path over the whole sequence at positions 0..T-1, whose rotary
is checked against an independent NumPy RoPE in test_modules.py). Prompts
are right padded with huge junk values so that any leak of padding shows
up.
"""

import functools

import chex
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
from jax.experimental import checkify
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mha_jax import attention
from mha_jax import decode_cost
from mha_jax import flops
from mha_jax import kv_cache
from mha_jax import multi_head
from mha_jax import params as params_lib

D, H = 16, 4
HEAD_LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}  # name -> K for H = 4
PROMPT_LENS = np.array([3, 5, 1], np.int32)  # unequal, in one batch
STEPS = 4
MAX_LEN = 12


def rel_err(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def prefill(params, x, cache, lengths=None, **opts):
  """A right-padded prompt `x [B, T, D]` through the cache."""
  return multi_head.cached_attention(params, x, cache, lengths=lengths,
                                     **opts)


def decode_step(params, x, cache, **opts):
  """One new token per row, `x [B, D]` -> `y [B, D]`, cache, status."""
  y, cache, status = multi_head.cached_attention(params, x[:, None], cache,
                                                 **opts)
  return y[:, 0], cache, status


def full_causal(params, x, rotary_base=None, implementation="vmap"):
  """No cache: causal self-attention over all of `x [B, T, D]`."""
  return multi_head.attention_layer(params, x, is_causal=True,
                                    rotary_base=rotary_base,
                                    implementation=implementation)[0]


def skip_if_no_mask_support(implementation):
  """Skip paths that cannot run here or document (NotImplementedError) that
  they take no explicit masks; the skip message says which."""
  if implementation == "cudnn" and jax.default_backend() != "gpu":
    pytest.skip("'cudnn' needs a CUDA GPU (see mha_jax/xla_attention.py)")
  q = jnp.ones((1, 2, 2, 4))
  try:
    attention.attend(q, q, q, mask=jnp.ones((1, 1, 2, 2), bool),
                     implementation=implementation)
  except NotImplementedError as e:
    pytest.skip(f"{implementation!r} does not take explicit masks: {e}")


def make_inputs(seed, b=len(PROMPT_LENS), steps=STEPS):
  """Full sequences [B, P+N, D] and the padded prompt built from them."""
  p = int(PROMPT_LENS.max())
  full = jax.random.normal(jax.random.PRNGKey(seed), (b, p + steps, D))
  real = jnp.arange(p)[None, :, None] < PROMPT_LENS[:, None, None]
  prompt = jnp.where(real, full[:, :p], 1e4)  # junk in the padding
  return full, prompt


def decode_all(step_fn, prefill_fn, full, prompt, cache):
  """Prefill, then STEPS single-token steps; gather outputs per true pos."""
  y_prompt, cache, status = prefill_fn(prompt, cache, jnp.asarray(PROMPT_LENS))
  assert not status.overflow.any()
  rows = jnp.arange(full.shape[0])
  ys = []
  for s in range(STEPS):
    y, cache, status = step_fn(full[rows, PROMPT_LENS + s], cache)
    assert not status.overflow.any()
    ys.append(y)
  return y_prompt, jnp.stack(ys, axis=1), cache  # [B, P, D], [B, N, D]


def assert_matches_reference(ref, y_prompt, y_steps):
  for b, p in enumerate(PROMPT_LENS):
    assert rel_err(y_prompt[b, :p], ref[b, :p]) < 1e-5, b
    assert rel_err(y_steps[b], ref[b, p:p + STEPS]) < 1e-5, b


# Every head layout with and without rotary on the default path; every other
# implementation on the hardest case (GQA, rotary, ragged), to keep CI fast.
CASES = ([("einsum", layout, base) for layout in sorted(HEAD_LAYOUTS)
          for base in (None, 10000.0)]
         + [(impl, "gqa", 10000.0) for impl in sorted(attention.IMPLEMENTATIONS)
            if impl != "einsum"]
         + [("vmap", "mqa", None)])


@pytest.mark.parametrize("implementation,layout,rotary_base", CASES)
def test_prefill_and_decode_equal_full_forward(implementation, layout,
                                               rotary_base):
  skip_if_no_mask_support(implementation)
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=HEAD_LAYOUTS[layout])
  full, prompt = make_inputs(1)
  opts = dict(rotary_base=rotary_base, implementation=implementation)
  prefill_fn = jax.jit(lambda x, c, n: prefill(params, x, c, n, **opts))
  step_fn = jax.jit(lambda x, c: decode_step(params, x, c, **opts))
  cache = kv_cache.init_cache_for(params, len(PROMPT_LENS), MAX_LEN)
  y_prompt, y_steps, cache = decode_all(step_fn, prefill_fn, full, prompt,
                                        cache)
  if rotary_base is None:
    ref = multi_head.multi_head_attention(params, full, is_causal=True,
                                          implementation="vmap")
  else:
    ref = full_causal(params, full, rotary_base=rotary_base)
  assert_matches_reference(ref, y_prompt, y_steps)
  np.testing.assert_array_equal(cache.length, PROMPT_LENS + STEPS)


def test_padding_and_unwritten_slots_stay_out():
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=2)
  _, prompt = make_inputs(2)
  cache = kv_cache.init_cache_for(params, len(PROMPT_LENS), MAX_LEN)
  _, cache, _ = jax.jit(functools.partial(prefill, params))(
      prompt, cache, jnp.asarray(PROMPT_LENS))
  for b, p in enumerate(PROMPT_LENS):
    assert jnp.all(cache.k[b, p:] == 0) and jnp.all(cache.v[b, p:] == 0)
    assert jnp.all(jnp.abs(cache.k[b, :p]) > 0)
  # Garbage in the unwritten slots must not change anything.
  dirty = cache._replace(k=jnp.where(cache.k == 0, 1e3, cache.k),
                         v=jnp.where(cache.v == 0, -1e3, cache.v))
  x = jax.random.normal(jax.random.PRNGKey(3), (len(PROMPT_LENS), D))
  step = jax.jit(functools.partial(decode_step, params))
  y_clean, _, _ = step(x, cache)
  y_dirty, _, _ = step(x, dirty)
  np.testing.assert_allclose(y_dirty, y_clean, rtol=1e-6, atol=1e-6)


# Jitted once per chunk shape (at most 4) and reused across examples.
_chunk_prefill = jax.jit(functools.partial(prefill, rotary_base=500.0))
_full_rotary = jax.jit(functools.partial(full_causal, rotary_base=500.0))


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_chunked_prefill_equals_one_pass(chunks):
  """Any split of a sequence into prefill chunks gives the full forward."""
  params = params_lib.init_mha_params(jax.random.PRNGKey(6), D, H,
                                      num_kv_heads=2)
  t = sum(chunks)
  # One fixed length for the reference (one compile); causality makes its
  # first t outputs independent of the tokens after them.
  x = jax.random.normal(jax.random.PRNGKey(t), (2, 16, D))
  cache = kv_cache.init_cache_for(params, 2, 16)
  outs, start = [], 0
  for c in chunks:
    y, cache, _ = _chunk_prefill(params, x[:, start:start + c], cache)
    outs.append(y)
    start += c
  ref = _full_rotary(params, x)[:, :t]
  assert rel_err(jnp.concatenate(outs, axis=1), ref) < 1e-5


def test_jit_once_as_positions_advance():
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=1)
  chex.clear_trace_counter()

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(x, c):
    return decode_step(params, x, c, rotary_base=10000.0)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def pre(x, c, n):
    return prefill(params, x, c, lengths=n)

  cache = kv_cache.init_cache_for(params, 2, 16)
  for n in ([1, 3], [2, 2], [0, 1]):  # different lengths, same shapes
    _, cache, _ = pre(jnp.ones((2, 3, D)), cache, jnp.asarray(n, jnp.int32))
  for _ in range(5):
    _, cache, _ = step(jnp.ones((2, D)), cache)
  np.testing.assert_array_equal(cache.length, [8, 11])


def test_overflow_is_reported_not_wrapped_under_jit():
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H)
  cache = kv_cache.init_cache_for(params, 2, 4)
  prompt = jax.random.normal(jax.random.PRNGKey(1), (2, 3, D))
  _, cache, status = jax.jit(lambda x, c: prefill(
      params, x, c, lengths=jnp.array([3, 1], jnp.int32)))(prompt, cache)
  assert not status.overflow.any()
  kv_cache.raise_if_overflow(status)  # nothing to raise yet
  slot0 = cache.k[:, 0]
  step = jax.jit(lambda x, c: decode_step(params, x, c))
  x = jnp.ones((2, D))
  y, cache, status = step(x, cache)  # lengths 4 and 2: both fit exactly
  assert not status.overflow.any() and jnp.isfinite(y).all()
  y, cache, status = step(x, cache)  # sequence 0 needs slot 4 of 4
  np.testing.assert_array_equal(status.overflow, [True, False])
  assert jnp.isnan(y[0]).all() and jnp.isfinite(y[1]).all()
  np.testing.assert_array_equal(cache.length, [5, 3])  # not clamped to 4
  np.testing.assert_array_equal(cache.k[:, 0], slot0)  # nothing wrapped
  with pytest.raises(OverflowError, match=r"sequences \[0\]"):
    kv_cache.raise_if_overflow(status)
  _, _, status = step(x, cache)  # the overflow is sticky
  assert status.overflow[0]


def test_overflow_under_checkify():
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=2)

  def checked_prefill(x, c):
    y, c, status = prefill(params, x, c)
    kv_cache.check_no_overflow(status)
    return y

  run = jax.jit(checkify.checkify(checked_prefill))
  x = jnp.ones((1, 3, D))
  err, _ = run(x, kv_cache.init_cache_for(params, 1, 3))
  assert err.get() is None
  err, _ = run(x, kv_cache.init_cache_for(params, 1, 2))
  assert "overflow" in err.get()
  with pytest.raises(Exception, match="overflow"):
    err.throw()


def test_mqa_cache_is_one_over_h_of_mha():
  sizes = {name: kv_cache.init_cache(2, 32, k, D // H) for name, k in
           HEAD_LAYOUTS.items()}
  nbytes = {n: c.k.nbytes + c.v.nbytes for n, c in sizes.items()}
  assert nbytes["mha"] == 2 * 32 * 2 * H * (D // H) * 4
  assert nbytes["mqa"] * H == nbytes["mha"]
  assert nbytes["gqa"] * 2 == nbytes["mha"]


def test_bad_inputs_name_the_argument():
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=2)
  x = jnp.ones((2, 3, D))
  wrong_k = kv_cache.init_cache(2, 8, 4, D // H)  # MHA cache, GQA params
  with pytest.raises(ValueError, match="cache.k"):
    multi_head.cached_attention(params, x, wrong_k)
  cache = kv_cache.init_cache_for(params, 2, 8)
  with pytest.raises(ValueError, match="lengths"):
    multi_head.cached_attention(params, x, cache, lengths=jnp.array([1, 4]))
  with pytest.raises(ValueError, match="`x`"):
    multi_head.cached_attention(params, x[:, 0], cache)
  with pytest.raises(ValueError, match="max_len"):
    kv_cache.init_cache(2, 0, 1, 4)



@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_decode_step_matmul_flops_match_the_formula(num_kv_heads):
  """decode_cost's analytic count equals the matmuls in the jaxpr of the
  model's cached step and of recomputing the prefix (readout included)."""
  cfg = ml_collections.ConfigDict({"model": {
      "vocab_size": 11, "d_model": D, "num_layers": 2, "num_heads": H,
      "mlp_dim": 24, "max_len": 16, "positions": "rotary",
      "implementation": "einsum"}})
  model = decode_cost.make_model(cfg, num_kv_heads)
  state, step, recompute = decode_cost.split_model(model)
  caches = decode_cost.filled_caches(model, 3, 10, 7)
  counted = flops.jaxpr_matmul_flops(step, state, jnp.ones((3,), jnp.int32),
                                     caches)
  assert counted == decode_cost.analytic_flops(
      cfg, num_kv_heads, 3, 7, cached=True, slots=10)
  counted = flops.jaxpr_matmul_flops(recompute, state,
                                     jnp.ones((3, 7), jnp.int32))
  assert counted == decode_cost.analytic_flops(cfg, num_kv_heads, 3, 7,
                                               cached=False)
