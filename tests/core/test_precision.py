"""The matmul precision policy (mha_jax/core/precision.py) reaches every dot.

A CPU computes float32 matmuls exactly whatever the precision field says,
so these tests read the field itself: every `dot_general` in the lowered
StableHLO of a forward and backward pass (custom VJPs, scans and the
models' `nnx.Linear` layers included) must carry HIGHEST when its operands
are float32, JAX's setting when the user set one, and nothing when the
operands are bf16. A dot written as a plain `jnp.einsum` or `@` anywhere on
these paths lowers with no precision field and fails them.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import precision
from mha_jax.core import score_rules
from mha_jax.interp import composition
from mha_jax.interp import factored
from mha_jax.models import activation_cache
from mha_jax.models import generate
from mha_jax.models import transformer
from mha_jax.sae import attribution
from mha_jax.sae import sae

_DOT = re.compile(r"stablehlo\.dot_general\b")
_PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")
_OPERANDS = re.compile(r":\s*\(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")


def dots(text: str) -> list[tuple[str, str | None]]:
  """`(operand dtype, precision)` of every dot_general in `text`."""
  found = []
  for line in text.splitlines():
    if not _DOT.search(line):
      continue
    types = _OPERANDS.search(line)
    assert types, f"unparsed dot_general: {line.strip()}"
    lhs, rhs = types.groups()
    p = _PRECISION.search(line)
    # No field and an explicit DEFAULT mean the same: JAX's setting.
    found.append((lhs if lhs == rhs else f"{lhs},{rhs}",
                  "DEFAULT" if p is None else p.group(1)))
  return found


def lowered(fn, *args) -> str:
  return jax.jit(fn).lower(*args).as_text()


def assert_policy(text, expected="HIGHEST", dtype="f32", min_dots=1):
  """Every dot of `dtype` operands in `text` has precision `expected`."""
  found = dots(text)
  ours = [p for d, p in found if d == dtype]
  assert len(ours) >= min_dots, found
  wrong = [(d, p) for d, p in found if d == dtype and p != expected]
  assert not wrong, f"{len(wrong)} of {len(ours)} {dtype} dots escape: {wrong}"


def _qkv(dtype=jnp.float32, b=1, t=8, h=4, kh=2, dh=8):
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, t, h, dh), dtype)
  k = jax.random.normal(ks[1], (b, t, kh, dh), dtype)
  v = jax.random.normal(ks[2], (b, t, kh, dh), dtype)
  return q, k, v


def _attend_grad(implementation, rules=score_rules.NO_RULES,
                 is_causal=True):
  def loss(q, k, v):
    out, _ = attention.attend(q, k, v, is_causal=is_causal, rules=rules,
                              implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) ** 2)
  return jax.value_and_grad(loss, argnums=(0, 1, 2))


def _user_rules(t):
  table = jnp.linspace(-1.0, 1.0, 2 * t)
  bm = block_mask.create(lambda b, h, qi, ki: ki <= qi, 1, None, t, t, 4, 4)
  return score_rules.ScoreRules(
      score_mod=lambda s, b, h, qi, ki: s + table[qi - ki + t],
      mask_mod=lambda b, h, qi, ki: ki <= qi, block_mask=bm)


ATTEND_CASES = {
    "vmap": ("vmap", score_rules.NO_RULES),
    "einsum": ("einsum", score_rules.NO_RULES),
    "flash": ("flash", score_rules.NO_RULES),
    "flash_user_rules": ("flash", None),  # built per call (a closure)
    "xla": ("xla", score_rules.NO_RULES),
}


@pytest.mark.parametrize("case", list(ATTEND_CASES))
def test_attend_forward_and_backward_dots_are_exact(case):
  implementation, rules = ATTEND_CASES[case]
  q, k, v = _qkv()
  if rules is None:
    rules = _user_rules(q.shape[1])
  assert_policy(lowered(_attend_grad(implementation, rules), q, k, v),
                min_dots=2)


def _decoder(**overrides):
  config = dict(vocab_size=32, d_model=16, num_layers=2, num_heads=4,
                num_kv_heads=2, max_len=16, positions="rotary",
                mlp_gated=True, mlp_activation="silu", norm="rms",
                tie_embeddings=True, readout_bias=False,
                implementation="einsum")
  config.update(overrides)
  return transformer.DecoderLM(transformer.ModelConfig(**config),
                               rngs=nnx.Rngs(0))


def _model_grad(model, call):
  graphdef, state = nnx.split(model)

  def loss(state):
    out = call(nnx.merge(graphdef, state))
    return jnp.mean(out.astype(jnp.float32) ** 2)
  return lowered(jax.value_and_grad(loss), state)


TOKENS = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 32

MODELS = {
    # Tied readout, GQA, gated MLP, rotary, RMSNorm, the einsum path.
    "decoder_tied": lambda: _decoder(),
    # Untied readout with bias, learned positions, the blockwise kernel.
    "decoder_flash": lambda: _decoder(tie_embeddings=False, readout_bias=True,
                                    num_kv_heads=4,
                                      positions="learned", norm="layer",
                                      mlp_gated=False,
                                      implementation="flash"),
    # jax.nn.dot_product_attention's own einsums.
    "decoder_xla": lambda: _decoder(implementation="xla"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_decoder_forward_and_backward_dots_are_exact(name):
  text = _model_grad(MODELS[name](), lambda m: m(TOKENS))
  # 2 layers x (q, k, v, o, 2 or 3 MLP) + readout, forward and backward.
  assert_policy(text, min_dots=20)


def test_continuous_inputs_encoder_decoder_and_regression_heads():
  feats = _decoder(vocab_size=0, input_dim=3, output_dim=2,
                   tie_embeddings=False)
  x = jnp.ones((2, 6, 3))
  assert_policy(_model_grad(feats, lambda m: m(x)), min_dots=20)
  config = transformer.ModelConfig(vocab_size=32, d_model=16, num_layers=1,
                                   num_heads=4, max_len=16)
  encdec = transformer.EncoderDecoder(config, rngs=nnx.Rngs(1))
  assert_policy(_model_grad(encdec, lambda m: m(TOKENS, TOKENS)),
                min_dots=20)
  encoder = transformer.Encoder(config, rngs=nnx.Rngs(2))
  assert_policy(_model_grad(encoder, lambda m: m(TOKENS)), min_dots=10)


def test_cached_decoding_and_activation_cache_dots_are_exact():
  model = _decoder()
  graphdef, state = nnx.split(model)

  def decode(state):
    m = nnx.merge(graphdef, state)
    cache = m.init_cache(2)
    _, cache, _ = generate.prefill(m, TOKENS, cache)
    return generate.decode_step(m, TOKENS[:, 0], cache)[0]
  assert_policy(lowered(decode, state), min_dots=10)

  def with_cache(state):  # the `result` site forms z_h @ W^O_h per head
    m = nnx.merge(graphdef, state)
    _, cache = activation_cache.run_with_cache(m, TOKENS,
                                               ["blocks.0.attn.result"])
    return cache["blocks.0.attn.result"]
  assert_policy(lowered(with_cache, state), min_dots=5)


def test_sae_and_its_attribution_dots_are_exact():
  params = sae.init(jax.random.key(0), 16, 64)
  x = jax.random.normal(jax.random.key(1), (8, 16))

  def loss(params):
    return sae.loss(params, x, kind="topk", k=4)[0]
  assert_policy(lowered(jax.value_and_grad(loss), params), min_dots=4)
  z = jax.random.normal(jax.random.key(2), (1, 5, 4, 4))
  assert_policy(lowered(lambda p, z: attribution.dfa_by_head(p, z), params,
                        z))


def test_weight_views_dots_are_exact():
  a = jax.random.normal(jax.random.key(0), (3, 8, 4))
  b = jax.random.normal(jax.random.key(1), (3, 4, 8))
  assert_policy(lowered(lambda a, b: factored.Factored(a, b).AB, a, b))
  assert_policy(lowered(composition.frobenius_ratio, a[..., :4, :], b))
  assert_policy(lowered(lambda a, b: composition.ov_circuits(
      a, b, jnp.ones(8)), jnp.swapaxes(b, 1, 2), b[..., :4, :]))


def test_the_users_setting_reaches_every_dot():
  """Under `jax.default_matmul_precision("tensorfloat32")` (the opt-in)
  every float32 dot of a model's step and of each attention path carries
  JAX's TF32 precision (HIGH), the library's included."""
  model = MODELS["decoder_flash"]()
  q, k, v = _qkv()
  with jax.default_matmul_precision("tensorfloat32"):
    assert precision.user_setting() == "tensorfloat32"
    assert_policy(_model_grad(model, lambda m: m(TOKENS)), "HIGH",
                  min_dots=20)
    for implementation in ("einsum", "flash", "xla"):
      assert_policy(lowered(_attend_grad(implementation), q, k, v), "HIGH",
                    min_dots=2)
  assert precision.user_setting() is None


def test_bf16_dots_are_left_to_jax():
  """bf16 operands get no precision field: HIGHEST would only ask some
  backends for slower algorithms, and the product is exact in the float32
  accumulation anyway."""
  model = _decoder(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  text = _model_grad(model, lambda m: m(TOKENS))
  assert_policy(text, "DEFAULT", dtype="bf16", min_dots=20)
  q, k, v = _qkv(jnp.bfloat16)
  for implementation in ("einsum", "flash"):
    assert_policy(lowered(_attend_grad(implementation), q, k, v),
                  "DEFAULT", dtype="bf16", min_dots=2)


def test_a_jitted_function_is_traced_again_under_another_setting():
  """The setting is part of jit's cache key: no program traced under one
  setting is reused under another."""
  traces = []

  @jax.jit
  def f(x):
    traces.append(precision.dot_precision(x))
    return precision.matmul(x, x)
  x = jnp.eye(3)
  f(x)
  f(x)
  with jax.default_matmul_precision("tensorfloat32"):
    f(x)
  assert traces == [jax.lax.Precision.HIGHEST, None]


def test_dot_precision_by_dtype():
  f32, bf16 = jnp.ones(2), jnp.ones(2, jnp.bfloat16)
  assert precision.dot_precision(f32, f32) == jax.lax.Precision.HIGHEST
  assert precision.dot_precision(bf16, f32) == jax.lax.Precision.HIGHEST
  assert precision.dot_precision(bf16, bf16) is None
  assert precision.dot_precision(np.ones(2, np.int32)) is None
  with jax.default_matmul_precision("highest"):
    assert precision.dot_precision(f32) is None  # JAX applies its own


def test_a_runs_config_field_sets_the_precision_of_its_steps(monkeypatch,
                                                             tmp_path):
  """`train.matmul_precision` is the setting every step of a run is traced
  under; "" leaves the library's exact default."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from mha_jax.training import train  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(train, "_train_and_evaluate",
                      lambda *a: seen.append(precision.user_setting()))
  config = default.get_config("smoke")
  for name in ("tensorfloat32", ""):
    config.train.matmul_precision = name
    train.train_and_evaluate(config, tmp_path / (name or "exact"))
  assert seen == ["tensorfloat32", None]
