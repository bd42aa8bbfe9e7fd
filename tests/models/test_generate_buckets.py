"""`generate` buckets its shapes: prompt lengths in one bucket share one
compiled program, with the tokens of the unbucketed call and its logits
within float32 rounding.

The model is a tiny random one of the Llama family's layout (rotary, RMS
norm, gated SiLU MLP, grouped KV heads, tied embedding). Compiles are
counted by XLA's own event (tests/compiles.py), so any program compiled
during a call counts, the small eager ones too.
"""

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.models import generate
from mha_jax.models import transformer
from tests.compiles import count_compiles

V, N, MAX_LEN = 32, 4, 64


@pytest.fixture(scope="module")
def llama():
  return transformer.DecoderLM(transformer.ModelConfig(
      vocab_size=V, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2,
      mlp_dim=24, max_len=MAX_LEN, positions="rotary", norm="rms",
      mlp_activation="silu", mlp_gated=True, use_bias=False,
      tie_embeddings=True, readout_bias=False, attention_only=False),
      rngs=nnx.Rngs(0))


def prompt_of(length, seed):
  return np.random.default_rng(seed).integers(3, V, (1, length))


def test_bucket_is_the_next_power_of_two_from_sixteen():
  assert [generate.bucket(n) for n in (1, 15, 16, 17, 32, 33, 200)] == [
      16, 16, 16, 32, 32, 64, 256]


def test_prompt_lengths_in_one_bucket_compile_once(llama):
  # Prompts of 2..13 tokens and 4 new ones fill at most 16 slots: one
  # width (16) and one cache (16), so one program for all of them.
  with count_compiles() as first:
    generate.generate(llama, prompt_of(13, 0), N)
  assert first  # the counter sees compiles (this call's program is new)
  with count_compiles() as seen:
    for length in (2, 5, 9, 11):
      generate.generate(llama, prompt_of(length, length), N)
  assert seen == []


def test_bucketed_tokens_and_logits_equal_unbucketed(llama):
  # A ragged batch; row 0 is right-padded with junk ids that must not
  # leak. Width 17 pads to 32, and the cache holds 32 of the 64 slots.
  lengths = [12, 17]
  prompt = prompt_of(17, 1).repeat(2, 0)
  prompt[0, lengths[0]:] = 2
  got, got_logits = generate.generate(llama, prompt, N,
                                      prompt_lengths=lengths,
                                      return_logits=True)
  want, want_logits = generate.generate(llama, prompt, N,
                                        prompt_lengths=lengths,
                                        return_logits=True,
                                        bucket_shapes=False)
  np.testing.assert_array_equal(got, want)
  err = jnp.abs(got_logits - want_logits).max() / jnp.abs(want_logits).max()
  assert float(err) < 1e-6, float(err)
  # Row 0 alone, unpadded and unbucketed, gives the same tokens.
  alone = generate.generate(llama, prompt[:1, :12], N, bucket_shapes=False)
  np.testing.assert_array_equal(got[0], alone[0])


def test_bucketed_cache_still_raises_past_the_model(llama):
  with pytest.raises(OverflowError, match="max_len"):
    generate.generate(llama, prompt_of(60, 0), 8)
