"""The models of the IOI run and their tokenizers: the two real GGUF
decoders, tiny random ones of the same two families for the smoke run,
and the shuffled-weights control.

A tiny model has a word-level tokenizer over the templates' words and the
candidate names, so the same prompt code runs on it.
"""

from __future__ import annotations

import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import tokenizers

import mha_jax
from experiments.ioi_task import prompts
from mha_jax.pretrained import load as load_lib
from mha_jax.pretrained import real_models

REAL = {"smollm2": real_models.smollm2_135m, "gemma3": real_models.gemma3_270m}
# What goes before each prompt: SmolLM2 adds no BOS, and its documents
# start after "<|endoftext|>" (id 0); Gemma's tokenizer adds <bos>.
PREFIX = {"smollm2": "<|endoftext|>", "gemma3": ""}
TINY = {
    "tiny_llama": dict(model_type="llama", hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, rms_norm_eps=1e-5,
                       tie_word_embeddings=True),
    # Six layers: five sliding (window 8, shorter than a prompt), one
    # global, as Gemma 3's pattern.
    "tiny_gemma3": dict(model_type="gemma3_text", hidden_size=32,
                        intermediate_size=64, num_hidden_layers=6,
                        num_attention_heads=4, num_key_value_heads=1,
                        head_dim=16, max_position_embeddings=64,
                        rms_norm_eps=1e-6, sliding_window=8),
}
NAMES = tuple(REAL) + tuple(TINY)


def word_tokenizer() -> tokenizers.Tokenizer:
  """Word-level: every word and punctuation mark of the templates and
  every candidate name is one id (0 is unknown)."""
  words = set(prompts.CANDIDATE_NAMES)
  for t in prompts.TEMPLATES:
    words |= set(re.findall(r"\w+|[^\w\s]", t.format(A="", B="", C="")))
  vocab = {"[UNK]": 0} | {w: i + 1 for i, w in enumerate(sorted(words))}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  return tok


def load(name: str, *, seed: int = 0):
  """`(model, tokenizer, prefix)` for one of `NAMES`."""
  if name in REAL:
    path = REAL[name]()
    return (mha_jax.load_pretrained(path), mha_jax.load_tokenizer(path),
            PREFIX[name])
  if name not in TINY:
    raise ValueError(f"models.load: `name` must be one of {NAMES}, got "
                     f"{name!r}")
  tok = word_tokenizer()
  _, config = load_lib.config_from_fields(
      TINY[name] | {"vocab_size": tok.get_vocab_size()}, name,
      implementation="einsum")
  return mha_jax.DecoderLM(config, rngs=nnx.Rngs(seed)), tok, ""


def shuffled(model, seed: int):
  """The same architecture with each weight tensor's entries permuted
  (one permutation per tensor, `np.random.default_rng(seed)`): the
  trained values' scale kept, their arrangement lost."""
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(seed)

  def permute(x):
    flat = np.asarray(x).reshape(-1)
    return jnp.asarray(flat[rng.permutation(flat.size)].reshape(x.shape),
                       x.dtype)

  return nnx.merge(graphdef, jax.tree.map(permute, state))
