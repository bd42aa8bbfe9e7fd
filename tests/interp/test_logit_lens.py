"""The logit lens and direct logit attribution on every decoder family.

Known answers: the model's own logits (the lens's last entry; the frozen
read-out of the whole final stream plus the biases, before a soft cap),
the captured `attn_out` (the heads' terms add up to it, through Gemma's
post-norms too), and TransformerLens's formula written out in NumPy.
"""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mha_jax
from mha_jax.interp import logit_lens as ll
from test_fold import DECODERS, TOKENS, loaded, rel  # noqa: F401 (fixture)

U32 = 2.0 ** -24


@pytest.mark.parametrize("name", DECODERS)
def test_lens_ends_at_the_models_logits(loaded, name):  # noqa: F811
  model = loaded(name)
  lens = ll.logit_lens(model, TOKENS)
  c = model.config
  assert lens.shape == (c.num_layers + 1,) + TOKENS.shape + (c.vocab_size,)
  np.testing.assert_array_equal(lens[-1], model(TOKENS))
  last = ll.logit_lens(model, TOKENS, positions=-1)  # [L + 1, B, V]
  np.testing.assert_array_equal(last, lens[:, :, -1])


def _bias_terms(model, tokens):
  """`[B, T]`: the final norm's bias along each token's column plus the
  readout's bias of the token, read off the modules."""
  w_u = (model.embed.embed.embedding[...].T if model.readout is None
         else model.readout.kernel[...])
  out = np.zeros(tokens.shape)
  if model.config.norm == "layer":
    out += np.asarray(model.final_ln.bias[...] @ w_u)[tokens]
  if model.readout is not None and model.config.readout_bias:
    out += np.asarray(model.readout.bias[...])[tokens]
  return out


@pytest.mark.parametrize("name", DECODERS)
def test_head_terms_add_up_to_the_attention_and_the_stream_to_the_logits(
    loaded, name):  # noqa: F811
  model = loaded(name)
  c = model.config
  tokens = np.asarray(TOKENS)
  terms, final = ll.head_results(model, TOKENS)  # [L, H, B, T, D]
  assert terms.shape == (c.num_layers, c.num_heads) + TOKENS.shape + (
      c.d_model,)
  sites = tuple(f"blocks.{l}.attn_out" for l in range(c.num_layers))
  logits, acts = model(TOKENS, capture=sites)
  for l, block in enumerate(model.blocks):
    want = np.asarray(acts[sites[l]], np.float64)
    if hasattr(block.attn, "b_o"):  # no head's (not in the families' sandwiches)
      want = want - np.asarray(block.attn.b_o[...])
    assert rel(jnp.sum(terms[l], 0), want) < 64 * U32, l
  # The whole stream read out with the frozen scale, plus the biases, is
  # the model's logit of each token (before Gemma 2's final soft cap).
  u = ll.unembed_directions(model, TOKENS)  # [B, T, D]
  got = np.asarray(ll.direct_logits(model, final, final, u)) + _bias_terms(
      model, tokens)
  if c.final_soft_cap is not None:  # the same weights without the cap
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: mha_jax.DecoderLM(
        c.replace(final_soft_cap=None), rngs=nnx.Rngs(0))))
    logits = nnx.merge(graphdef, nnx.state(model))(TOKENS)
  want = np.take_along_axis(np.asarray(logits, np.float64),
                            tokens[..., None], -1)[..., 0]
  assert rel(got, want) < 64 * U32
  # Per-head attribution is the heads' terms read out the same way.
  dla = ll.head_logit_attribution(model, TOKENS, u)  # [L, H, B, T]
  np.testing.assert_allclose(dla, ll.direct_logits(model, terms, final, u),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_attribution_is_transformer_lens_formula(loaded, name):  # noqa: F811
  """Head h's result, centred (LayerNorm), divided by the FULL final
  stream's sigma (or rms), times the final norm's scale, dotted with the
  readout's column of the token: NumPy, in float64."""
  model = loaded(name)
  c = model.config
  n = c.num_layers
  sites = tuple(f"blocks.{l}.attn.result" for l in range(n)) + (
      f"blocks.{n - 1}.resid_post",)
  _, acts = model(TOKENS, capture=sites)
  x = np.asarray(acts[sites[-1]], np.float64)  # [B, T, D]
  g = np.asarray(model.final_ln.scale[...], np.float64)
  w_u = np.asarray(model.embed.embed.embedding[...].T if model.readout is None
                   else model.readout.kernel[...], np.float64)
  col = np.moveaxis(w_u[:, np.asarray(TOKENS)], 0, -1)  # [B, T, D]
  want = np.zeros((n, c.num_heads) + TOKENS.shape)
  for l in range(n):
    r = np.asarray(acts[sites[l]], np.float64)  # [B, T, H, D]
    if c.norm == "layer":
      r = r - r.mean(-1, keepdims=True)
      sigma = np.sqrt(x.var(-1) + c.norm_eps)
    else:
      sigma = np.sqrt((x * x).mean(-1) + c.norm_eps)
    want[l] = np.moveaxis(np.einsum("bthd,btd->bth", r * g, col)
                          / sigma[..., None], -1, 0)
  got = ll.head_logit_attribution(
      model, TOKENS, ll.unembed_directions(model, TOKENS))
  assert rel(got, want) < 64 * U32


def test_logit_difference_is_the_difference_of_the_logits(
    loaded):  # noqa: F811
  model = loaded("llama")
  correct, wrong = jnp.asarray([5, 7]), jnp.asarray([9, 11])  # [B]
  diff = ll.head_logit_attribution(
      model, TOKENS, ll.logit_diff_directions(model, correct, wrong))
  a = ll.head_logit_attribution(model, TOKENS,
                                ll.unembed_directions(model, correct))
  b = ll.head_logit_attribution(model, TOKENS,
                                ll.unembed_directions(model, wrong))
  np.testing.assert_allclose(diff, a - b, rtol=1e-5, atol=1e-5)


def test_bad_input_is_named(loaded):  # noqa: F811
  model = loaded("llama")
  terms, final = ll.head_results(model, TOKENS)
  with pytest.raises(ValueError, match=re.escape(
      "direct_logits: `directions` must be [D], [B, D] or [B, T, D] with "
      "B=2, T=12, D=32, got shape [3, 32]")):
    ll.direct_logits(model, terms, final, jnp.ones((3, 32)))
  with pytest.raises(ValueError, match=re.escape(
      "direct_logits: `terms` must be [..., B, T, D] with [B, T, D] = "
      "`final_stream`'s shape [2, 12, 32], got [2, 11, 32]")):
    ll.direct_logits(model, final[:, 1:], final, jnp.ones(32))
  with pytest.raises(ValueError, match=re.escape(
      "unembed_directions: `tokens` must be ids in [0, V=300), got min 3, "
      "max 300")):
    ll.unembed_directions(model, jnp.asarray([3, 300]))
  with pytest.raises(ValueError, match=re.escape(
      "logit_diff_directions: `correct` and `wrong` must have one shape, "
      "got [2] and [3]")):
    ll.logit_diff_directions(model, jnp.asarray([1, 2]),
                             jnp.asarray([1, 2, 3]))
  post = mha_jax.DecoderLM(mha_jax.ModelConfig(
      vocab_size=16, d_model=8, num_layers=1, num_heads=2, max_len=8,
      norm_placement="post"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=re.escape(
      "head_results: a term's direct effect needs a residual stream that is "
      "the sum of what was written to it; the model has norm_placement="
      "'post', embed_norm=False")):
    ll.head_results(post, TOKENS[:, :8] % 16)
  with pytest.raises(TypeError, match=re.escape(
      "logit_lens: `model` must be a DecoderLM, got Encoder")):
    ll.logit_lens(loaded("bert"), TOKENS)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_attribution_equals_the_cache_path(loaded, name):  # noqa: F811
  """The same attribution through TransformerLens's other route: the
  cache's per-head results through `apply_ln_to_stack`, dotted with the
  readout's columns (the two share one frozen norm; this pins the
  wiring around it: head order, result site, final stream)."""
  model = loaded(name)
  c = model.config
  target = TOKENS[:, -1]
  direct = ll.head_logit_attribution(model, TOKENS,
                                     ll.unembed_directions(model, target))
  _, cache = model.run_with_cache(TOKENS)
  normed = cache.apply_ln_to_stack(cache.stack_head_results(), model)
  u = np.asarray(ll.unembed_directions(model, target))  # [B, D]
  via_cache = np.einsum("nbtd,bd->nbt", np.asarray(normed), u)
  np.testing.assert_allclose(
      via_cache.reshape(c.num_layers, c.num_heads, *TOKENS.shape), direct,
      rtol=1e-5, atol=1e-5)
