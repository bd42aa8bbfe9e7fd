"""Hook sites: capture never changes a bit, patches do what they say.

A tiny DecoderLM (2 layers, 4 heads, GQA, biases, MLPs) so that every site
exists. References are independent where one exists: `head_mask`, the
model's own weights (W^O, b_o), the uncached forward, a Python loop for
`jax.vmap`, finite differences for gradients.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mha_jax
from mha_jax.core import attention
from mha_jax import hooks
from mha_jax.models import transformer

V, D, L, H, K, T = 11, 16, 2, 4, 2, 6


def _model(implementation="einsum", positions="rotary", **kw):
  config = transformer.ModelConfig(
      vocab_size=V, d_model=D, num_layers=L, num_heads=H, num_kv_heads=K,
      max_len=8, positions=positions, use_bias=True, attention_only=False,
      implementation=implementation, **kw)
  return transformer.DecoderLM(config, rngs=nnx.Rngs(0))


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("capture", "return_weights"))
def _run(graphdef, state, tokens, patch=None, capture=(),
         return_weights=False, head_mask=None):
  return nnx.merge(graphdef, state)(tokens, patch=patch, capture=capture,
                                    return_weights=return_weights,
                                    head_mask=head_mask)


def run(model, tokens, **kw):
  """`model(tokens, **kw)` compiled; capture names must be a tuple."""
  return _run(*nnx.split(model), tokens, **kw)


def _tokens(seed=0, b=3):
  return jax.random.randint(jax.random.key(seed), (b, T), 1, V)


MODEL = _model()
TOKENS = _tokens()
ALL_SITES = MODEL.hook_names()


def test_site_names_follow_transformer_lens():
  per_layer = ("resid_pre", "attn.q", "attn.k", "attn.v", "attn.scores",
               "attn.pattern", "attn.z", "attn.result", "attn_out",
               "resid_mid", "mlp_out", "resid_post")
  assert ALL_SITES == tuple(f"blocks.{l}.{s}" for l in range(L)
                            for s in per_layer)
  attn_only = transformer.DecoderLM(
      MODEL.config.replace(attention_only=True), rngs=nnx.Rngs(0))
  assert "blocks.0.mlp_out" not in attn_only.hook_names()
  assert "blocks.0.resid_post" in attn_only.hook_names()


# "pallas_tpu" needs lengths in whole blocks of 128; tests/core/test_pallas.py.
# "pallas_gpu" takes no dense mask and runs interpreted off GPU;
# tests/core/test_pallas_gpu.py.
@pytest.mark.parametrize("implementation", sorted(
    set(attention.PATHS) - {"pallas_tpu", "pallas_gpu"}))
def test_capture_is_bit_identical_on_every_implementation(implementation):
  if implementation == "cudnn" and jax.default_backend() != "gpu":
    pytest.skip("'cudnn' needs a CUDA GPU (see mha_jax/core/kernels/xla.py)")
  if implementation == "cudnn":
    pytest.skip("cuDNN's attention takes float16/bfloat16 only and this "
                "model is float32; tests/core/test_flash.py::"
                "test_cudnn_equals_the_reference_in_bf16 checks cuDNN")
  model = _model(implementation)
  sites = model.hook_names()
  if not attention.forms_weights(implementation):
    assert not any(s.endswith(("scores", "pattern")) for s in sites)
  plain = run(model, TOKENS)
  logits, acts = run(model, TOKENS, capture=sites)
  np.testing.assert_array_equal(logits, plain)
  assert set(acts) == set(sites)
  b = TOKENS.shape[0]
  shapes = {"q": (b, T, H, D // H), "k": (b, T, K, D // H),
            "v": (b, T, K, D // H), "z": (b, T, H, D // H),
            "result": (b, T, H, D), "scores": (b, H, T, T),
            "pattern": (b, H, T, T)}
  for name, arr in acts.items():
    assert arr.shape == shapes.get(name.rsplit(".", 1)[-1], (b, T, D)), name


@pytest.mark.parametrize("implementation", ["flash", "xla", "auto"])
def test_weightless_paths_refuse_scores_and_pattern(implementation):
  model = _model(implementation)
  for site in ("blocks.0.attn.pattern", "blocks.1.attn.scores"):
    with pytest.raises(ValueError, match=rf"(?s){implementation}.*einsum"):
      model(TOKENS, capture=(site,))
  with pytest.raises(ValueError, match="with_implementation"):
    model(TOKENS, return_weights=True)
  # The way out the message names: same weights, a path that forms them.
  einsum = transformer.with_implementation(model, "einsum")
  np.testing.assert_allclose(run(einsum, TOKENS), run(model, TOKENS),
                             rtol=1e-5, atol=1e-5)
  assert run(einsum, TOKENS, capture=("blocks.0.attn.pattern",))[1][
      "blocks.0.attn.pattern"].shape == (3, H, T, T)


def test_captured_values_agree_with_the_models_own_weights():
  _, acts = run(MODEL, TOKENS, capture=ALL_SITES)
  for l in range(L):
    p = f"blocks.{l}."
    pattern = acts[p + "attn.pattern"]
    # pattern = softmax(scores); masked keys -inf in scores, 0 in pattern.
    np.testing.assert_allclose(pattern, jax.nn.softmax(
        acts[p + "attn.scores"], axis=-1), rtol=1e-6, atol=1e-7)
    upper = np.triu(np.ones((T, T), bool), k=1)
    assert np.all(np.isneginf(np.asarray(acts[p + "attn.scores"])[..., upper]))
    # z: each query head mixes the values of its kv head (i // (H / K)).
    v = jnp.repeat(acts[p + "attn.v"], H // K, axis=2)  # [B, T, H, Dv]
    np.testing.assert_allclose(
        acts[p + "attn.z"], jnp.einsum("bhqk,bkhd->bqhd", pattern, v),
        rtol=1e-5, atol=1e-6)
    # Sum of the heads' results plus b_o is the attention output.
    b_o = MODEL.blocks[l].attn.b_o[...][None, None]
    np.testing.assert_allclose(acts[p + "attn.result"].sum(2) + b_o,
                               acts[p + "attn_out"], rtol=1e-5, atol=1e-6)
    # The residual stream adds up.
    np.testing.assert_allclose(
        acts[p + "resid_pre"] + acts[p + "attn_out"], acts[p + "resid_mid"],
        rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        acts[p + "resid_mid"] + acts[p + "mlp_out"], acts[p + "resid_post"],
        rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(acts["blocks.0.resid_post"],
                                acts["blocks.1.resid_pre"])


def test_return_weights_is_the_captured_pattern():
  _, w = run(MODEL, TOKENS, return_weights=True)
  _, acts = run(MODEL, TOKENS, capture=("blocks.1.attn.pattern",))
  np.testing.assert_array_equal(w["self"][1], acts["blocks.1.attn.pattern"])


def test_patching_a_site_with_its_own_value_changes_no_bit():
  logits, acts = run(MODEL, TOKENS, capture=ALL_SITES)
  graphdef, state = nnx.split(MODEL)

  # One compiled program for every site: site i is patched with its
  # captured value where `which == i` (jnp.where passes it through
  # exactly) and left alone elsewhere.
  @jax.jit
  def patched(which):
    patch = {site: functools.partial(
        lambda x, i, value: jnp.where(which == i, value, x), i=i,
        value=acts[site]) for i, site in enumerate(ALL_SITES)}
    return nnx.merge(graphdef, state)(TOKENS, patch=patch)

  for i, site in enumerate(ALL_SITES):
    np.testing.assert_array_equal(patched(i), logits, err_msg=site)


def test_zero_patch_of_one_heads_z_equals_head_mask():
  gates = jnp.ones((L, H)).at[1, 2].set(0.0)
  masked = run(MODEL, TOKENS, head_mask=gates)
  patched = run(MODEL, TOKENS, patch=hooks.ablate("blocks.1.attn.z", heads=2))
  np.testing.assert_array_equal(patched, masked)
  assert not np.allclose(masked, run(MODEL, TOKENS))


def test_patching_result_moves_the_output_by_the_change():
  _, acts = run(MODEL, TOKENS, capture=("blocks.0.attn.result",
                                        "blocks.0.attn_out"))
  delta = jax.random.normal(jax.random.key(5), acts["blocks.0.attn.result"]
                            .shape)
  _, new = run(MODEL, TOKENS, capture=("blocks.0.attn_out",), patch={
      "blocks.0.attn.result": acts["blocks.0.attn.result"] + delta})
  np.testing.assert_allclose(new["blocks.0.attn_out"],
                             acts["blocks.0.attn_out"] + delta.sum(2),
                             rtol=1e-5, atol=1e-5)


def test_replace_one_head_at_one_position_from_another_run():
  other = _tokens(seed=1)
  site = "blocks.0.attn.z"
  _, clean = run(MODEL, other, capture=(site,))
  _, base = run(MODEL, TOKENS, capture=(site,))
  _, got = run(MODEL, TOKENS, capture=(site,), patch=hooks.replace(
      site, clean[site], heads=2, positions=4))
  want = np.asarray(base[site]).copy()
  want[:, 4, 2] = np.asarray(clean[site])[:, 4, 2]
  np.testing.assert_array_equal(got[site], want)
  # Positions before 4 cannot see the change (causal).
  logits_a = run(MODEL, TOKENS)
  logits_b = run(MODEL, TOKENS, patch=hooks.replace(
      site, clean[site], heads=2, positions=4))
  np.testing.assert_array_equal(logits_a[:, :4], logits_b[:, :4])
  assert not np.allclose(logits_a[:, 4:], logits_b[:, 4:])


def test_function_patch_sees_the_clean_activation():
  seen = {}

  def double(pattern):
    seen["pattern"] = pattern
    return pattern * 2.0

  site = "blocks.1.attn.pattern"
  _, clean = run(MODEL, TOKENS, capture=(site,))
  graphdef, state = nnx.split(MODEL)
  logits, acts, seen = jax.jit(lambda s: nnx.merge(graphdef, s)(
      TOKENS, capture=(site,), patch={site: double}) + (seen,))(state)
  np.testing.assert_allclose(seen["pattern"], clean[site], rtol=1e-6)
  np.testing.assert_allclose(acts[site], 2 * clean[site], rtol=1e-6)
  assert not np.allclose(logits, run(MODEL, TOKENS))


def test_gradient_with_respect_to_z_is_attribution():
  """d loss / d z, contracted with z, is d loss / d head gate (chain rule
  through `head_mask`, an independent route to the same number)."""
  site = "blocks.1.attn.z"
  graphdef, state = nnx.split(MODEL)
  targets = jnp.roll(TOKENS, -1, axis=1)

  def loss(logits):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits),
                                         targets[..., None], -1))

  @jax.jit
  def from_z(z):
    return loss(nnx.merge(graphdef, state)(TOKENS, patch={site: z}))

  @jax.jit
  def from_gates(gates):
    return loss(nnx.merge(graphdef, state)(TOKENS, head_mask=gates))

  z = run(MODEL, TOKENS, capture=(site,))[1][site]
  grad_z = jax.grad(from_z)(z)  # [B, T, H, Dv]
  grad_gate = jax.grad(from_gates)(jnp.ones((L, H)))
  np.testing.assert_allclose(jnp.einsum("bthd,bthd->h", grad_z, z),
                             grad_gate[1], rtol=1e-4, atol=1e-6)
  # And the gradient itself against central differences on one entry.
  eps = 1e-2
  bump = jnp.zeros_like(z).at[0, 5, 1, 0].set(eps)
  fd = (from_z(z + bump) - from_z(z - bump)) / (2 * eps)
  np.testing.assert_allclose(grad_z[0, 5, 1, 0], fd, rtol=2e-2, atol=1e-5)


def test_vmap_over_patch_values_equals_a_loop():
  site = "blocks.0.attn.z"
  _, acts = run(MODEL, TOKENS, capture=(site,))
  graphdef, state = nnx.split(MODEL)
  # One patched forward per head, batched with vmap over the head index.
  def patched(head):
    sel = (jnp.arange(H) == head)[None, None, :, None]
    z = jnp.where(sel, 0.0, acts[site])
    return nnx.merge(graphdef, state)(TOKENS, patch={site: z})

  batched = jax.jit(jax.vmap(patched))(jnp.arange(H))
  for h in range(H):
    np.testing.assert_allclose(
        batched[h], run(MODEL, TOKENS, patch=hooks.ablate(site, heads=h)),
        rtol=1e-5, atol=1e-6)


def test_same_site_set_never_retraces():
  graphdef, state = nnx.split(MODEL)

  @functools.partial(jax.jit, static_argnames="capture")
  @chex.assert_max_traces(n=1)
  def f(state, tokens, z, capture):
    return nnx.merge(graphdef, state)(tokens, capture=capture,
                                      patch={"blocks.0.attn.z": z})

  z = jnp.zeros((3, T, H, D // H))
  for seed in range(3):
    f(state, _tokens(seed), z + seed, capture=("blocks.1.attn.pattern",))


def test_bad_names_and_values_fail_naming_the_site():
  with pytest.raises(ValueError, match=r"blocks\.0\.attn\.zz.*blocks\.0"):
    MODEL(TOKENS, capture=("blocks.0.attn.zz",))
  with pytest.raises(ValueError, match=r"blocks\.7\.attn\.z"):
    MODEL(TOKENS, patch={"blocks.7.attn.z": jnp.zeros(3)})
  attn_only = transformer.DecoderLM(
      MODEL.config.replace(attention_only=True), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError) as err:
    attn_only(TOKENS, capture=("blocks.0.mlp_out",))
  assert str(err.value) == (
      "unknown hook site 'blocks.0.mlp_out'; this model has "
      f"{len(attn_only.hook_names())} sites, listed by `model.hook_names()`")
  z = jnp.zeros((3, T, H, D // H))
  with pytest.raises(ValueError, match=r"blocks\.0\.attn\.z.*float32\[3, 6, "
                     r"4, 4\]"):
    MODEL(TOKENS, patch={"blocks.0.attn.z": z[:, :, :2]})
  with pytest.raises(ValueError, match=r"blocks\.0\.attn\.z.*bfloat16"):
    MODEL(TOKENS, patch={"blocks.0.attn.z": z.astype(jnp.bfloat16)})
  with pytest.raises(ValueError, match=r"blocks\.0\.attn\.z.*function"):
    MODEL(TOKENS, patch={"blocks.0.attn.z": lambda z: z[..., :1]})


def test_capture_during_cached_decoding_equals_the_full_forward():
  site = "blocks.1.attn.pattern"
  graphdef, state = nnx.split(MODEL)

  @jax.jit
  def decode(state, tokens):
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(tokens.shape[0], T)
    _, cache, first = model(tokens[:, :3], cache=cache, capture=(site,))
    rows = [first[site]]
    for t in range(3, T):
      _, cache, acts = model(tokens[:, t:t + 1], cache=cache,
                             capture=(site, "blocks.0.attn.z"))
      rows.append(acts[site])
    return rows

  rows = decode(state, TOKENS)
  _, full = run(MODEL, TOKENS, capture=(site,))
  # The prefill's pattern over slots [3 queries, T slots]; later steps one
  # query row each. Unwritten slots get weight 0, as future keys do.
  np.testing.assert_allclose(rows[0], full[site][:, :, :3], rtol=1e-5,
                             atol=1e-6)
  for t, row in zip(range(3, T), rows[1:]):
    np.testing.assert_allclose(row[:, :, 0], full[site][:, :, t], rtol=1e-5,
                               atol=1e-6)


def test_encoder_decoder_sites_and_head_masks():
  config = transformer.ModelConfig(vocab_size=V, d_model=D, num_layers=L,
                                   num_heads=H, max_len=8,
                                   implementation="vmap")
  model = transformer.EncoderDecoder(config, rngs=nnx.Rngs(1))
  names = model.hook_names()
  assert "encoder.blocks.1.attn.pattern" in names
  assert "decoder.blocks.0.cross.z" in names
  assert "decoder.blocks.0.cross_out" in names
  src, tgt = _tokens(2, b=2), _tokens(3, b=2)
  logits, acts, w = model(src, tgt, return_weights=True, capture=(
      "decoder.blocks.1.cross.pattern", "encoder.blocks.0.attn.pattern"))
  np.testing.assert_array_equal(acts["decoder.blocks.1.cross.pattern"],
                                w["cross"][1])
  np.testing.assert_array_equal(acts["encoder.blocks.0.attn.pattern"],
                                w["encoder"][0])
  gates = jnp.ones((L, H)).at[0, 3].set(0.0)
  np.testing.assert_array_equal(
      model(src, tgt, cross_head_mask=gates),
      model(src, tgt, patch=hooks.ablate("decoder.blocks.0.cross.z",
                                         heads=3)))
  assert not np.allclose(model(src, tgt, cross_head_mask=gates), logits)


def test_pure_function_and_module_take_the_same_hooks():
  params = mha_jax.init_mha_params(jax.random.key(0), D, H, num_kv_heads=K,
                                   use_bias=True)
  x = jax.random.normal(jax.random.key(1), (2, 5, D))
  y, acts = mha_jax.multi_head_attention(
      params, x, is_causal=True, capture=("pattern", "result"))
  np.testing.assert_array_equal(
      y, mha_jax.multi_head_attention(params, x, is_causal=True))
  np.testing.assert_allclose(
      acts["result"].sum(2) + params["b_o"][None, None], y, rtol=1e-5,
      atol=1e-6)
  with pytest.raises(ValueError, match="flash"):
    mha_jax.multi_head_attention(params, x, implementation="flash",
                                 capture=("pattern",))
  with pytest.raises(ValueError, match="unknown hook site 'zz'"):
    mha_jax.multi_head_attention(params, x, capture=("zz",))
  # The module: a Hooks object scoped by the caller.
  layer = mha_jax.MultiHeadAttention(
      mha_jax.AttentionSpec(D, H, num_kv_heads=K, causal=True),
      rngs=nnx.Rngs(params=2))
  h = hooks.Hooks(capture=("attn.z",)).scope("attn")
  y_mod, _ = layer(x, hooks=h)
  assert h.captured["attn.z"].shape == (2, 5, H, D // H)
  np.testing.assert_array_equal(y_mod, layer(x)[0])


# -------------------------------------------- indices and values of a patch


def _raises_both_ways(patch, match):
  """The same error eagerly and under jit (raised while tracing, from the
  static shapes, before anything reaches XLA)."""
  with pytest.raises(ValueError, match=match):
    MODEL(TOKENS, patch=patch)
  with pytest.raises(ValueError, match=match):
    run(MODEL, TOKENS, patch=patch)


def test_an_index_past_either_end_fails_naming_site_axis_size_and_value():
  # Each of these used to patch nothing and return the clean logits.
  z = r"of z \[B, Tq, H, Dv\]=\[3, 6, 4, 4\], of size"
  _raises_both_ways(hooks.ablate("blocks.0.attn.z", heads=H),
                    rf"'blocks\.0\.attn\.z': `heads`=4, out of range for "
                    rf"axis 2 \(H\) {z} 4: use 0\.\.3, or -4\.\.-1")
  _raises_both_ways(hooks.ablate("blocks.1.attn.z", heads=-H - 1),
                    r"'blocks\.1\.attn\.z': `heads`=-5, .*axis 2 \(H\)")
  _raises_both_ways(hooks.ablate("blocks.0.attn.z", positions=T),
                    rf"'blocks\.0\.attn\.z': `positions`=6, out of range for "
                    rf"axis 1 \(Tq\) {z} 6: use 0\.\.5, or -6\.\.-1")
  _raises_both_ways(hooks.ablate("blocks.0.attn.z", positions=[1, -T - 1]),
                    r"`positions`=\[1, -7\] holds -7, out of range for axis 1")
  # k and v count kv heads, and say how a query head maps to one (a
  # query-head index is the likely mistake there); scores and pattern put
  # the heads first.
  _raises_both_ways(hooks.ablate("blocks.0.attn.k", heads=K),
                    r"'blocks\.0\.attn\.k': `heads`=2, out of range for axis "
                    r"2 \(K\) of k \[B, Tk, K, Dh\]=\[3, 6, 2, 4\], of size 2: "
                    r"use 0\.\.1, or -2\.\.-1 counting from the end; k holds "
                    r"the K kv heads, not the H query heads: query head h "
                    r"reads kv head h // \(H // K\) "
                    r"\(`hooks\.kv_head\(h, H, K\)`\)")
  with pytest.raises(ValueError, match=r"of size 4: use 0\.\.3, or -4\.\.-1 "
                     r"counting from the end(?!;)"):  # no kv note on z
    run(MODEL, TOKENS, patch=hooks.ablate("blocks.0.attn.z", heads=H))
  _raises_both_ways(hooks.ablate("blocks.1.attn.pattern", positions=40),
                    r"`positions`=40, out of range for axis 2 \(Tq\) of "
                    r"pattern \[B, H, Tq, Tk\]=\[3, 4, 6, 6\], of size 6")
  _raises_both_ways(hooks.ablate("blocks.0.resid_post", positions=T),
                    r"'blocks\.0\.resid_post': `positions`=6, out of range "
                    r"for axis 1 \(T\) of resid_post \[B, T, D\]=\[3, 6, 16\]")
  # The ends themselves are in range: -H is head 0 and -T position 0, as
  # in Python.
  for site, kw, same in (("blocks.0.attn.z", {"heads": -H}, {"heads": 0}),
                         ("blocks.0.attn.z", {"positions": [-T, 2]},
                          {"positions": [0, 2]})):
    np.testing.assert_array_equal(
        run(MODEL, TOKENS, patch=hooks.ablate(site, **kw)),
        run(MODEL, TOKENS, patch=hooks.ablate(site, **same)))


def test_negative_indices_count_from_the_end_as_in_python():
  site = "blocks.1.attn.z"
  from_end = run(MODEL, TOKENS, patch=hooks.ablate(site, heads=-1,
                                                   positions=[-2, 0]))
  np.testing.assert_array_equal(from_end, run(MODEL, TOKENS, patch=hooks.ablate(
      site, heads=H - 1, positions=[T - 2, 0])))
  assert not np.allclose(from_end, run(MODEL, TOKENS))


def test_replace_takes_the_slice_an_int_index_picks():
  """`z[:, :, h]` with `heads=h` (and `z[:, t, h]` with both) patch what
  the whole `z` does; a value of another shape fails by name."""
  site = "blocks.0.attn.z"
  _, clean = run(MODEL, _tokens(seed=1), capture=(site,))
  z = clean[site]  # [B, T, H, Dv]
  whole = run(MODEL, TOKENS, patch=hooks.replace(site, z, heads=2,
                                                 positions=4))
  for value in (z[:, 4, 2], z[:, :, 2]):
    np.testing.assert_array_equal(run(MODEL, TOKENS, patch=hooks.replace(
        site, value, heads=2, positions=4)), whole)
  one_head = run(MODEL, TOKENS, patch=hooks.replace(site, z[:, :, 2],
                                                    heads=2))
  np.testing.assert_array_equal(one_head, run(
      MODEL, TOKENS, patch=hooks.replace(site, z, heads=2)))
  # An axis of size 1 broadcasts: a mean over the batch with keepdims, and
  # one example's slice patched into every example.
  for value in (z.mean(0, keepdims=True), z[:1, :, 2]):
    full = jnp.broadcast_to(value if value.ndim == 4 else value[:, :, None],
                            z.shape)
    np.testing.assert_array_equal(
        run(MODEL, TOKENS, patch=hooks.replace(site, value, heads=2)),
        run(MODEL, TOKENS, patch=hooks.replace(site, full, heads=2)))
  # A wrong T, or a slice where `heads` is a list: refused, not broadcast.
  shapes = r"\[B, Tq, H, Dv\]=\[3, 6, 4, 4\]"
  _raises_both_ways(hooks.replace(site, z[:, :4], heads=1),
                    rf"'blocks\.0\.attn\.z': `replace`'s value has shape "
                    rf"\[3, 4, 4, 4\], which must be a scalar or fit {shapes} "
                    rf"or \[B, Tq, Dv\]=\[3, 6, 4\]")
  _raises_both_ways(hooks.replace(site, z[:, :, 1], heads=[1, 2]),
                    rf"'blocks\.0\.attn\.z': `replace`'s value has shape "
                    rf"\[3, 6, 4\], which must be a scalar or fit {shapes} "
                    r"\(an axis of size 1 broadcasts\)")


def test_a_mistyped_site_is_named_before_anything_about_its_axes():
  for make in (lambda: hooks.ablate("blocks.0.attn.zz", heads=1),
               lambda: hooks.replace("blocks.0.attn.zz", 0.0, positions=2)):
    with pytest.raises(ValueError, match=r"unknown hook site "
                       r"'blocks\.0\.attn\.zz' \(did you mean "
                       r"'blocks\.0\.attn\.z'\?\); a site name ends in one of"):
      make()
  with pytest.raises(ValueError, match=r"'blocks\.0\.resid_pre' has no head "
                     "axis"):
    hooks.ablate("blocks.0.resid_pre", heads=1)
  # The model's own check suggests the same name among its sites, and
  # says where the rest are rather than printing every one.
  with pytest.raises(ValueError) as err:
    MODEL(TOKENS, capture=("blocks.1.attn.patern",))
  n = len(MODEL.hook_names())
  assert n > hooks.LISTED_SITES
  assert str(err.value) == (
      "unknown hook site 'blocks.1.attn.patern' (did you mean "
      f"'blocks.1.attn.pattern'?); this model has {n} sites, listed by "
      "`model.hook_names()`")


def test_a_few_valid_sites_are_listed_whole():
  params = mha_jax.init_mha_params(jax.random.key(0), 8, 2)
  with pytest.raises(ValueError) as err:
    mha_jax.multi_head_attention(params, jnp.ones((1, 3, 8)),
                                 capture=("zz",))
  assert str(err.value).startswith("unknown hook site 'zz' (did you mean "
                                   "'z'?); this model has: ")
  listed = str(err.value).rpartition("this model has: ")[2].split(", ")
  assert "z" in listed and "pattern" in listed
  assert len(listed) <= hooks.LISTED_SITES


def test_every_site_name_ends_in_a_known_kind():
  """`replace` reads a site's axes from its last part, so the models'
  names and the hooks' list of kinds must agree."""
  config = transformer.ModelConfig(vocab_size=V, d_model=D, num_layers=1,
                                   num_heads=H, max_len=8)
  names = MODEL.hook_names() + transformer.EncoderDecoder(
      config, rngs=nnx.Rngs(0)).hook_names()
  kinds = {n.rsplit(".", 1)[-1] for n in names}
  assert kinds == set(hooks.ATTENTION_SITES + hooks.BLOCK_SITES)


# ------------------------------------------- where q and k sit, patch order


def _scores_of(q, k):
  """Scaled q.k `[B, H, T, T]` of q `[B, T, H, Dh]`, k `[B, T, K, Dh]`
  (query head i reads kv head i // (H / K)), -inf above the diagonal."""
  k = jnp.repeat(k, H // K, axis=2)
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  return jnp.where(np.tril(np.ones((T, T), bool)), s, -jnp.inf)


def test_captured_and_patched_q_and_k_are_after_rotary():
  """The scores are the captured q.k: captured before rotary they would
  not be (the model is rotary). A patched q or k is what the scores see,
  not rotated again (a fixed value from another run, which a rotation
  does not commute with)."""
  assert MODEL.config.positions == "rotary"
  _, acts = run(MODEL, TOKENS, capture=ALL_SITES)
  for l in range(L):
    p = f"blocks.{l}.attn."
    np.testing.assert_allclose(acts[p + "scores"],
                               _scores_of(acts[p + "q"], acts[p + "k"]),
                               rtol=1e-5, atol=1e-5, err_msg=p)
  _, other = run(MODEL, _tokens(seed=1), capture=ALL_SITES)
  sites = ("blocks.0.attn.k", "blocks.0.attn.scores", "blocks.1.attn.q",
           "blocks.1.attn.k", "blocks.1.attn.scores")
  _, got = run(MODEL, TOKENS, capture=sites, patch={
      "blocks.0.attn.q": other["blocks.0.attn.q"],
      "blocks.1.attn.k": other["blocks.1.attn.k"]})
  np.testing.assert_allclose(
      got["blocks.0.attn.scores"],
      _scores_of(other["blocks.0.attn.q"], got["blocks.0.attn.k"]),
      rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      got["blocks.1.attn.scores"],
      _scores_of(got["blocks.1.attn.q"], other["blocks.1.attn.k"]),
      rtol=1e-5, atol=1e-5)


def test_head_mask_gates_z_before_a_patch_of_the_same_site():
  """`Hooks.extend`'s promise: the new patch (head_mask's gate) runs
  first, the user's own after it. A head the mask zeroes and the user
  then replaces holds the user's value (gated after, it would be 0)."""
  site = "blocks.1.attn.z"
  gates = jnp.ones((L, H)).at[1, 2].set(0.0).at[1, 0].set(0.5)
  _, clean = run(MODEL, TOKENS, capture=(site,))
  _, other = run(MODEL, _tokens(seed=1), capture=(site,))
  _, got = run(MODEL, TOKENS, capture=(site,), head_mask=gates,
               patch=hooks.replace(site, other[site], heads=2))
  want = np.asarray(clean[site]) * np.asarray(gates[1])[:, None]
  want[:, :, 2] = other[site][:, :, 2]
  np.testing.assert_allclose(got[site], want, rtol=1e-6, atol=1e-7)
  # The order in `extend` itself, with two functions that do not commute.
  h = hooks.Hooks(patch={"z": lambda x: x + 1.0}).extend(
      patch={"z": lambda x: x * 3.0})
  np.testing.assert_array_equal(h("z", jnp.ones(2)), jnp.full(2, 4.0))
