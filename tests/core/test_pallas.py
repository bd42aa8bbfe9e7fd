"""The splash-attention adapter ("pallas_tpu") against the reference path,
run in Pallas' interpret mode on CPU (values and gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core.kernels import auto
from mha_jax.core import score_rules


def _qkv(b, tq, tk, h, kh, dh=16):
  ks = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(ks[0], (b, tq, h, dh)),
          jax.random.normal(ks[1], (b, tk, kh, dh)),
          jax.random.normal(ks[2], (b, tk, kh, dh)))


def _run(impl, q, k, v, causal, rules):
  return attention.attend(q, k, v, is_causal=causal, rules=rules,
                          implementation=impl)[0]


@pytest.mark.parametrize("case", ["causal_gqa_tq_lt_tk", "everything"])
def test_splash_adapter_matches_the_reference_path(case):
  if case == "causal_gqa_tq_lt_tk":
    # Bottom-right causality with Tq != Tk, two query heads per kv head.
    q, k, v = _qkv(1, 128, 256, 2, 1)
    causal, rules = True, score_rules.NO_RULES
  else:
    # Window + packed segments (one query segment has no keys: its rows
    # must be 0) + soft cap + sinks + another scale.
    q, k, v = _qkv(2, 128, 128, 2, 1)
    seg_q = jnp.array([[0] * 50 + [1] * 78, [0] * 60 + [7] * 68])
    seg_k = jnp.array([[0] * 50 + [1] * 78, [0] * 128])
    rules = score_rules.ScoreRules(
        local_window=(30, 5), soft_cap=2.0, scale=0.4,
        sinks=jnp.array([0.5, -1.0]), q_segment_ids=seg_q,
        kv_segment_ids=seg_k)
    causal = True
  want = _run("einsum", q, k, v, causal, rules)
  got = _run("pallas_tpu", q, k, v, causal, rules)
  np.testing.assert_allclose(got, want, atol=1e-5)
  if case == "everything":
    assert np.all(np.asarray(got)[1, 60:] == 0)  # segment 7 has no keys
  loss = lambda impl: lambda q, k, v: jnp.sum(jnp.sin(
      _run(impl, q, k, v, causal, rules)))
  grads = lambda impl: jax.jit(jax.grad(loss(impl), (0, 1, 2)))(q, k, v)
  for g, w in zip(grads("pallas_tpu"), grads("einsum"), strict=True):
    np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mask=jnp.ones((128, 128), bool)), "no dense boolean mask"),
    (dict(bias=jnp.zeros((128, 128))), "no additive bias"),
    (dict(rules=score_rules.ScoreRules(alibi_slopes=jnp.ones(2))),
     "alibi_slopes"),
])
def test_splash_adapter_refuses_what_it_cannot_keep(kwargs, match):
  q, k, v = _qkv(1, 128, 128, 2, 2)
  with pytest.raises(ValueError, match=match):
    attention.attend(q, k, v, implementation="pallas_tpu", **kwargs)
  q, k, v = _qkv(1, 100, 100, 2, 2)
  with pytest.raises(ValueError, match="multiples of its block of 128"):
    attention.attend(q, k, v, implementation="pallas_tpu")


def test_auto_on_tpu_takes_splash_where_it_applies():
  q = jax.ShapeDtypeStruct((2, 1024, 8, 128), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, 1024, 2, 128), jnp.bfloat16)
  choice = auto.select_for(q, kv, kv, is_causal=True, backend="tpu",
                                  rules=("local_window", "sinks"))
  assert choice.implementation == "pallas_tpu"
  # ALiBi is a bias the kernel lacks: the blockwise path takes it.
  choice = auto.select_for(q, kv, kv, backend="tpu",
                                  rules=("alibi_slopes",))
  assert choice.implementation == "flash"
  assert "alibi_slopes" in dict(choice.ruled_out)["pallas_tpu"]
  # Lengths off the block grid go to XLA while the scores fit.
  odd = jax.ShapeDtypeStruct((2, 1000, 8, 128), jnp.bfloat16)
  assert auto.select_for(odd, odd, odd, backend="tpu").implementation \
      == "xla"
