"""Small decoders with random weights drawn by NumPy, for the circuit
tools' tests (patching, per-example positions, edge attribution). Only
tests use it, so it lives here, beside them.

NumPy, not the model's own initialiser, so that no random init is
compiled and the weights are the same on every backend: matrices
N(0, 0.5^2), vectors (biases, LayerNorm scales) 1 + N(0, 0.2^2), so that
a LayerNorm keeps its input's scale and no site is linear by accident.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM

# The defaults: a 2-layer, 2-head attention-only model over 10 tokens.
DEFAULTS = dict(vocab_size=10, d_model=16, num_layers=2, num_heads=2,
                max_len=6, attention_only=True, implementation="einsum")


def config(**overrides) -> ModelConfig:
  return ModelConfig(**(DEFAULTS | overrides))


def split(seed: int, **overrides):
  """`(graphdef, state)` of a `DecoderLM` of `config(**overrides)` with
  weights drawn from `seed`."""
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config(**overrides), rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(seed)
  state = jax.tree.map(lambda x: jnp.asarray(
      rng.normal(size=x.shape) * (0.5 if len(x.shape) > 1 else 0.2)
      + (len(x.shape) == 1), x.dtype), state)
  return graphdef, state


def model(seed: int, **overrides) -> DecoderLM:
  """The model of `split(seed, **overrides)`, merged."""
  return nnx.merge(*split(seed, **overrides))
