"""Inputs that would go silently wrong are refused by name at a model's entry.

Known answers: the messages name the argument, the offending id and its
position (b, t); without the check an id >= V gave NaN logits and id -1
read the last row, so each case below is one that used to return numbers.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mha_jax.models import inputs
from mha_jax.models import transformer

V = 16
CONFIG = transformer.ModelConfig(vocab_size=V, d_model=8, num_layers=1,
                                 num_heads=2, max_len=8)
DECODER = transformer.DecoderLM(CONFIG, rngs=nnx.Rngs(0))
OUTSIDE = "outside the vocabulary [0, 16)"


def _outside(name, value, where, fn="DecoderLM"):
  return re.escape(f"{fn}: `{name}` holds token id {value} at position "
                   f"{where}, {OUTSIDE}")


@pytest.mark.parametrize("tokens,value,where", [
    ([[1, 2, 99]], 99, (0, 2)),
    ([[1, 2, 3], [4, 16, 5]], 16, (1, 1)),   # V itself
    ([[1, -1, 3]], -1, (0, 1)),              # would read the last row
])
def test_eager_ids_outside_the_vocabulary(tokens, value, where):
  with pytest.raises(ValueError, match=_outside("inputs", value, where)):
    DECODER(jnp.asarray(tokens))


def test_jitted_and_vmapped_ids_are_checked_when_the_program_runs():
  graphdef, state = nnx.split(DECODER)
  run = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
  good = jnp.array([[1, 2, 3], [4, 5, 15]])
  np.testing.assert_array_equal(run(state, good), DECODER(good))
  # The message reaches the caller inside JAX's runtime error.
  with pytest.raises(Exception, match=_outside("inputs", 16, (1, 2))):
    jax.block_until_ready(run(state, jnp.array([[1, 2, 3], [4, 5, 16]])))
  per_row = jax.jit(jax.vmap(lambda t: nnx.merge(graphdef, state)(t[None])))
  # Batched ids turn the check's cond into a select that runs both
  # branches: valid rows must still pass.
  np.testing.assert_allclose(per_row(good)[:, 0], DECODER(good), atol=1e-6)
  # Under vmap the position is within the mapped row.
  with pytest.raises(Exception, match=_outside("inputs", -3, (0, 0))):
    jax.block_until_ready(per_row(jnp.array([[1, 2, 3], [-3, 5, 6]])))


def test_checked_ids_leave_the_logits_unchanged():
  tokens = jnp.array([[0, 7, 15]])
  graphdef, state = nnx.split(DECODER)
  direct = nnx.merge(graphdef, state).embed.embed(tokens)
  assert np.isfinite(DECODER(tokens)).all()
  np.testing.assert_array_equal(DECODER.embed(tokens, jnp.arange(3)[None]),
                                direct + DECODER.embed.pos_embed(
                                    jnp.arange(3)[None]))


@pytest.mark.parametrize("bad,kind,message", [
    ("hello", TypeError, "`inputs` must be token ids [B, T], got text "
     "'hello'; tokenize it first"),
    (["a b", "c"], TypeError, "`inputs` must be token ids [B, T], got text "
     "['a b', 'c']; tokenize it first"),
    (jnp.arange(5), ValueError, "`inputs` must be integer token ids [B, T], "
     "got shape (5,) (one sequence of T tokens is `tokens[None]`)"),
    (jnp.ones((1, 3)), TypeError, "`inputs` must be integer token ids "
     "[B, T], got dtype float32"),
    (jnp.ones((1, 3, 2), jnp.int32), ValueError, "`inputs` must be integer "
     "token ids [B, T], got shape (1, 3, 2)"),
])
def test_text_rank_and_dtype_are_refused_by_name(bad, kind, message):
  with pytest.raises(kind, match=re.escape(f"DecoderLM: {message}")):
    DECODER(bad)


def test_text_points_to_the_tokenizer_a_user_has():
  with pytest.raises(TypeError) as err:
    DECODER("hello")
  assert str(err.value) == (
      "DecoderLM: `inputs` must be token ids [B, T], got text 'hello'; "
      "tokenize it first (a language model from `load_language_model`: "
      "`lm.to_tokens(text)`; an encoder: "
      "`ids, mask = mha_jax.pretrained.encode(tokenizer, text)`)")


def test_features_model_wants_float_features():
  config = CONFIG.replace(vocab_size=0, input_dim=3, output_dim=2)
  with pytest.raises(ValueError, match=re.escape(
      "Embedder: `inputs` must be float features [B, T, 3], got int32 of "
      "shape (1, 4)")):
    inputs.check(jnp.ones((1, 4), jnp.int32), config, fn="Embedder")


def test_encoder_and_encoder_decoder_name_their_arguments():
  encoder = transformer.Encoder(CONFIG, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=_outside("tokens", 20, (0, 0),
                                                "Encoder")):
    encoder(jnp.array([[20, 1]]))
  seq2seq = transformer.EncoderDecoder(CONFIG, rngs=nnx.Rngs(0))
  ok = jnp.array([[3, 4]])
  with pytest.raises(ValueError, match=_outside("src", 17, (0, 1),
                                                "EncoderDecoder")):
    seq2seq(jnp.array([[3, 17]]), ok)
  with pytest.raises(ValueError, match=_outside("tgt", -2, (0, 0),
                                                "EncoderDecoder")):
    seq2seq(ok, jnp.array([[-2, 4]]))
