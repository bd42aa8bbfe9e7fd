"""Weight views: the heads' weights and circuits, checked against what
the model computes (its captured scores, results and embeddings) and
against NumPy's decompositions of the full products."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mha_jax
from mha_jax import hooks
from mha_jax.interp import fold
from mha_jax.interp import weight_views

H, K, DH, V = 4, 2, 2, 16  # Dh = D / H = 8 / 4
CONFIG = mha_jax.ModelConfig(vocab_size=V, d_model=8, num_layers=2,
                             num_heads=H, num_kv_heads=K, max_len=8,
                             norm="rms", mlp_gated=True, mlp_bias=False,
                             implementation="einsum")


def _model():
  model = mha_jax.DecoderLM(CONFIG, rngs=nnx.Rngs(0))
  # RMSNorm scales away from 1, so that folding them matters.
  rng = np.random.default_rng(0)
  for block in model.blocks:
    block.ln_attn.scale[...] = 1 + 0.5 * rng.standard_normal(8, np.float32)
  return fold.fold_layer_norm(model)


MODEL = _model()
W = weight_views.weights(MODEL)
TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, V, (2, 8)))


def test_layouts_and_gqa_pairing_read_the_modules_parameters():
  assert W.W_Q.shape == (2, H, 8, DH) and W.W_O.shape == (2, H, DH, 8)
  assert W.W_K_kv.shape == (2, K, 8, DH) and W.W_K.shape == (2, H, 8, DH)
  assert (W.num_heads, W.num_kv_heads) == (H, K)
  assert W.b_Q is None and W.b_O is None  # no attention biases
  np.testing.assert_array_equal(W.b_U, MODEL.readout.bias[...])
  for l, block in enumerate(MODEL.blocks):
    w_q = np.asarray(block.attn.w_q[...])  # [D, H, Dh]
    w_k = np.asarray(block.attn.w_k[...])  # [D, K, Dh]
    w_v = np.asarray(block.attn.w_v[...])
    for h in range(H):
      np.testing.assert_array_equal(W.W_Q[l, h], w_q[:, h])
      np.testing.assert_array_equal(W.W_K[l, h], w_k[:, h // (H // K)])
      np.testing.assert_array_equal(W.W_V[l, h], w_v[:, h // (H // K)])
  np.testing.assert_array_equal(W.W_pos,
                                MODEL.embed.pos_embed.embedding[...])
  np.testing.assert_array_equal(W.W_U, MODEL.readout.kernel[...])


def test_qk_and_ov_reproduce_the_captured_scores_and_results():
  sites = ("blocks.1.resid_pre", "blocks.1.attn.scores",
           "blocks.1.attn.pattern", "blocks.1.attn.result")
  _, acts = MODEL(TOKENS, capture=sites)
  x = np.asarray(acts[sites[0]], np.float64)  # [B, T, D]
  # The folded norm: x / rms(x), scale 1.
  xh = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + CONFIG.norm_eps)
  qk = np.asarray(W.QK.full()[1], np.float64)  # [H, D, D]
  ov = np.asarray(W.OV.full()[1], np.float64)
  scores = np.einsum("bqd,hde,bke->bhqk", xh, qk, xh) / np.sqrt(DH)
  causal = np.tril(np.ones((8, 8), bool))
  np.testing.assert_allclose(np.asarray(acts[sites[1]])[..., causal],
                             scores[..., causal], rtol=1e-5, atol=1e-5)
  result = np.einsum("bhqk,bkd,hde->bqhe", np.asarray(acts[sites[2]]), xh,
                     ov)
  np.testing.assert_allclose(np.asarray(acts[sites[3]]), result, rtol=1e-5,
                             atol=1e-5)


def test_circuit_spectra_match_numpy_on_the_full_products():
  for circuit, k in ((W.QK, DH), (W.OV, DH)):
    full = np.asarray(circuit.full(), np.float64)  # [L, H, D, D]
    want = np.linalg.svd(full, compute_uv=False)[..., :k]
    np.testing.assert_allclose(np.asarray(circuit.S), want, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(circuit.norm()),
                               np.linalg.norm(full, axis=(-2, -1)),
                               rtol=1e-5)
  # The full OV circuit [V, V] through the embedding and unembedding: its
  # Dh nonzero eigenvalues from a [Dh, Dh] product.
  full_ov = W.W_E @ W.OV @ W.W_U
  assert full_ov.shape == (2, H, V, V) and full_ov.mdim == DH
  e = np.asarray(W.W_E, np.float64)
  u = np.asarray(W.W_U, np.float64)
  for l in range(2):
    for h in range(H):
      lam = np.linalg.eigvals(e @ np.asarray(W.OV.full()[l, h]) @ u)
      big = np.sort_complex(lam[np.argsort(np.abs(lam))[V - DH:]])
      got = np.sort_complex(np.asarray(full_ov.eigenvalues[l, h]))
      np.testing.assert_allclose(got, big, rtol=1e-3, atol=1e-3)


def test_embedding_is_what_the_model_adds_to_the_stream():
  config = CONFIG.replace(positions="rotary", embed_scale=8 ** 0.5,
                          tie_embeddings=True, readout_bias=False)
  model = mha_jax.DecoderLM(config, rngs=nnx.Rngs(0))
  w = weight_views.weights(model)
  _, acts = model(TOKENS, capture=("blocks.0.resid_pre",))
  np.testing.assert_array_equal(np.asarray(w.W_E)[np.asarray(TOKENS)],
                                acts["blocks.0.resid_pre"])
  assert w.W_pos is None  # rotary: nothing is added to the stream
  # A tied readout is the unscaled table's transpose (Gemma's layout).
  np.testing.assert_array_equal(w.W_U, model.embed.embed.embedding[...].T)


def test_kv_head_index_is_the_hooks_one():
  for h in range(H):
    np.testing.assert_array_equal(W.W_K[:, h],
                                  W.W_K_kv[:, hooks.kv_head(h, H, K)])
    np.testing.assert_array_equal(W.W_V[:, h],
                                  W.W_V_kv[:, hooks.kv_head(h, H, K)])


def test_weights_refuse_a_model_without_a_readout():
  enc = mha_jax.Encoder(CONFIG.replace(num_layers=1), rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match=re.escape(
      "weights: `model` must be a DecoderLM, got Encoder")):
    weight_views.weights(enc)
