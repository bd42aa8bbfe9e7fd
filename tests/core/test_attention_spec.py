"""AttentionSpec: one validated object per layer, and who registers paths."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mha_jax
from mha_jax.core import attention
from mha_jax.core import multi_head
from mha_jax.core import score_rules
from mha_jax.core.attention_spec import AttentionSpec

CORE = pathlib.Path(mha_jax.__file__).parent / "core"


def _gemma3_like():
  return mha_jax.ModelConfig(
      vocab_size=16, d_model=32, num_layers=2, num_heads=4, max_len=16,
      num_kv_heads=2, positions="rotary", layer_windows=((3, 0), None),
      local_rotary_base=100.0, rotary_scaling=("linear", 2.0),
      logit_soft_cap=5.0, qk_norm="rms", norm="rms", norm_offset=1.0,
      norm_eps=1e-2)


def test_config_gives_each_layer_its_window_and_rotary():
  c = _gemma3_like()
  local, glob = c.attention_spec(0, causal=True), c.attention_spec(1)
  assert (local.local_window, local.rotary_base, local.rotary_scaling) == (
      (3, 0), 100.0, None)
  assert (glob.local_window, glob.rotary_base, glob.rotary_scaling) == (
      None, 10000.0, ("linear", 2.0))
  assert local.causal and not glob.causal
  assert (local.num_kv_heads, local.head_dim, local.soft_cap) == (2, 8, 5.0)
  assert (local.qk_norm, local.qk_norm_eps, local.qk_norm_offset) == (
      "rms", 1e-2, 1.0)
  # Cross-attention: positions of two sequences, so no window or rotary.
  cross = c.attention_spec(0, cross=True)
  assert (cross.local_window, cross.rotary_base, cross.alibi) == (
      None, None, False)


def test_spec_is_resolved_hashable_and_static():
  a = AttentionSpec(16, 4)
  b = AttentionSpec(16, 4, num_kv_heads=4, head_dim=4)
  assert a == b and hash(a) == hash(b)
  assert (a.implementation, a.forms_weights) == (
      attention.DEFAULT_IMPLEMENTATION, True)
  assert not a.replace(implementation="flash").forms_weights


@pytest.mark.parametrize("options,match", [
    (dict(num_kv_heads=3), "`num_kv_heads` K=3 must divide"),
    (dict(implementation="fast"), "unknown `implementation`='fast'"),
    (dict(head_dim=5, rotary_base=10000.0), "even head width, got 5"),
    (dict(dropout_rate=1.0), r"`dropout_rate` must be in \[0, 1\)"),
    (dict(qk_norm="batch"), "`qk_norm` must be None or one of"),
    (dict(local_window=(1, -1)), "`local_window` must be a pair"),
])
def test_bad_spec_names_the_field(options, match):
  with pytest.raises(ValueError, match=match):
    AttentionSpec(16, 4, **options)


def test_attention_layer_refuses_a_spec_of_other_params():
  params = mha_jax.init_mha_params(jax.random.key(0), 16, 4)
  x = jnp.ones((1, 3, 16))
  with pytest.raises(ValueError, match=r"\(D, H, K, Dh\)=\(16, 2, 2, 8\)"):
    multi_head.attention_layer(params, x, spec=AttentionSpec(16, 2))
  with pytest.raises(ValueError, match="params lack `q_norm`"):
    multi_head.attention_layer(params, x,
                               spec=AttentionSpec(16, 4, qk_norm="rms"))
  with pytest.raises(ValueError, match="`rules.soft_cap`=2.0 differs"):
    multi_head.attention_layer(params, x, spec=AttentionSpec(16, 4),
                               rules=score_rules.ScoreRules(soft_cap=2.0))


def test_module_with_a_spec_equals_the_pure_keywords():
  """The module's spec and the pure function's keywords (which build a
  spec inside) are one computation: bit-identical outputs."""
  spec = AttentionSpec(16, 4, num_kv_heads=2, causal=True,
                       local_window=(2, 0), soft_cap=3.0, sinks=True)
  m = mha_jax.MultiHeadAttention(spec, rngs=nnx.Rngs(params=0))
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  y, cache = m(x)
  want = mha_jax.multi_head_attention(
      m.core_params(), x, is_causal=True,
      rules=score_rules.ScoreRules(local_window=(2, 0), soft_cap=3.0))
  assert cache is None
  np.testing.assert_array_equal(y, want)


def test_parameter_paths_are_unchanged():
  model = mha_jax.DecoderLM(_gemma3_like(), rngs=nnx.Rngs(0))
  paths = {".".join(map(str, p))
           for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  for name in ("w_q", "w_k", "w_v", "w_o", "q_norm", "k_norm"):
    assert f"blocks.0.attn.{name}.value" in paths or (
        f"blocks.0.attn.{name}" in paths), sorted(paths)[:8]


def test_core_names_no_registered_path_and_the_package_registers_them():
  for path in CORE.rglob("*.py"):
    text = path.read_text()
    for name in ('"ring"', '"all_to_all"', "'ring'", "'all_to_all'",
                 "mha_jax.parallel"):
      assert name not in text, f"{path.name} names {name}"
  assert set(attention.all_paths()) - set(attention.PATHS) == {
      "ring", "all_to_all"}
  assert not attention.forms_weights("ring")
  assert attention.known_implementation("ring")
  with pytest.raises(ValueError, match="one of the core's own"):
    attention.register(attention.PATHS["einsum"])
