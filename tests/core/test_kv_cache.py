"""Cached decoding equals the full causal forward pass, and fails loudly.

The reference for every exactness test is an independent float64 NumPy
layer over the whole sequence with no cache (projections, RoPE at
positions 0..T-1, a causal softmax per head with GQA grouping, the output
projection), not the library's own attention path. Prompts are right
padded with huge junk values so that any leak of padding shows up.
"""

import functools

import chex
from flax import nnx
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
from jax.experimental import checkify
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.models import generate
from mha_jax.core import kv_cache
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.models import transformer

D, H = 16, 4
HEAD_LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}  # name -> K for H = 4
PROMPT_LENS = np.array([3, 5, 1], np.int32)  # unequal, in one batch
STEPS = 4
MAX_LEN = 12


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def prefill(params, x, cache, lengths=None, **opts):
  """A right-padded prompt `x [B, T, D]` through the cache."""
  return multi_head.cached_attention(params, x, cache, lengths=lengths,
                                     **opts)


def decode_step(params, x, cache, **opts):
  """One new token per row, `x [B, D]` -> `y [B, D]`, cache, status."""
  y, cache, status = multi_head.cached_attention(params, x[:, None], cache,
                                                 **opts)
  return y[:, 0], cache, status


def numpy_rope(x, base):
  """RoPE on `x [B, T, H, Dh]` at positions 0..T-1: feature pair (i, i+Dh/2)
  rotated by the angle t * base**(-2i/Dh) (float64)."""
  t, dh = x.shape[1], x.shape[-1]
  half = dh // 2
  angle = np.arange(t)[:, None] * base ** (-2.0 * np.arange(half) / dh)
  cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def numpy_causal_layer(params, x, rotary_base=None):
  """Independent float64 reference: causal self-attention of `x [B, T, D]`
  over the whole sequence, no cache."""
  p = {n: np.asarray(a, np.float64) for n, a in params.items()}
  x = np.asarray(x, np.float64)
  q, k, v = (np.einsum("btd,dhe->bthe", x, p[n]) for n in ("w_q", "w_k",
                                                           "w_v"))
  if rotary_base is not None:
    q, k = numpy_rope(q, rotary_base), numpy_rope(k, rotary_base)
  t, h, dh = q.shape[1:]
  g = h // k.shape[2]
  z = np.zeros(q.shape[:3] + v.shape[-1:])
  for i in range(h):
    s = np.einsum("bqe,bke->bqk", q[:, :, i], k[:, :, i // g]) / np.sqrt(dh)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    z[:, :, i] = (w / w.sum(-1, keepdims=True)) @ v[:, :, i // g]
  return np.einsum("bthe,hed->btd", z, p["w_o"])


def skip_if_cannot_run(implementation):
  """The one expected skip: 'cudnn' needs a CUDA GPU."""
  if implementation == "cudnn" and jax.default_backend() != "gpu":
    pytest.skip("'cudnn' needs a CUDA GPU (see mha_jax/core/kernels/xla.py)")
  if implementation == "cudnn":
    pytest.skip("cuDNN's attention takes float16/bfloat16 only and these "
                "models are float32; tests/core/test_flash.py::"
                "test_cudnn_equals_the_reference_in_bf16 checks cuDNN")


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
         # "pallas_tpu" needs lengths in whole blocks of 128: its cached
         # decoding equals einsum's by tests/core/test_pallas.py's agreement.
         # "pallas_gpu" takes no dense mask (tests/core/test_pallas_gpu.py).
         + [(impl, "gqa", 10000.0) for impl in sorted(attention.PATHS)
            if impl not in ("einsum", "pallas_tpu", "pallas_gpu")]
         + [("vmap", "mqa", None)])


@pytest.mark.parametrize("implementation,layout,rotary_base", CASES)
def test_prefill_and_decode_equal_full_forward(implementation, layout,
                                               rotary_base):
  skip_if_cannot_run(implementation)
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=HEAD_LAYOUTS[layout])
  full, prompt = make_inputs(1)
  opts = dict(rotary_base=rotary_base, implementation=implementation)
  prefill_fn = jax.jit(lambda x, c, n: prefill(params, x, c, n, **opts))
  step_fn = jax.jit(lambda x, c: decode_step(params, x, c, **opts))
  cache = kv_cache.init_cache_for(params, len(PROMPT_LENS), MAX_LEN)
  y_prompt, y_steps, cache = decode_all(step_fn, prefill_fn, full, prompt,
                                        cache)
  ref = numpy_causal_layer(params, full, rotary_base)
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


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_chunked_prefill_equals_one_pass(chunks):
  """Any split of a sequence into prefill chunks gives the full forward."""
  params = params_lib.init_mha_params(jax.random.PRNGKey(6), D, H,
                                      num_kv_heads=2)
  t = sum(chunks)
  x = np.random.default_rng(t).normal(size=(2, t, D)).astype(np.float32)
  cache = kv_cache.init_cache_for(params, 2, 16)
  outs, start = [], 0
  for c in chunks:
    y, cache, _ = _chunk_prefill(params, x[:, start:start + c], cache)
    outs.append(y)
    start += c
  ref = numpy_causal_layer(params, x, rotary_base=500.0)
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


BF16_U = 2.0 ** -8  # bf16 rounding to nearest: 8 significant bits


def test_bf16_cache_far_from_position_zero_matches_float64():
  """bf16 params, inputs and cache, rotary at positions near 300 (where
  bf16 could not even hold a position: its spacing there is 2), ragged.

  Against the float64 reference on the same bf16 values, each row is within
  4 u in norm (u = 2**-8): the layer rounds q, k, v, the probabilities,
  the heads' outputs and y once each (measured 1.3 to 2.0 u). Positions or
  angles taken through bf16, or a cache kept in another dtype, are not.
  """
  lens, steps, p = np.array([297, 300], np.int32), 3, 300
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), D, H,
                                      num_kv_heads=2, dtype=jnp.bfloat16)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, p + steps, D)),
                  jnp.bfloat16)
  real = jnp.arange(p)[None, :, None] < lens[:, None, None]
  prompt = jnp.where(real, x[:, :p], 1e4).astype(jnp.bfloat16)
  cache = kv_cache.init_cache_for(params, 2, p + 4, dtype=jnp.bfloat16)
  opts = dict(rotary_base=10000.0, implementation="einsum")
  y_prompt, cache, _ = jax.jit(functools.partial(prefill, params, **opts))(
      prompt, cache, jnp.asarray(lens))
  step = jax.jit(functools.partial(decode_step, params, **opts))
  rows, ys = np.arange(2), []
  for s in range(steps):
    y, cache, status = step(x[rows, lens + s], cache)
    ys.append(y)
  assert not status.overflow.any()
  assert y_prompt.dtype == y.dtype == cache.k.dtype == jnp.bfloat16
  ref = numpy_causal_layer(params, x, rotary_base=10000.0)
  y_steps = jnp.stack(ys, axis=1)
  for b, length in enumerate(lens):
    assert rel_err(y_prompt[b, :length], ref[b, :length]) <= 4 * BF16_U, b
    assert rel_err(y_steps[b], ref[b, length:length + steps]) <= 4 * BF16_U, b


def test_bf16_generation_logits_match_the_float32_model():
  """A bf16-compute DecoderLM generates through its bf16 caches; the logits
  each token came from are within 4 u in norm of the float32 model's (same
  float32 params) full forward over the generated sequences. Two blocks
  with MLPs round about a dozen times on the way (measured 1.3 to 2.7 u,
  as close as the bf16 model's own full forward)."""
  lens, n, vocab = np.array([3, 5, 1], np.int32), 6, 16

  def model(dtype):
    return transformer.DecoderLM(transformer.ModelConfig(
        vocab_size=vocab, d_model=D, num_layers=2, num_heads=H,
        num_kv_heads=2, max_len=12, positions="learned",
        implementation="einsum", attention_only=False, use_bias=True,
        dtype=dtype), rngs=nnx.Rngs(0))

  prompt = jnp.asarray(np.random.default_rng(1).integers(3, vocab, (3, 5)))
  tokens, logits = generate.generate(model(jnp.bfloat16), prompt, n,
                                     prompt_lengths=lens, return_logits=True)
  assert logits.dtype == jnp.bfloat16
  # Each row's prompt and generated tokens, right padded to one width:
  # causality keeps the padding out of the positions compared.
  seqs = np.zeros((3, 12), np.int32)
  for b, length in enumerate(lens):
    seqs[b, :length + n] = np.concatenate([prompt[b, :length], tokens[b]])
  ref = jax.jit(lambda g, s, t: nnx.merge(g, s)(t))(
      *nnx.split(model(None)), jnp.asarray(seqs))
  for b, length in enumerate(lens):
    got = logits[b]  # logits[b, s] predicted the token after length-1+s
    assert rel_err(got, ref[b, length - 1:length - 1 + n]) <= 4 * BF16_U, b


def test_status_reports_a_row_that_overflowed_in_any_layer():
  """status ORs the layers: a row counts as overflowed if any layer's cache
  holds more than it can (caches built by hand so that they differ)."""
  base = kv_cache.init_cache(batch=4, max_len=4, num_kv_heads=1, head_dim=2)
  with_lengths = lambda *l: base._replace(length=jnp.asarray(l, jnp.int32))
  # Row r overflows only in layer r; row 3 fills every cache exactly.
  layers = [with_lengths(5, 0, 0, 4), with_lengths(0, 5, 0, 4),
            with_lengths(0, 0, 6, 4)]
  np.testing.assert_array_equal(kv_cache.status(layers).overflow,
                                [True, True, True, False])
  np.testing.assert_array_equal(kv_cache.status(layers[1]).overflow,
                                [False, True, False, False])
