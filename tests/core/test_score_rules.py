"""The attention variants of `score_rules` on every path, against a float64
NumPy reference written from the papers' formulas, jax.nn's local window
and Flax's normalize_qk; cached decoding against the full forward."""

import math
import re

from flax import nnx
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core.kernels import auto
from mha_jax.core import converters
from mha_jax.core.kernels import flash
from mha_jax import hooks as hooks_lib
from mha_jax.models import model_config
from mha_jax.core.attention_spec import AttentionSpec
from mha_jax.core import multi_head
from mha_jax.core import score_rules
from mha_jax.models import transformer

_SETTINGS = dict(max_examples=10, deadline=None, derandomize=True,
                 suppress_health_check=[hypothesis.HealthCheck.too_slow])


def reference(q, k, v, *, is_causal=False, window=None, q_seg=None,
              k_seg=None, cap=None, sinks=None, slopes=None, scale=None,
              q_pos=None):
  """float64, one (batch, head) at a time, straight from the definitions:
  s = scale q.k - slope |i - j|; s = cap tanh(s / cap); forbidden keys
  get no weight; the sink joins the normaliser and multiplies no value."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, tq, h, dh = q.shape
  tk, kh = k.shape[1], k.shape[2]
  scale = 1 / math.sqrt(dh) if scale is None else scale
  out = np.zeros((b, tq, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      kv = hi // (h // kh)
      for i in range(tq):
        pi = (tk - tq + i) if q_pos is None else int(q_pos[bi, i])
        logits, keys = [], []
        for j in range(tk):
          if is_causal and j > pi:
            continue
          if window is not None and not pi - window[0] <= j <= pi + window[1]:
            continue
          if q_seg is not None and q_seg[bi, i] != k_seg[bi, j]:
            continue
          s = scale * float(q[bi, i, hi] @ k[bi, j, kv])
          if slopes is not None:
            s -= float(slopes[hi]) * abs(pi - j)
          if cap is not None:
            s = cap * math.tanh(s / cap)
          logits.append(s)
          keys.append(j)
        extra = [] if sinks is None else [float(sinks[hi])]
        if not logits:
          continue  # no allowed key: output 0 (the sink takes everything)
        top = max(logits + extra)
        e = np.exp(np.array(logits) - top)
        total = e.sum() + sum(math.exp(x - top) for x in extra)
        out[bi, i, hi] = (e / total) @ v[bi, keys, kv]
  return out


def _qkv(seed, b, tq, tk, h, kh, dh):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(ks[0], (b, tq, h, dh)),
          jax.random.normal(ks[1], (b, tk, kh, dh)),
          jax.random.normal(ks[2], (b, tk, kh, dh)))


def _segments(rng, b, t, n):
  """Sorted (packed) ids: n segments cut at random points."""
  cuts = np.sort(rng.integers(0, t + 1, size=(b, n - 1)), axis=1)
  return np.stack([np.searchsorted(c, np.arange(t), side="right")
                   for c in cuts]).astype(np.int32)


@st.composite
def _calls(draw):
  b = draw(st.integers(1, 2))
  kh = draw(st.sampled_from([1, 2]))
  h = kh * draw(st.sampled_from([1, 2]))
  tq = draw(st.integers(1, 13))
  tk = draw(st.integers(1, 13))
  use = {n: draw(st.booleans()) for n in
         ("causal", "window", "segments", "cap", "sinks", "alibi", "scale")}
  rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
  opts = dict(is_causal=use["causal"])
  rules = {}
  if use["window"]:
    rules["local_window"] = (draw(st.integers(0, 4)), draw(st.integers(0, 4)))
  if use["segments"]:
    n = draw(st.integers(1, 3))
    rules["q_segment_ids"] = _segments(rng, b, tq, n)
    rules["kv_segment_ids"] = _segments(rng, b, tk, n)
  if use["cap"]:
    rules["soft_cap"] = draw(st.sampled_from([0.5, 2.0]))
  if use["sinks"]:
    rules["sinks"] = rng.normal(size=h).astype(np.float32)
  if use["alibi"]:
    rules["alibi_slopes"] = rng.uniform(0, 1, size=h).astype(np.float32)
  if use["scale"]:
    rules["scale"] = 0.7
  return (b, tq, tk, h, kh), opts, rules


def _reference_for(q, k, v, opts, rules):
  return reference(q, k, v, is_causal=opts["is_causal"],
                   window=rules.get("local_window"),
                   q_seg=rules.get("q_segment_ids"),
                   k_seg=rules.get("kv_segment_ids"),
                   cap=rules.get("soft_cap"), sinks=rules.get("sinks"),
                   slopes=rules.get("alibi_slopes"),
                   scale=rules.get("scale"),
                   q_pos=rules.get("q_positions"))


@hypothesis.settings(**_SETTINGS)
@hypothesis.given(_calls())
def test_every_path_matches_the_float64_reference(call):
  (b, tq, tk, h, kh), opts, rules = call
  q, k, v = _qkv(0, b, tq, tk, h, kh, 4)
  want = _reference_for(q, k, v, opts, rules)
  sr = score_rules.ScoreRules(**{n: (jnp.asarray(x) if isinstance(
      x, np.ndarray) else x) for n, x in rules.items()})
  # Each path is jitted whole: one compile per example instead of one per
  # eager operation (the values are the same; this is most of the time).
  for impl in ("vmap", "einsum"):
    fn = jax.jit(lambda q, k, v, sr, impl=impl: attention.attend(
        q, k, v, implementation=impl, rules=sr, **opts)[0])
    np.testing.assert_allclose(fn(q, k, v, sr), want, atol=2e-5,
                               err_msg=impl)
  # Blocks of 4 (not the default 128) so that windows and segments cross
  # block edges and whole blocks are skipped.
  fn = jax.jit(lambda q, k, v, sr: flash.flash_attention(
      q, k, v, rules=sr, block_q=4, block_k=3, **opts))
  np.testing.assert_allclose(fn(q, k, v, sr), want, atol=2e-5,
                             err_msg="flash")


def _grads(fn, q, k, v, sinks, slopes):
  loss = lambda *a: jnp.sum(jnp.sin(fn(*a)))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, sinks,
                                                          slopes)


@pytest.mark.parametrize("causal,window,segments,cap", [
    (True, (5, 0), True, 3.0),  # a decoder's sliding window, packed
    (False, (2, 3), False, None),  # bidirectional window, GQA
    (True, None, True, 1.0),  # Tq != Tk: queries at the end
])
def test_flash_gradients_equal_the_reference_path(causal, window, segments,
                                                  cap):
  b, tq, tk, h, kh = 2, 11, 11 if window else 14, 4, 2
  q, k, v = _qkv(1, b, tq, tk, h, kh, 8)
  rng = np.random.default_rng(0)
  seg = (dict(q_segment_ids=jnp.asarray(_segments(rng, b, tq, 3)),
              kv_segment_ids=jnp.asarray(_segments(rng, b, tk, 3)))
         if segments else {})
  sinks = jnp.asarray(rng.normal(size=h), jnp.float32)
  slopes = jnp.asarray(rng.uniform(0, 0.5, size=h), jnp.float32)

  def run(impl):
    def fn(q, k, v, sinks, slopes):
      rules = score_rules.ScoreRules(local_window=window, soft_cap=cap,
                                     sinks=sinks, alibi_slopes=slopes, **seg)
      if impl == "flash":
        return flash.flash_attention(q, k, v, is_causal=causal, rules=rules,
                                     block_q=4, block_k=4)
      return attention.attend(q, k, v, is_causal=causal, rules=rules,
                              implementation=impl)[0]
    return _grads(fn, q, k, v, sinks, slopes)

  want = run("vmap")
  for impl in ("einsum", "flash"):
    got = run(impl)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks", "dslopes"), got, want,
                          strict=True):
      np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5,
                                 err_msg=f"{impl} {name}")
      assert np.all(np.isfinite(g))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(3, 1), (0, 0), (6, 2)])
def test_window_matches_jax_nn_local_window_size(window, causal):
  q, k, v = _qkv(2, 2, 12, 12, 4, 4, 8)
  want = jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                      local_window_size=window)
  rules = score_rules.ScoreRules(local_window=window)
  for impl in ("vmap", "einsum", "flash", "xla"):
    out, _ = attention.attend(q, k, v, is_causal=causal, rules=rules,
                              implementation=impl)
    np.testing.assert_allclose(out, want, atol=1e-5, err_msg=impl)


def test_sink_known_answer_and_empty_rows():
  # q = 0: every allowed key has logit 0, so each of the n allowed keys
  # gets 1 / (n + e^sink) and the sink the rest.
  b, t, h = 1, 6, 2
  q = jnp.zeros((b, t, h, 4))
  _, k, v = _qkv(3, b, t, t, h, h, 4)
  sinks = jnp.array([0.0, math.log(3.0)])
  rules = score_rules.ScoreRules(sinks=sinks)
  _, pattern = attention.attend(q, k, v, is_causal=True, rules=rules,
                                implementation="einsum")
  n = np.arange(1, t + 1)  # keys a causal query sees
  for head, e_sink in enumerate((1.0, 3.0)):
    np.testing.assert_allclose(pattern[0, head].sum(-1), n / (n + e_sink),
                               rtol=1e-6)
  # A query with no allowed key (its segment has no keys) outputs exactly
  # 0 on every path, with and without sinks, and its gradients are finite.
  q_seg = jnp.array([[0, 0, 5, 1, 1, 1]])
  k_seg = jnp.array([[0, 0, 1, 1, 1, 1]])
  for sink in (None, sinks):
    r = score_rules.ScoreRules(q_segment_ids=q_seg, kv_segment_ids=k_seg,
                               sinks=sink)
    for impl in ("vmap", "einsum", "flash"):
      fn = lambda q, r=r, impl=impl: attention.attend(
          q, k, v, rules=r, implementation=impl)[0]
      q1 = jnp.ones_like(q)
      assert np.all(np.asarray(jax.jit(fn)(q1))[0, 2] == 0), impl
      g = jax.jit(jax.grad(lambda q, fn=fn: jnp.sum(fn(q) ** 2)))(q1)
      assert np.all(np.isfinite(g)), impl


def test_soft_cap_bounds_the_scores_and_leaves_masked_keys_at_minus_inf():
  q, k, v = _qkv(4, 1, 5, 5, 2, 2, 4)
  rules = score_rules.ScoreRules(soft_cap=0.25)
  hooks = hooks_lib.Hooks(capture=("scores",))
  attention.attend(q * 10, k, v, is_causal=True, rules=rules,
                   implementation="einsum", hooks=hooks)
  scores = np.asarray(hooks.captured["scores"])
  finite = np.isfinite(scores)
  assert np.all(np.abs(scores[finite]) <= 0.25)
  assert np.array_equal(finite[0, 0], np.tril(np.ones((5, 5), bool)))


def test_scores_and_allowed_known_answers():
  """The softmax input, by hand: q.k scaled, plus the bias, minus slope x
  distance, -inf where not allowed; `allowed` with no rule allows all."""
  qk = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # [Tq 2, Tk 3]
  bias = jnp.array([[0.5, -1.0, 0.0], [0.0, 2.0, -0.5]])
  q_pos, k_pos = jnp.array([1, 2]), jnp.arange(3)
  assert score_rules.allowed(q_pos, k_pos) is None
  ok = score_rules.allowed(q_pos, k_pos, is_causal=True)
  np.testing.assert_array_equal(ok, [[True, True, False], [True, True, True]])
  s, dcap = score_rules.scores(qk, q_pos, k_pos, scale=0.5, bias=bias,
                               slopes=jnp.array(0.25), ok=ok)
  distance = np.array([[1, 0, 1], [2, 1, 0]])
  want = 0.5 * np.asarray(qk) + np.asarray(bias) - 0.25 * distance
  want[0, 2] = -np.inf
  np.testing.assert_array_equal(s, want)
  assert dcap is None


def test_alibi_slopes_are_the_papers():
  np.testing.assert_allclose(score_rules.alibi_slopes(8),
                             [2.0 ** -i for i in range(1, 9)])
  np.testing.assert_allclose(score_rules.alibi_slopes(4),
                             [0.25, 0.0625, 2 ** -6, 2 ** -8])
  with pytest.raises(ValueError, match="num_heads.*power of two"):
    score_rules.alibi_slopes(6)
  np.testing.assert_allclose(score_rules.alibi_slopes(1), [2.0 ** -8])
  for bad in (0, -2, 2.0, "4"):
    with pytest.raises(ValueError, match=r"`num_heads` must be a positive int"):
      score_rules.alibi_slopes(bad)
  with pytest.raises(model_config.ModelConfigError, match="num_heads"):
    model_config.ModelConfig(vocab_size=5, d_model=12, num_layers=1,
                             num_heads=6, max_len=8, positions="alibi")


@pytest.mark.parametrize("rules,match", [
    (dict(local_window=(-1, 2)), "local_window.*ints >= 0"),
    (dict(local_window=(3,)), "local_window"),
    (dict(soft_cap=0.0), "soft_cap.*> 0"),
    (dict(soft_cap=-2.0), "soft_cap"),
    (dict(scale=float("nan")), "scale"),
    (dict(q_segment_ids=np.zeros((2, 5), np.int32)), "go together"),
    (dict(q_segment_ids=np.zeros((2, 4), np.int32),
          kv_segment_ids=np.zeros((2, 5), np.int32)),
     r"q_segment_ids.*\[2, 5\].*\(2, 4\)"),
    (dict(q_segment_ids=np.zeros((2, 5), np.float32),
          kv_segment_ids=np.zeros((2, 5), np.float32)),
     "q_segment_ids.*integer"),
    (dict(sinks=np.zeros(3, np.float32)), r"sinks.*\[4\]"),
    (dict(alibi_slopes=-np.ones(4, np.float32)), "alibi_slopes.*>= 0"),
    (dict(q_positions=np.zeros((2, 5), np.float32)), "q_positions.*integer"),
])
def test_bad_rules_fail_before_tracing_naming_the_argument(rules, match):
  q, k, v = _qkv(5, 2, 5, 5, 4, 2, 4)
  rules = {n: jnp.asarray(x) if isinstance(x, np.ndarray) else x
           for n, x in rules.items()}
  with pytest.raises((ValueError, TypeError), match=match):
    attention.attend(q, k, v, rules=score_rules.ScoreRules(**rules))


@pytest.mark.parametrize("name,value,words,takers", [
    ("soft_cap", 2.0, "logit soft-capping", "'pallas_tpu', 'ring'"),
    ("sinks", np.zeros(4, np.float32), "attention sinks",
     "'pallas_tpu', 'ring'"),
    ("alibi_slopes", np.ones(4, np.float32), "ALiBi; pass the bias instead",
     "'ring'")])
def test_xla_refuses_what_jax_nn_lacks_by_name(name, value, words, takers):
  q, k, v = _qkv(6, 1, 5, 5, 4, 4, 4)
  value = jnp.asarray(value) if isinstance(value, np.ndarray) else value
  with pytest.raises(ValueError, match=re.escape(
      f"attend: implementation='xla' does not apply `{name}` ({words}); use "
      f"one of ['all_to_all', 'auto', 'einsum', 'flash', 'pallas_gpu', "
      f"{takers}, 'vmap']")):
    attention.attend(q, k, v, implementation="xla",
                     rules=score_rules.ScoreRules(**{name: value}))


def test_auto_sends_rules_jax_nn_lacks_to_the_blockwise_path():
  q, k, v = _qkv(7, 1, 8, 8, 4, 4, 4)
  choice = auto.select_for(q, k, v, backend="gpu",
                                  rules=("soft_cap",))
  assert choice.implementation == "flash"
  # Dh = 4 is below the Pallas GPU kernel's Triton widths (16-256).
  assert [n for n, _ in choice.ruled_out] == ["cudnn", "pallas_gpu", "xla"]
  assert "soft_cap" in choice.ruled_out[0][1]
  assert "Dh=4" in choice.ruled_out[1][1]
  assert auto.select_for(q, k, v, backend="gpu",
                                rules=("local_window",)).implementation == (
                                    "xla")
  # cuDNN takes a scale (in bfloat16 with Dh = 64, what it supports).
  half = [jnp.zeros((1, 8, 4, 64), jnp.bfloat16)] * 3
  assert auto.select_for(*half, backend="gpu",
                                rules=("scale",)).implementation == "cudnn"
  # The soft cap cuDNN lacks goes to the Pallas GPU kernel at that width.
  assert auto.select_for(*half, backend="gpu",
                         rules=("soft_cap",)).implementation == "pallas_gpu"


def test_qk_norm_layer_matches_flax_normalize_qk_through_the_converter():
  layer = nnx.MultiHeadAttention(num_heads=4, in_features=16, qkv_features=16,
                                 normalize_qk=True, decode=False,
                                 rngs=nnx.Rngs(0))
  # Non-trivial norm scales, so that a converter that drops them fails.
  layer.query_ln.scale[...] = jnp.linspace(0.5, 2.0, 4)
  layer.key_ln.scale[...] = jnp.linspace(1.5, -1.0, 4)
  x = jax.random.normal(jax.random.key(8), (2, 7, 16))
  want = layer(x)
  params = converters.from_nnx_mha(layer)
  got = multi_head.multi_head_attention(params, x, qk_norm="layer")
  np.testing.assert_allclose(got, want, atol=1e-5)
  # The other kind of norm is a different function of the same weights.
  other = multi_head.multi_head_attention(params, x, qk_norm="rms")
  assert not np.allclose(other, want, atol=1e-3)


def test_rms_qk_norm_known_answer():
  x = jnp.array([[[[3.0, -4.0]]]])  # rms = sqrt(12.5)
  out = multi_head.qk_normalize(x, jnp.array([1.0, 2.0]), "rms")
  rms = math.sqrt(12.5 + 1e-6)
  np.testing.assert_allclose(out[0, 0, 0], [3 / rms, -8 / rms], rtol=1e-6)


# A model's forward as one compiled program: the same values as calling it
# eagerly, without compiling each operation on its own (most of the time).
_forward = nnx.jit(lambda m, x: m(x))


@pytest.mark.parametrize("opts", [
    dict(local_window=(3, 3), attention_sinks=True),
    dict(logit_soft_cap=0.7, qk_norm="rms", num_kv_heads=1),
    dict(positions="alibi", attn_scale=0.3, num_kv_heads=2)])
def test_cached_decoding_equals_the_full_forward(opts):
  base = dict(vocab_size=11, d_model=16, num_layers=2, num_heads=4,
              max_len=12)
  model = transformer.DecoderLM(model_config.ModelConfig(
      **{**base, "implementation": "flash", **opts}), rngs=nnx.Rngs(0))
  # Sinks start at 0 and norm scales at 1: move them, so that a cached
  # path that ignored them would differ.
  for block in model.blocks:
    for name in ("sinks", "q_norm"):
      if hasattr(block.attn, name):
        p = getattr(block.attn, name)
        p[...] = p[...] + jnp.linspace(-1.0, 1.5, p.shape[0])
  tokens = jax.random.randint(jax.random.key(9), (2, 9), 0, 11)
  lengths = jnp.array([5, 3])
  call = nnx.jit(lambda m, x, c, n: m(x, cache=c, lengths=n))
  for impl in ("vmap", "einsum", "flash"):
    m = transformer.with_implementation(model, impl)
    full = _forward(m, tokens)
    # A ragged prompt (5 and 3 real tokens), then one token per row per
    # step: row 0 at positions 5.., row 1 at 3.. (windows, ALiBi and the
    # causal rule all read the true positions).
    first, cache = call(m, tokens[:, :5], m.init_cache(2), lengths)
    np.testing.assert_allclose(first[0], full[0, :5], atol=1e-5)
    np.testing.assert_allclose(first[1, :3], full[1, :3], atol=1e-5)
    for s in range(4):
      step, cache = call(m, tokens[jnp.arange(2), jnp.array([5, 3]) + s][
          :, None], cache, jnp.array([1, 1]))
      np.testing.assert_allclose(step[:, 0], full[[0, 1], [5 + s, 3 + s]],
                                 atol=1e-5, err_msg=f"{impl} step {s}")


def test_segment_ids_through_the_model_keep_packed_sequences_apart():
  config = model_config.ModelConfig(vocab_size=11, d_model=16, num_layers=2,
                                    num_heads=4, max_len=12,
                                    positions="rotary", local_window=(4, 4))
  model = transformer.DecoderLM(config, rngs=nnx.Rngs(1))
  a = jax.random.randint(jax.random.key(10), (1, 5), 0, 11)
  bb = jax.random.randint(jax.random.key(11), (1, 7), 0, 11)
  packed = jnp.concatenate([a, bb], axis=1)
  seg = jnp.array([[0] * 5 + [1] * 7])
  pos = jnp.array([list(range(5)) + list(range(7))])
  packed_rules = lambda s: score_rules.ScoreRules(q_segment_ids=s,
                                                  kv_segment_ids=s)
  got = nnx.jit(lambda m, x, s, p: m(x, rules=packed_rules(s), positions=p))(
      model, packed, seg, pos)
  np.testing.assert_allclose(got[:, :5], _forward(model, a), atol=1e-5)
  np.testing.assert_allclose(got[:, 5:], _forward(model, bb), atol=1e-5)
  with pytest.raises(ValueError, match="segment ids do not apply"):
    model(packed, rules=packed_rules(seg), cache=model.init_cache(1))


def test_spec_options_fail_at_construction():
  with pytest.raises(ValueError, match="qk_norm"):
    AttentionSpec(8, 2, qk_norm="batch")
  with pytest.raises(ValueError, match="local_window"):
    AttentionSpec(8, 2, local_window=(2, -1))
  with pytest.raises(ValueError, match="soft_cap"):
    AttentionSpec(8, 2, soft_cap=0)
  with pytest.raises(ValueError, match="power of two"):
    AttentionSpec(12, 3, alibi=True)
  with pytest.raises(model_config.ModelConfigError, match="implementation"):
    model_config.ModelConfig(vocab_size=5, d_model=8, num_layers=1,
                             num_heads=2, max_len=8, implementation="xla",
                             attention_sinks=True)
