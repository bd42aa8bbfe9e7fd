"""The ModelConfig fields the families need: each bad value names its
field, the defaults are the project's own model, and config.json maps to
the fields docs/pretrained.md lists."""

import math

import pytest

import mha_jax
from mha_jax import ModelConfig
from mha_jax import ModelConfigError
from mha_jax.pretrained import load_config

BASE = dict(vocab_size=16, d_model=32, num_layers=2, num_heads=4, max_len=16)
ROTARY = dict(BASE, positions="rotary")

BAD = [
    ("norm", dict(norm="batch")),
    ("norm_eps", dict(norm_eps=0.0)),
    ("norm_offset", dict(norm_offset=1.0)),  # LayerNorm has no offset
    ("norm_placement", dict(norm_placement="middle")),
    ("parallel_block", dict(parallel_block=True, norm_placement="post")),
    ("mlp_activation", dict(mlp_activation="gelu")),
    ("attention_only", dict(attention_only=True, mlp_gated=True)),
    ("out_bias", dict(out_bias=True)),  # b_o without q, k, v biases
    ("readout_bias", dict(tie_embeddings=True)),
    ("tie_embeddings", dict(tie_embeddings=True, readout_bias=False,
                            output_dim=3)),
    ("embed_scale", dict(embed_scale=-1.0)),
    ("type_vocab_size", dict(type_vocab_size=-1)),
    ("rotary_dim", dict(ROTARY, rotary_dim=3)),
    ("rotary_dim", dict(rotary_dim=4)),  # learned positions
    ("rotary_scaling", dict(ROTARY, rotary_scaling=("yarn", 2.0))),
    ("rotary_scaling", dict(ROTARY, rotary_scaling=("llama3", 8.0))),
    ("layer_windows", dict(layer_windows=((3, 0),))),  # 2 layers
    ("local_rotary_base", dict(ROTARY, local_rotary_base=0.0)),
    ("local_rotary_base", dict(local_rotary_base=1e4)),  # learned positions
    ("final_soft_cap", dict(final_soft_cap=0)),
]


@pytest.mark.parametrize("field, changes", BAD)
def test_bad_field_is_named(field, changes):
  with pytest.raises(ModelConfigError, match=rf"ModelConfig\.{field}:") as e:
    ModelConfig(**{**BASE, **changes})
  assert e.value.field == field


def test_defaults_are_the_project_model():
  c = ModelConfig(**BASE)
  assert (c.norm, c.norm_eps, c.norm_placement, c.mlp_activation) == (
      "layer", 1e-6, "pre", "gelu_tanh")
  assert c.has_out_bias is False and c.window_of(1) is None
  assert c.local_rotary_base is None and c.rotary_of(1) == (10000.0, None)


def test_local_rotary_base_is_the_sliding_layers_and_drops_scaling():
  linear = ("linear", 8.0)
  c = ModelConfig(**{**ROTARY, "num_layers": 3}, rotary_base=1e6,
                  rotary_scaling=linear, layer_windows=((3, 0), None, (3, 0)))
  assert [c.rotary_of(l) for l in range(3)] == [(1e6, linear)] * 3
  g = c.replace(local_rotary_base=1e4)
  assert [g.rotary_of(l) for l in range(3)] == [
      (1e4, None), (1e6, linear), (1e4, None)]
  assert not (c.parallel_block or c.mlp_gated or c.tie_embeddings
              or c.embed_norm)


def test_config_json_maps_to_fields(built):
  g = load_config(built("gemma2").directory)
  assert (g.norm, g.norm_offset, g.norm_placement) == ("rms", 1.0, "sandwich")
  assert g.embed_scale == math.sqrt(32) and g.attn_scale == 12 ** -0.5
  assert g.layer_windows == ((3, 0), None, (3, 0))
  assert (g.logit_soft_cap, g.final_soft_cap) == (2.0, 5.0)
  n = load_config(built("gpt_neox").directory)
  assert (n.parallel_block, n.rotary_dim, n.mlp_activation) == (
      True, 4, "gelu_erf")
  q = load_config(built("qwen2").directory)
  assert (q.use_bias, q.has_out_bias, q.num_kv_heads) == (True, False, 2)
  assert q.layer_windows == (None, (3, 0))  # max_window_layers=1
  g3 = load_config(built("gemma3").directory)
  assert (g3.qk_norm, g3.norm_offset, g3.norm_eps) == ("rms", 1.0, 1e-2)
  assert g3.layer_windows == ((3, 0), (3, 0), None)
  assert (g3.rotary_base, g3.rotary_scaling, g3.local_rotary_base) == (
      1e6, ("linear", 2.0), 1e4)
  assert g3.attn_scale == 12 ** -0.5 and g3.final_soft_cap is None
  l = load_config(built("llama").directory)
  assert l.rotary_scaling == ("llama3", 8.0, 1.0, 4.0, 32)
  bert = load_config(built("bert").directory)
  assert (bert.norm_placement, bert.final_ln, bert.type_vocab_size) == (
      "post", False, 2)
  assert isinstance(mha_jax.load_pretrained(built("bert").directory),
                    mha_jax.Encoder)
