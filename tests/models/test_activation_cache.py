"""ActivationCache on tiny models: indexing, the decomposition against
the captured stream, apply_ln_to_stack against NumPy by hand, and the
cache through jax.jit and jax.vmap. The same on loaded checkpoints is in
tests/pretrained/test_text.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mha_jax.models import activation_cache as ac
from mha_jax.models import blocks as blocks_lib
from mha_jax.models import transformer

V, D, L, H, T = 13, 16, 2, 4, 5
TOKENS = jnp.array([[1, 2, 3, 4, 5], [7, 3, 9, 12, 0]])


def _randomize_norms(model, seed):
  """Norm weights and biases away from 1 and 0, so that a dropped
  weight, offset or bias shows."""
  rng = np.random.default_rng(seed)
  for _, node in nnx.iter_graph(model):
    if isinstance(node, (blocks_lib.RMSNorm, nnx.LayerNorm)):
      node.scale[...] = jnp.asarray(rng.normal(0.5, 0.3, D), jnp.float32)
      if getattr(node, "bias", None) is not None:
        node.bias[...] = jnp.asarray(rng.normal(0, 0.3, D), jnp.float32)
  return model


def _lm(seed=0, **kw):
  config = transformer.ModelConfig(**dict(dict(
      vocab_size=V, d_model=D, num_layers=L, num_heads=H, num_kv_heads=2,
      max_len=8, norm_eps=1e-2), **kw))
  return _randomize_norms(
      transformer.DecoderLM(config, rngs=nnx.Rngs(params=seed)), seed)


@functools.partial(jax.jit, static_argnums=0, static_argnames="names")
def _cached(graphdef, state, tokens, names=None):
  return nnx.merge(graphdef, state).run_with_cache(tokens, names)


def run(model, tokens=TOKENS, names=None):
  """`model.run_with_cache` compiled: the cache leaves jax.jit whole."""
  return _cached(*nnx.split(model), tokens, names=names)


MODELS = {"layer_norm": _lm(0),
          "gemma_like": _lm(1, norm="rms", norm_offset=1.0,
                            norm_placement="sandwich"),
          "parallel": _lm(2, parallel_block=True, use_bias=True)}
RUNS = {k: run(m) for k, m in MODELS.items()}


def f64(x):
  return np.asarray(x, np.float64)


# --- indexing -------------------------------------------------------------


def test_keys_are_every_site_in_order_and_values_are_the_captures():
  model = MODELS["layer_norm"]
  logits, cache = RUNS["layer_norm"]
  assert cache.keys() == model.hook_names() and len(cache) == len(
      model.hook_names())
  want_logits, acts = model(TOKENS, capture=("blocks.1.attn.pattern",))
  np.testing.assert_allclose(logits, want_logits, atol=1e-5)
  np.testing.assert_allclose(cache["blocks.1.attn.pattern"],
                             acts["blocks.1.attn.pattern"], atol=1e-6)


def test_short_names_negative_layers_and_transformer_lens_spelling():
  _, cache = RUNS["layer_norm"]
  full = cache["blocks.1.attn.pattern"]
  for key in (("pattern", 1), ("attn", -1), "blocks.1.attn.hook_pattern"):
    assert cache[key] is full, key
  assert cache["attn_scores", 0] is cache["blocks.0.attn.scores"]
  assert cache["blocks.0.hook_resid_pre"] is cache["resid_pre", 0]
  assert ("resid_mid", 1) in cache and ("resid_mid", 2) not in cache
  assert cache.stack("pattern").shape == (L, 2, H, T, T)
  np.testing.assert_array_equal(cache.stack("z", 1)[0], cache["z", 0])


@pytest.mark.parametrize("key, error, message", [
    ("blocks.1.attn.patern", KeyError,
     "ActivationCache: no activation 'blocks.1.attn.patern' (did you mean "
     "'blocks.1.attn.pattern'"),
    (("patern", 1), KeyError, "ActivationCache: unknown short name "
     "'patern' in ('patern', 1); expected one of q, k, v, z, scores"),
    (("pattern", 2), KeyError, "ActivationCache: `layer`=2 is out of range "
     "for a 2-layer model: expected 0..1 or -2..-1"),
    (("pattern", 1.0), TypeError,
     "ActivationCache: `layer` must be an int, got 1.0"),
    (("pattern", 1, "attn"), TypeError, "ActivationCache: a key is a site "
     "name or (short name, layer), got ('pattern', 1, 'attn')"),
])
def test_bad_keys(key, error, message):
  _, cache = RUNS["layer_norm"]
  with pytest.raises(error) as e:
    _ = cache[key]
  assert message in str(e.value)


def test_names_filter_and_refused_keywords():
  model = MODELS["layer_norm"]
  _, cache = run(model, names=("blocks.0.attn.z",))
  assert cache.keys() == ("blocks.0.attn.z",)
  _, cache = model.run_with_cache(TOKENS, lambda n: n.endswith("resid_post"))
  assert cache.keys() == ("blocks.0.resid_post", "blocks.1.resid_post")
  logits, cache = model.run_with_cache(TOKENS, [])
  assert len(cache) == 0 and logits.shape == (2, T, V)
  with pytest.raises(TypeError, match="run_with_cache: `capture` is not "
                     "accepted: name the sites with `names`"):
    model.run_with_cache(TOKENS, capture=("blocks.0.attn.z",))


def test_weightless_path_caches_every_site_it_forms():
  model = transformer.with_implementation(MODELS["layer_norm"], "flash")
  _, cache = run(model)
  assert "blocks.0.attn.z" in cache and ("pattern", 0) not in cache


def test_encoder_run_with_cache():
  config = transformer.ModelConfig(vocab_size=V, d_model=D, num_layers=L,
                                   num_heads=H, max_len=8)
  enc = transformer.Encoder(config, rngs=nnx.Rngs(0))
  out, cache = enc.run_with_cache(TOKENS, ("blocks.1.resid_post",))
  np.testing.assert_allclose(enc.final_ln(cache["resid_post", 1]), out,
                             atol=1e-6)


# --- the decomposition ------------------------------------------------------


def _sum_check(parts, want):
  np.testing.assert_allclose(f64(parts).sum(0), f64(want), rtol=0,
                             atol=2e-5 * np.abs(f64(want)).max())


@pytest.mark.parametrize("name", list(MODELS))
def test_decomposition_sums_to_the_stream(name):
  _, cache = RUNS[name]
  parts, labels = cache.decompose_resid(return_labels=True)
  assert labels == ["embed", "0_attn_out", "0_mlp_out", "1_attn_out",
                    "1_mlp_out"]
  _sum_check(parts, cache["resid_post", 1])
  # Up to block 1's input, and up to its MLP's input.
  _sum_check(cache.decompose_resid(1), cache["resid_pre", 1])
  parts, labels = cache.decompose_resid(1, mlp_input=True,
                                        return_labels=True)
  if name == "parallel":  # the MLP reads the block's input
    assert labels[-1] == "0_mlp_out"
    _sum_check(parts, cache["resid_pre", 1])
  else:
    assert labels[-1] == "1_attn_out"
    _sum_check(parts, cache["resid_mid", 1])
  assert cache.decompose_resid(mode="mlp").shape[0] == 3  # embed + 2


@pytest.mark.parametrize("name", ["layer_norm", "parallel"])
def test_by_head_sums_and_its_remainder_is_the_output_bias(name):
  model = MODELS[name]
  _, cache = RUNS[name]
  parts, labels = cache.decompose_resid(by_head=True, return_labels=True)
  assert labels[:7] == ["embed", "L0H0", "L0H1", "L0H2", "L0H3",
                        "0_attn_bias", "0_mlp_out"]
  _sum_check(parts, cache["resid_post", 1])
  attn = model.blocks[1].attn
  b_o = attn.b_o[...] if hasattr(attn, "b_o") else np.zeros(D)  # [D]
  assert (name == "parallel") == hasattr(attn, "b_o")
  bias = parts[labels.index("1_attn_bias")]
  np.testing.assert_allclose(bias, np.broadcast_to(b_o, bias.shape),
                             atol=2e-6)
  heads, head_labels = cache.stack_head_results(return_labels=True)
  assert head_labels == [l for l in labels if l.startswith("L")]
  np.testing.assert_array_equal(heads[5], cache["result", 1][:, :, 1])


@pytest.mark.parametrize("layout, kw, message", [
    (ac.Layout(2, 4, "post"), {}, "decompose_resid: the model's blocks are "
     "post-norm (norm_placement='post', as BERT's): each block normalises"),
    (ac.Layout(2, 4, "sandwich"), dict(by_head=True), "decompose_resid: "
     "by_head=True is not possible with sandwich blocks (Gemma 2/3)"),
    (ac.Layout(2, 4), dict(mode="heads"), "decompose_resid: `mode` must be "
     "'all', 'attn' or 'mlp', got 'heads'"),
    (ac.Layout(2, 4), dict(mlp_input=True), "decompose_resid: "
     "mlp_input=True needs a block's `layer` in 0..1"),
    (ac.Layout(2, 4), dict(layer=3), "ActivationCache: `layer`=3 is out of "
     "range for a 2-layer model: expected 0..2"),
])
def test_decompose_refusals(layout, kw, message):
  with pytest.raises(ValueError) as e:
    ac.ActivationCache({}, layout).decompose_resid(**kw)
  assert message in str(e.value)


def test_accumulated_resid_and_the_logit_lens():
  model = MODELS["layer_norm"]
  logits, cache = RUNS["layer_norm"]
  stack, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
  assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
  np.testing.assert_array_equal(stack[3], cache["resid_mid", 1])
  lens = cache.accumulated_resid(apply_ln=True, model=model)
  np.testing.assert_allclose(model.logits(lens[-1]), logits, atol=1e-5)
  with pytest.raises(ValueError, match=r"accumulated_resid: apply_ln=True "
                     r"needs `model`, the model whose norm to apply, got "
                     "None"):
    cache.accumulated_resid(apply_ln=True)


# --- apply_ln_to_stack against NumPy ---------------------------------------


def _by_hand(stack, stream, eps, weight, centre):
  """The norm of the full `stream` applied to each component."""
  stack, stream = f64(stack), f64(stream)
  if centre:
    stream = stream - stream.mean(-1, keepdims=True)
    stack = stack - stack.mean(-1, keepdims=True)
  scale = np.sqrt((stream ** 2).mean(-1, keepdims=True) + eps)
  return stack / scale * f64(weight)


def _components(cache, layers):
  """The stream's parts, gathered here from the captured sites."""
  parts = [cache["blocks.0.resid_pre"]]
  for l in range(layers):
    parts += [cache[f"blocks.{l}.attn_out"], cache[f"blocks.{l}.mlp_out"]]
  return jnp.stack(parts)


def test_apply_ln_known_answer_layer_norm():
  model = MODELS["layer_norm"]
  _, cache = RUNS["layer_norm"]
  stack, x = _components(cache, L), cache["resid_post", 1]
  ln = model.final_ln
  w, b = f64(ln.scale[...]), f64(ln.bias[...])
  got = cache.apply_ln_to_stack(stack, model)
  np.testing.assert_allclose(got, _by_hand(stack, x, 1e-2, w, True),
                             rtol=1e-5, atol=1e-5)
  bare = cache.apply_ln_to_stack(stack, model, weight=False)  # TL's
  np.testing.assert_allclose(bare, _by_hand(stack, x, 1e-2, 1.0, True),
                             rtol=1e-5, atol=1e-5)
  # The parts plus the bias are the model's own norm of the stream.
  np.testing.assert_allclose(f64(got).sum(0) + b, ln(x), atol=2e-5)
  # One position: the scale is taken there.
  last = cache.apply_ln_to_stack(stack[:, :, -1], model, pos_slice=-1)
  np.testing.assert_allclose(last, got[:, :, -1], atol=1e-6)


def test_apply_ln_known_answer_gemma_offset_norm():
  model = MODELS["gemma_like"]
  _, cache = RUNS["gemma_like"]
  stack, x = _components(cache, L), cache["resid_post", 1]
  w = 1.0 + f64(model.final_ln.scale[...])  # Gemma's (1 + w)
  got = cache.apply_ln_to_stack(stack, model)
  np.testing.assert_allclose(got, _by_hand(stack, x, 1e-2, w, False),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(f64(got).sum(0), model.final_ln(x), atol=2e-5)
  # Block 1's MLP norm reads resid_mid.
  stack1 = _components(cache, 1)
  stack1 = jnp.concatenate([stack1[:2], cache["attn_out", 1][None]])
  got = cache.apply_ln_to_stack(stack1, model, layer=1, mlp_input=True)
  w1 = 1.0 + f64(model.blocks[1].ln_mlp.scale[...])
  np.testing.assert_allclose(
      got, _by_hand(stack1, cache["resid_mid", 1], 1e-2, w1, False),
      rtol=1e-5, atol=1e-5)


def test_apply_ln_refusals():
  model = MODELS["layer_norm"]
  _, cache = RUNS["layer_norm"]
  with pytest.raises(ValueError, match=r"apply_ln_to_stack: `stack` has "
                     r"shape \[3, 2, 4, 16\], expected \[\.\.\., 2, 5, D\]"):
    cache.apply_ln_to_stack(jnp.zeros((3, 2, 4, D)), model)
  with pytest.raises(TypeError, match="apply_ln_to_stack: expected a model "
                     "or one of its norms"):
    cache.apply_ln_to_stack(jnp.zeros((3, 2, T, D)), object())


# --- through jit and vmap ---------------------------------------------------


def test_cache_goes_through_jit_and_vmap():
  _, cache = RUNS["layer_norm"]
  eager = cache.decompose_resid(by_head=True)
  jitted = jax.jit(lambda c: c.decompose_resid(by_head=True))(cache)
  np.testing.assert_allclose(jitted, eager, atol=1e-6)
  # vmap over the batch axis of every leaf: the cache without its batch.
  per_row = jax.vmap(lambda c: c.stack("pattern"))(cache)  # [B, L, ...]
  np.testing.assert_array_equal(per_row, cache.stack("pattern").swapaxes(0,
                                                                        1))
  leaves = jax.tree_util.tree_leaves_with_path(cache)
  assert jax.tree_util.keystr(leaves[0][0]) == "['blocks.0.resid_pre']"


def test_cache_made_inside_vmap_is_the_batched_one():
  model = MODELS["layer_norm"]
  _, cache = RUNS["layer_norm"]
  graphdef, state = nnx.split(model)
  rows = jax.jit(jax.vmap(lambda t: nnx.merge(graphdef, state)
                          .run_with_cache(t[None])[1]))(TOKENS)
  assert rows.keys() == cache.keys()
  for name in ("blocks.1.attn.pattern", "blocks.1.resid_post"):
    np.testing.assert_allclose(rows[name][:, 0], cache[name], atol=1e-5)
