"""The hook seam on loaded checkpoints: every site, patching a head, and
cached greedy decoding equal to transformers' `generate`.

Patching is checked against an independent route: zeroing head h's `z`
in mha_jax must give the logits of the transformers model whose output
projection has head h's columns zeroed (Llama's o_proj has no bias, so
the two are the same intervention), within twice transformers' own
float32 error as in test_pretrained_agreement.py.
"""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mha_jax
from mha_jax.models import generate
from mha_jax import hooks
from mha_jax.interp import composition
from tests.pretrained import compare
import hf_models

DECODERS = tuple(f for f in hf_models.CONFIGS if f != "bert")


@pytest.mark.parametrize("family", ("gemma2", "gpt_neox", "bert"))
def test_every_site_is_formed_and_the_block_sums_hold(built, family):
  """Sandwich, parallel and post-LN blocks: each named site exists, and
  the stream is the sum its wiring says."""
  b = built(family)
  model = mha_jax.load_pretrained(b.directory)
  names = model.hook_names()
  tokens, kw = compare.model_kwargs(family, b.batch)
  _, acts = jax.jit(lambda t, kw: model(t, capture=names, **kw))(tokens, kw)
  assert set(acts) == set(names)
  for l in range(model.config.num_layers):
    p = f"blocks.{l}."
    got = acts[p + "resid_post"]
    if family == "gpt_neox":  # x + attn(x) + mlp(x)
      want = acts[p + "resid_pre"] + acts[p + "attn_out"] + acts[p + "mlp_out"]
      assert p + "resid_mid" not in names
    elif family == "gemma2":  # x + N(attn) + N(mlp)
      want = acts[p + "resid_mid"] + acts[p + "mlp_out"]
    else:  # post-LN: resid_post is a LayerNorm of the sum, not the sum
      want = got
      assert not np.allclose(got, acts[p + "resid_mid"] + acts[p + "mlp_out"],
                             atol=1e-3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # A head's terms sum to the attention layer's output before any norm.
    heads = acts[p + "attn.result"].sum(axis=2)
    if family == "gpt_neox":
      b_o = model.blocks[l].attn.b_o[...][None, None]  # [1, 1, D]
      np.testing.assert_allclose(heads + b_o, acts[p + "attn_out"],
                                 rtol=1e-5, atol=1e-5)


def test_ablating_a_head_equals_zeroing_its_output_columns(built):
  b = built("llama")
  model = mha_jax.load_pretrained(b.directory)
  layer, head, dh = 1, 2, model.config.head_width
  tokens = b.batch["input_ids"].numpy()
  ours = np.asarray(model(tokens, patch=hooks.ablate(
      f"blocks.{layer}.attn.z", heads=head)), np.float64)
  cut = copy.deepcopy(b.model)
  with torch.no_grad():
    cut.model.layers[layer].self_attn.o_proj.weight[
        :, head * dh:(head + 1) * dh] = 0
  ref32 = hf_models.run(cut, b.batch)["main"]
  ref64 = hf_models.run(copy.deepcopy(cut).double(), b.batch)["main"]
  assert compare.rel(ours, ref64) <= 2 * compare.rel(ref32, ref64)
  assert compare.rel(ours, b.out64["main"]) > 1e-2  # the head mattered


@pytest.mark.parametrize("family", DECODERS)
def test_cached_greedy_decoding_equals_transformers_generate(built, family):
  b = built(family)
  model = mha_jax.load_pretrained(b.directory)
  prompt = b.batch["input_ids"][:, :7]
  n = 8
  hf = copy.deepcopy(b.model)
  hf.generation_config.eos_token_id = None  # never stop early
  hf.generation_config.pad_token_id = 0
  with torch.no_grad():
    want = hf.generate(prompt, max_new_tokens=n, do_sample=False)[:, 7:]
  got = generate.generate(model, jnp.asarray(prompt.numpy()), n, max_len=16)
  np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_circuit_tools_refuse_the_families_they_would_misread(built):
  model = mha_jax.load_pretrained(built("gpt2").directory)
  with pytest.raises(ValueError, match=r"tie_embeddings=True"):
    composition.copying_scores(model, 0)
  llama = mha_jax.load_pretrained(built("llama").directory)
  with pytest.raises(ValueError, match=r"head_weights: .*norm='rms'"):
    composition.head_weights(llama, 0)
