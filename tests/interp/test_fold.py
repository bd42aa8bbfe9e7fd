"""Folding and centring keep a decoder's logits, on every family.

The reference is the unconverted model's own output: each tiny random
checkpoint of tests/pretrained (Hugging Face directories and GGUF files)
is loaded, converted, and run on the same tokens.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import mha_jax
from mha_jax.interp import fold
from tests.pretrained import gguf_models
import hf_models

torch.set_num_threads(1)
U32 = 2.0 ** -24
# Float32 rounding of a forward pass: the checkpoints' relative changes
# measured 2e-7 to 6e-7 (3 to 10 U32); this leaves room for another
# summation order, not for a wrong weight (which moves logits by O(1)).
TOL = 32 * U32
DECODERS = ["gpt2", "llama", "mistral", "qwen2", "gemma2", "gemma3",
            "gpt_neox", "gguf:llama", "gguf:gemma3"]
TOKENS = jnp.asarray(hf_models.inputs("gpt2")["input_ids"].numpy())  # [2, 12]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
  """`loaded(name)` -> that checkpoint as a `DecoderLM` (or `Encoder`)."""
  cache = {}

  def get(name):
    if name not in cache:
      directory = tmp_path_factory.mktemp(name.replace(":", "_"))
      if name.startswith("gguf:"):
        arch = name[5:]
        path = directory / f"{arch}.gguf"
        gguf_models.write(gguf_models.build(arch), path, arch)
      else:
        path = directory
        hf_models.build(name, path)
      cache[name] = mha_jax.load_pretrained(path)
    return cache[name]

  return get


def rel(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def flat(model):
  return {p: np.asarray(v[...])
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def effective_scales(model):
  """{norm path: offset + scale (RMSNorm) or scale, and bias or None}."""
  c = model.config
  out = {}
  for path, norm in nnx.iter_graph(model):
    if isinstance(norm, (nnx.LayerNorm, mha_jax.models.blocks.RMSNorm)):
      offset = c.norm_offset if c.norm == "rms" else 0.0
      bias = getattr(norm, "bias", None)
      out[path] = (offset + np.asarray(norm.scale[...]),
                   None if bias is None else np.asarray(bias[...]))
  return out


@pytest.mark.parametrize("name", DECODERS)
def test_fold_layer_norm_keeps_logits_and_the_original(loaded, name):
  model = loaded(name)
  before = flat(model)
  logits = model(TOKENS)
  folded = fold.fold_layer_norm(model)
  assert rel(folded(TOKENS), logits) < TOL
  # The original is untouched, bit for bit.
  after = flat(model)
  assert before.keys() == after.keys()
  for p in before:
    np.testing.assert_array_equal(before[p], after[p], err_msg=str(p))
  # Every pre-norm is now the identity's scale (and a zero bias); a
  # sandwich block's post-norms cannot fold and keep their scales.
  old = effective_scales(model)
  for path, (scale, bias) in effective_scales(folded).items():
    if path[-1] in ("ln_attn_post", "ln_mlp_post"):
      np.testing.assert_array_equal(scale, old[path][0])
      continue
    np.testing.assert_array_equal(scale, 1.0)
    if bias is not None:
      np.testing.assert_array_equal(bias, 0.0)


@pytest.mark.parametrize("name", ["gpt2", "gpt_neox"])
def test_center_writing_weights_keeps_logits(loaded, name):
  model = fold.fold_layer_norm(loaded(name))
  logits = loaded(name)(TOKENS)
  centred = fold.center_writing_weights(model)
  assert rel(centred(TOKENS), logits) < TOL
  params = flat(centred)
  writers = [p for p in params if p[-2:] in (
      ("embed", "embedding"), ("pos_embed", "embedding"), ("attn", "w_o"),
      ("attn", "b_o"), ("mlp_out", "kernel"), ("mlp_out", "bias"))]
  learned = model.config.positions == "learned"  # GPT-2's table, not NeoX
  assert len(writers) == 1 + learned + 4 * model.config.num_layers
  for p in writers:
    w = params[p]
    assert np.max(np.abs(w.mean(-1))) < 1e-6 * np.max(np.abs(w)), p
  # GPT-2's readout was the embedding; it keeps the old, uncentred values.
  if name == "gpt2":
    assert model.config.tie_embeddings is False  # untied by the fold
    assert loaded(name).config.tie_embeddings is True


@pytest.mark.parametrize("name", [n for n in DECODERS if n != "gemma2"])
def test_center_unembed_subtracts_each_positions_mean_logit(loaded, name):
  model = loaded(name)
  logits = model(TOKENS)
  centred = fold.center_unembed(model)(TOKENS)
  want = logits - logits.mean(-1, keepdims=True)
  assert rel(centred, want) < TOL
  assert rel(jax.nn.log_softmax(centred), jax.nn.log_softmax(logits)) < TOL


def test_folding_a_bias_free_layer_norm_model_adds_the_biases():
  config = mha_jax.ModelConfig(vocab_size=16, d_model=8, num_layers=2,
                               num_heads=4, num_kv_heads=2, max_len=8,
                               mlp_bias=False)
  model = mha_jax.DecoderLM(config, rngs=nnx.Rngs(0))
  # Norms away from their start (scale 1, bias 0), or folding is trivial.
  rng = np.random.default_rng(1)
  nnx.update(model, jax.tree.map(
      lambda x: x + 0.3 * rng.standard_normal(x.shape, np.float32),
      nnx.state(model, nnx.Param)))
  tokens = jnp.asarray(rng.integers(0, 16, (2, 8)))
  folded = fold.fold_layer_norm(model)
  c = folded.config
  assert (c.use_bias, c.out_bias, c.mlp_bias, c.readout_bias) == (
      True, False, True, True)
  assert rel(folded(tokens), model(tokens)) < TOL
  # Folding again changes nothing: the norms are the identity already.
  again = fold.fold_layer_norm(folded)
  for p, w in flat(folded).items():
    np.testing.assert_allclose(flat(again)[p], w, atol=1e-6, err_msg=str(p))


def test_what_cannot_be_done_exactly_is_refused_by_name(loaded):
  def raises(exc, fn, model, message):
    with pytest.raises(exc, match=re.escape(message)):
      fn(model)

  raises(fold.FoldError, fold.center_writing_weights, loaded("llama"),
         "center_writing_weights: cannot be done exactly for this model: "
         "norm='rms' (RMSNorm does not subtract the mean, so it reads it)")
  raises(fold.FoldError, fold.center_writing_weights, loaded("gemma2"),
         "norm='rms' (RMSNorm does not subtract the mean, so it reads it); "
         "norm_placement='sandwich' (only pre-norm blocks read the stream "
         "through a norm alone)")
  raises(fold.FoldError, fold.center_unembed, loaded("gemma2"),
         "center_unembed: cannot be done exactly for this model: "
         "final_soft_cap=5.0 (a soft cap does not commute with shifting the "
         "logits)")
  post = mha_jax.DecoderLM(mha_jax.ModelConfig(
      vocab_size=16, d_model=8, num_layers=1, num_heads=2, max_len=8,
      norm_placement="post"), rngs=nnx.Rngs(0))
  raises(fold.FoldError, fold.fold_layer_norm, post,
         "fold_layer_norm: cannot be done exactly for this model: "
         "norm_placement='post' (a post-norm's scale acts on the residual "
         "stream itself; no weight reads it alone)")
  no_final = mha_jax.DecoderLM(mha_jax.ModelConfig(
      vocab_size=16, d_model=8, num_layers=1, num_heads=2, max_len=8,
      final_ln=False), rngs=nnx.Rngs(0))
  raises(fold.FoldError, fold.center_writing_weights, no_final,
         "final_ln=False (the readout reads the stream directly)")
  bert = loaded("bert")  # an Encoder: post-norm blocks, no readout
  for fn in (fold.fold_layer_norm, fold.center_writing_weights,
             fold.center_unembed):
    raises(TypeError, fn, bert,
           f"{fn.__name__}: `model` must be a DecoderLM, got Encoder")
