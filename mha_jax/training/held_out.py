"""A fixed held-out batch of a config's task, and a model measured on it.

Shape letters: L layers, B examples, H heads, T query length, S key length.

Training draws its batches from `fold_in(data_key, step)` of the run's
seed; an analysis batch comes from a separate key (`ANALYSIS_SEED` plus an
offset), so the numbers in a report are on data the model did not train
on. Experiments draw one batch per training seed (`ANALYSIS_SEED + seed`),
shared by the settings compared within that seed, so a spread over seeds
includes the variation of the evaluation data too.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mha_jax.training import train_state


ANALYSIS_SEED = 12345


def analysis_batch(config, num_examples: int,
                   seed: int = ANALYSIS_SEED) -> dict:
  """`num_examples` examples of `config.task`, drawn from key `seed`.

  The task's batch dict (see `mha_jax.training.tasks`) with batch size B =
  `num_examples`. Drawn through the training loop's jitted sampler, so a
  batch the size of the training batch compiles nothing new.
  """
  c = ml_collections.ConfigDict(config.to_dict())
  c.task.batch_size = num_examples
  return train_state.batch_fn(c)(jax.random.PRNGKey(seed))


def text_config(config) -> ml_collections.ConfigDict:
  """A copy of a text task's `config` whose batches are the held-out files
  as they are: split "held_out" and no planted repeats
  (`task.repeat_prob` 0), whatever the model trained on."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.task.split = "held_out"
  c.task.repeat_prob = 0.0
  return c


# Jitted once per model structure (the graphdef is static, the parameters
# are arguments): every seed of a setting reuses one compiled program.
@functools.partial(jax.jit, static_argnums=0)
def _weights(graphdef, state, batch):
  model = nnx.merge(graphdef, state)
  return train_state.apply_model(model, batch, return_weights=True)[1]


@functools.partial(jax.jit, static_argnums=(0, 3))
def _metrics(graphdef, state, batch, loss):
  return train_state.compute_loss(nnx.merge(graphdef, state), batch, loss)[1]


def weights_of(model, batch) -> dict:
  """Every layer's attention weights on `batch`, as NumPy.

  `{"self": [L, B, H, T, T]}`, plus `"cross": [L, B, H, T, S]` for an
  encoder-decoder.
  """
  return jax.tree.map(np.asarray, _weights(*nnx.split(model), batch))


def eval_loss(model, batch, loss: str) -> dict:
  """`{"loss": float}` (and `"accuracy"` for class targets) on `batch`."""
  metrics = _metrics(*nnx.split(model), batch, loss)
  return {k: float(v) for k, v in metrics.items()}


def head_gates(model, ablate=()) -> np.ndarray:
  """`[L, H]` head gates of a decoder: 1, and 0 at the `(layer, head)`
  pairs of `ablate` (the `head_mask` that zero-ablates them)."""
  gates = np.ones((model.config.num_layers, model.config.num_heads),
                  np.float32)
  for l, h in ablate:
    gates[l, h] = 0.0
  return gates


@functools.partial(jax.jit, static_argnums=0)
def _per_position(graphdef, state, inputs, targets, gates):
  model = nnx.merge(graphdef, state)
  logits = model(inputs, head_mask=gates).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def per_position_loss(model, batch, gates=None) -> np.ndarray:
  """Next-token cross-entropy `[B, T]` in nats of a decoder on `batch`
  ("inputs", "targets"), every position; `gates [L, H]` multiplies each
  head's output (`head_gates`; None: all 1)."""
  gates = head_gates(model) if gates is None else gates
  graphdef, state = nnx.split(model)
  return np.asarray(_per_position(graphdef, state, batch["inputs"],
                                  batch["targets"],
                                  jnp.asarray(gates, jnp.float32)))
