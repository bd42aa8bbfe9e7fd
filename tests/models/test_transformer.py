"""Tiny transformers: causality, padding, head masks, captured weights."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mha_jax.models import transformer

V, D, L, H, T = 13, 16, 2, 4, 6


def _lm(**kw):
  kw = dict(dict(vocab_size=V, d_model=D, num_layers=L, num_heads=H,
                 max_len=8), **kw)
  return transformer.DecoderLM(transformer.ModelConfig(**kw),
                               rngs=nnx.Rngs(params=0))


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames="return_weights")
def _apply(graphdef, state, *args, return_weights=False, **kw):
  return nnx.merge(graphdef, state)(*args, return_weights=return_weights,
                                    **kw)


def run(model, *args, **kw):
  """`model(*args, **kw)` compiled (eager NNX calls are slow on CPU)."""
  graphdef, state = nnx.split(model)
  return _apply(graphdef, state, *args, **kw)


def _tokens(seed, b=2, t=T, lo=1):
  return jax.random.randint(jax.random.key(seed), (b, t), lo, V)


@pytest.mark.parametrize("positions", transformer.POSITIONS)
def test_decoder_is_causal(positions):
  model = _lm(positions=positions, num_kv_heads=2)
  tok = _tokens(0)
  changed = tok.at[:, 4:].set((tok[:, 4:] + 1) % V)
  a, b = run(model, tok), run(model, changed)
  np.testing.assert_array_equal(a[:, :4], b[:, :4])
  assert not np.allclose(a[:, 4:], b[:, 4:])


def test_continuous_inputs_gradient_never_flows_backward_in_time():
  model = _lm(vocab_size=0, input_dim=3, output_dim=5, positions="rotary",
              attention_only=False)
  u = jax.random.normal(jax.random.key(1), (1, T, 3))
  graphdef, state = nnx.split(model)
  out2 = lambda u: nnx.merge(graphdef, state)(u)[0, 2].sum()
  jac = jax.jit(jax.jacrev(out2))(u)  # d out_2 / d u_t
  np.testing.assert_array_equal(jac[0, 3:], 0.0)
  assert np.abs(jac[0, :3]).sum() > 0


def test_returned_weights_layout_and_unchanged_logits():
  model = _lm()
  tok = _tokens(2)
  logits, w = run(model, tok, return_weights=True)
  np.testing.assert_array_equal(logits, run(model, tok))
  assert w["self"].shape == (L, 2, H, T, T)
  np.testing.assert_allclose(jnp.sum(w["self"], -1), 1.0, rtol=1e-6)
  upper = np.triu(np.ones((T, T), bool), k=1)
  np.testing.assert_array_equal(np.asarray(w["self"])[..., upper], 0.0)


def test_head_mask_zero_removes_attention():
  """All heads off, no MLP: logits = readout(final_ln(embedding + pos))."""
  model = _lm(attention_only=True)
  tok = _tokens(3)
  ones = run(model, tok, head_mask=jnp.ones((L, H)))
  np.testing.assert_array_equal(ones, run(model, tok))
  off = run(model, tok, head_mask=jnp.zeros((L, H)))
  pos = jnp.arange(T)[None]
  x = model.embed.embed(tok) + model.embed.pos_embed(pos)
  np.testing.assert_allclose(off, model.readout(model.final_ln(x)),
                             rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="head_mask"):
    model(tok, head_mask=jnp.ones((H,)))


def test_head_importance_gradient_under_jit():
  """d loss / d head_mask is the change of loss when a head is scaled."""
  model = _lm(attention_only=False)
  graphdef, state = nnx.split(model)
  tok = _tokens(4)

  @jax.jit
  def loss(hm):
    logits = nnx.merge(graphdef, state)(tok, head_mask=hm)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

  ones = jnp.ones((L, H))
  g = jax.jit(jax.grad(loss))(ones)
  assert g.shape == (L, H)
  eps = 1e-3
  bump = ones.at[1, 2].add(eps)
  fd = (loss(bump) - loss(ones)) / eps
  np.testing.assert_allclose(g[1, 2], fd, rtol=0.05, atol=1e-4)


def test_sinusoidal_table_known_values():
  table = transformer.sinusoidal_positions(5, 6)
  np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1], atol=1e-7)
  np.testing.assert_allclose(table[:, 0], np.sin(np.arange(5)), rtol=1e-6)
  np.testing.assert_allclose(table[:, 3],
                             np.cos(np.arange(5) * 10000 ** (-2 / 6)),
                             rtol=1e-6)


def _encdec():
  return transformer.EncoderDecoder(
      transformer.ModelConfig(vocab_size=V, d_model=D, num_layers=L,
                              num_heads=H, max_len=10, num_kv_heads=2),
      rngs=nnx.Rngs(params=1))


def test_encoder_decoder_ignores_source_padding():
  model = _encdec()
  src = _tokens(5, t=5, lo=3)
  tgt = _tokens(6, t=4, lo=3)
  padded = jnp.pad(src, ((0, 0), (0, 3)))  # PAD = 0 on the right
  a, _ = run(model, src, tgt, return_weights=True)
  b, wb = run(model, padded, tgt, return_weights=True)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert wb["cross"].shape == (L, 2, H, 4, 8)
  assert wb["encoder"].shape == (L, 2, H, 8, 8)
  assert wb["self"].shape == (L, 2, H, 4, 4)
  np.testing.assert_array_equal(wb["cross"][..., 5:], 0.0)
  np.testing.assert_array_equal(wb["encoder"][..., 5:], 0.0)


def test_encoder_decoder_target_padding_and_causality():
  model = _encdec()
  src = _tokens(7, t=5, lo=3)
  tgt = _tokens(8, t=5, lo=3).at[:, 3:].set(0)  # last two decoder inputs PAD
  logits, w = run(model, src, tgt, return_weights=True)
  np.testing.assert_array_equal(w["self"][..., 3:], 0.0)  # padded keys
  changed = run(model, src, tgt.at[:, 2].set(4))
  np.testing.assert_array_equal(logits[:, :2], changed[:, :2])
