"""Gemma 3 beyond the shared agreement tests (test_pretrained_agreement.py
and the other files parametrized by family cover its numbers, decoding
and saving).

Here: the fields a config may lack (a GGUF file's metadata has no layer
pattern, no local base and no query_pre_attn_scalar) are filled as
transformers' own Gemma3TextConfig fills them; configs written by
transformers 4 (`rope_theta`, `rope_local_base_freq`, a `rope_scaling`
for the global layers, `sliding_window_pattern`) read as transformers
reads them; what mha_jax cannot run is refused by name; and the QK-norm
of a new model starts as the identity whatever the norm's offset.
"""

import copy
import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import mha_jax
from mha_jax.core import multi_head
from mha_jax.models import blocks
from mha_jax.models import generate
from mha_jax.models import modules
from mha_jax.pretrained import PretrainedError
from mha_jax.pretrained import load
from tests.pretrained import compare
import hf_models

# What the GGUF reader makes of gemma-3-270m's metadata.
GGUF_270M = dict(
    model_type="gemma3_text", hidden_size=640, num_hidden_layers=18,
    intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
    head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6,
    sliding_window=512, rope_theta=1e6, vocab_size=262144,
    tie_word_embeddings=True)
# The same model as config.json gives it (google/gemma-3-270m, written by
# transformers 4, trimmed of token ids and bookkeeping).
OFFICIAL_270M = dict(
    GGUF_270M, architectures=["Gemma3ForCausalLM"], attention_bias=False,
    attn_logit_softcapping=None, final_logit_softcapping=None,
    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256,
    rope_local_base_freq=10000.0, rope_scaling=None,
    _sliding_window_pattern=6, use_bidirectional_attention=False,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else
                 "sliding_attention" for i in range(18)])
_SMALL = dict(GGUF_270M, num_hidden_layers=7)
# Configs as transformers 4 and 5 write them, and a GGUF file's fields.
FIELDS = {
    "gguf 270m": GGUF_270M,
    "official 270m": OFFICIAL_270M,
    "4b-like, rope_scaling": dict(
        _SMALL, rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0}),
    "pattern 3, local base 2e4": dict(
        _SMALL, rope_local_base_freq=2e4, sliding_window_pattern=3,
        rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "nested, no sliding entry": dict(
        _SMALL, rope_theta=None, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5e5}}),
    "nested, bases equal": dict(_SMALL, rope_theta=None, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
}


def config_of(fields):
  return load.config_from_fields(dict(fields), "config.json")[1]


def transformers_reads(fields):
  fields = {k: v for k, v in fields.items()
            if k not in ("model_type", "architectures") and v is not None}
  return transformers.Gemma3TextConfig(**fields)


@pytest.mark.parametrize("name", FIELDS)
def test_layers_rope_and_scale_as_transformers_reads_the_fields(name):
  c, t = config_of(FIELDS[name]), transformers_reads(FIELDS[name])
  assert c.num_layers == len(t.layer_types)
  for l, kind in enumerate(t.layer_types):
    sliding = kind == "sliding_attention"
    assert c.window_of(l) == ((t.sliding_window - 1, 0) if sliding
                              else None), l
    rope = t.rope_parameters[kind]
    scaling = (None if rope["rope_type"] == "default"
               else (rope["rope_type"], rope["factor"]))
    assert c.rotary_of(l) == (rope["rope_theta"], scaling), l
  assert c.attn_scale == t.query_pre_attn_scalar ** -0.5


def test_gguf_fields_of_270m_load_as_its_official_config():
  c = config_of(GGUF_270M)
  assert c == config_of(OFFICIAL_270M)
  assert [l for l in range(18) if c.window_of(l) is None] == [5, 11, 17]
  assert (c.rotary_base, c.local_rotary_base, c.attn_scale) == (
      1e6, 1e4, 256 ** -0.5)
  assert (c.qk_norm, c.norm_offset, c.norm_placement, c.mlp_activation) == (
      "rms", 1.0, "sandwich", "gelu_tanh")
  assert c.tie_embeddings and c.embed_scale == math.sqrt(640)


REFUSED = {
    "bidirectional": (dict(use_bidirectional_attention=True),
                      r"field 'use_bidirectional_attention': mha_jax "
                      r"supports \[None, False\], got True"),
    "local yarn": (dict(rope_theta=None, rope_parameters={
        "sliding_attention": {"rope_type": "yarn", "factor": 2.0}}),
                   r"\(sliding_attention layers\): field 'rope_parameters':"
                   r" rope_type 'yarn' is not implemented"),
    "global dynamic": (dict(rope_scaling={"rope_type": "dynamic",
                                          "factor": 2.0}),
                       r"\(full_attention layers\): field 'rope_scaling': "
                       r"rope_type 'dynamic' is not implemented"),
    "flat rope_parameters": (dict(rope_theta=None, rope_parameters={
        "rope_type": "default", "rope_theta": 1e4}),
                             r"field 'rope_parameters': expected entries "
                             r"keyed by layer type"),
    "scaled local base": (dict(rope_theta=None, rope_parameters={
        "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                              "rope_theta": 1e4}}),
                          r"field 'rope_parameters': sliding_attention: "
                          r"scaling \('linear', 2\.0\) with its own base"),
    "partial rotary": (dict(rope_theta=None, rope_parameters={
        "full_attention": {"rope_type": "default",
                           "partial_rotary_factor": 0.5}}),
                       r"full_attention: partial_rotary_factor 0\.5"),
    # transformers 5 would read this as no scaling at all.
    "older 'type' alone": (dict(rope_scaling={"type": "linear",
                                              "factor": 8.0}),
                           r"field 'rope_scaling': 'type' 'linear' without "
                           r"'rope_type'"),
    "no pattern": (dict(sliding_window_pattern=0),
                   r"field 'sliding_window_pattern': expected an int >= 1"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_mha_jax_cannot_run_is_refused_by_name(case):
  changes, message = REFUSED[case]
  with pytest.raises(PretrainedError, match=message):
    config_of({**GGUF_270M, **changes})


def test_transformers_4_config_loads_to_the_same_model(built, tmp_path):
  """The tiny model's config.json rewritten as transformers 4 wrote it
  (no layer_types, pattern 3 for its sliding-sliding-global layers)."""
  src = built("gemma3").directory
  legacy = tmp_path / "legacy"
  shutil.copytree(src, legacy)
  fields = json.loads((legacy / "config.json").read_text())
  rope = fields.pop("rope_parameters")
  del fields["layer_types"]
  full = dict(rope["full_attention"])
  fields.update(rope_theta=full.pop("rope_theta"), rope_scaling=full,
                rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
                sliding_window_pattern=3)
  (legacy / "config.json").write_text(json.dumps(fields))
  assert load.load_config(legacy) == load.load_config(src)
  theirs = transformers.AutoConfig.from_pretrained(legacy)
  want = transformers.AutoConfig.from_pretrained(src)
  assert theirs.layer_types == want.layer_types
  assert theirs.rope_parameters == want.rope_parameters


def test_new_models_qk_norm_starts_as_the_identity_whatever_the_offset():
  """The block hands the model's eps and offset to its attention; scales
  start at 1 - offset (Gemma's w = 0), so a new layer multiplies by 1.
  One compiled function: eager ops compile one by one."""
  c = mha_jax.ModelConfig(
      vocab_size=16, d_model=32, num_layers=1, num_heads=4, max_len=8,
      positions="rotary", norm="rms", norm_offset=1.0, norm_eps=1e-2,
      qk_norm="rms")
  block = nnx.eval_shape(lambda: blocks.TransformerBlock(c, rngs=nnx.Rngs(0)))
  spec = block.attn.spec
  assert (spec.qk_norm_eps, spec.qk_norm_offset) == (1e-2, 1.0)

  @jax.jit
  def start(x):
    attn = modules.MultiHeadAttention(
        mha_jax.AttentionSpec(32, 4, qk_norm="rms", qk_norm_offset=1.0),
        rngs=nnx.Rngs(0))
    w = attn.q_norm[...]
    return (w, attn.k_norm[...],
            multi_head.qk_normalize(x, w, "rms", offset=1.0),
            multi_head.qk_normalize(x, jnp.ones(8), "rms"))

  x = jax.random.normal(jax.random.key(0), (2, 3, 4, 8))  # [B, T, H, Dh]
  q_norm, k_norm, gemma, plain = start(x)
  np.testing.assert_array_equal(q_norm, 0.0)
  np.testing.assert_array_equal(k_norm, 0.0)
  np.testing.assert_array_equal(gemma, plain)


def test_cached_decoding_computes_transformers_logits(built):
  """Greedy decoding from 7 tokens, 8 steps, past the window of 4: each
  step's logits equal transformers' on the sequence so far, within twice
  its own float32 error (test_pretrained_hooks.py checks the tokens, which
  the argmax alone would keep under a wrong rotary base). Its shapes, so
  a worker that ran that test reuses the compiled loop."""
  b = built("gemma3")
  model = mha_jax.load_pretrained(b.directory)
  prompt = b.batch["input_ids"][:, :7]
  tokens, logits = generate.generate(model, jnp.asarray(prompt.numpy()), 8,
                                     max_len=16, return_logits=True)
  # logits[:, n] came from the sequence up to position 6 + n.
  seq = torch.cat([prompt, torch.tensor(np.asarray(tokens[:, :-1]))], 1)
  batch = dict(input_ids=seq)
  ref32 = hf_models.run(b.model, batch)["main"][:, 6:]
  ref64 = hf_models.run(copy.deepcopy(b.model).double(), batch)["main"][:, 6:]
  ours = np.asarray(logits, np.float64)
  assert compare.rel(ours, ref64) <= 2 * compare.rel(ref32, ref64)
