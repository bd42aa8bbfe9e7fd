"""Prompts cut from a task's examples, and how well a model continues them.

Shape letters: B examples, T task length, P padded prompt length, N longest
continuation.

A task whose scored targets form one contiguous span per example (copy:
the copied half; induction: the predictable part of the repeat) splits
into a prompt (everything up to and including the token before the first
scored target) and the continuation the model must produce (the scored
targets). Prompts and continuations have unequal lengths, so they run as
one ragged batch through `generate.generate` (KV cache, `lax.scan` loop).
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.models import generate
from mha_jax.training import held_out
from mha_jax.training import tasks

SUPPORTED = ("copy", "induction")  # tasks whose scored targets are one span


# One compiled forward per model structure (graphdef static), not per call.
@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, inputs):
  return nnx.merge(graphdef, state)(inputs)


def task_prompts(config, num_examples: int, seed: int) -> dict:
  """Ragged prompts from the config's task, drawn from key `seed`.

  Returns a dict of NumPy arrays: "prompt" `[B, P]` (right padded with
  PAD), "lengths" `[B]`, "expected" `[B, N]` (the scored targets, PAD after
  each row's own count), "counts" `[B]`, and the task batch it came from:
  "inputs", "targets" `[B, T]` and "scored" `[B, T]` (bool loss mask).
  """
  name = config.task.name
  if name not in SUPPORTED:
    raise ValueError(f"task_prompts: config.task.name={name!r} has no "
                     f"continuation to check; expected one of {SUPPORTED}")
  batch = jax.device_get(held_out.analysis_batch(config, num_examples, seed))
  scored = batch["loss_mask"] > 0  # [B, T]
  first = scored.argmax(axis=1)  # the first scored target's position
  counts = scored.sum(axis=1)
  pos = np.arange(scored.shape[1])[None, :]
  span = (pos >= first[:, None]) & (pos < (first + counts)[:, None])
  if not (scored == span).all() or (counts < 1).any():
    raise ValueError(f"task_prompts: task {name!r} does not score one "
                     "contiguous span per example")
  # inputs[t] is the token before targets[t], so the prompt ends at
  # inputs[first] and the continuation is targets[first : first + count].
  lengths = first + 1
  p, n = int(lengths.max()), int(counts.max())
  prompt = np.where(pos[:, :p] < lengths[:, None], batch["inputs"][:, :p],
                    tasks.PAD)
  rows = np.arange(num_examples)[:, None]
  idx = np.minimum(first[:, None] + np.arange(n)[None, :],
                   scored.shape[1] - 1)
  expected = np.where(np.arange(n)[None, :] < counts[:, None],
                      batch["targets"][rows, idx], tasks.PAD)
  return {"prompt": prompt, "lengths": lengths, "expected": expected,
          "counts": counts, "inputs": batch["inputs"], "scored": scored,
          "targets": batch["targets"]}


def evaluate_generation(model, config, *, num_examples: int = 256,
                        seed: int = 12345, temperature: float = 0.0,
                        rng=None) -> dict:
  """Generate every continuation in one ragged batch and score it.

  Returns the `task_prompts` dict plus "tokens" `[B, N]` (generated; PAD
  past each row's count), "token_accuracy" (over all scored tokens),
  "sequence_accuracy" (whole continuation right) and
  "teacher_forced_accuracy": the argmax of one full forward over the true
  sequences at the same scored tokens. Free-running generation feeds back
  its own tokens, so one mistake can derail the rest of a row; the gap
  between the two accuracies measures that compounding.
  """
  ex = task_prompts(config, num_examples, seed)
  tokens = np.asarray(generate.generate(
      model, jnp.asarray(ex["prompt"]), int(ex["counts"].max()),
      prompt_lengths=jnp.asarray(ex["lengths"]),
      new_tokens=jnp.asarray(ex["counts"]), temperature=temperature,
      rng=rng))
  valid = np.arange(tokens.shape[1])[None, :] < ex["counts"][:, None]
  hit = (tokens == ex["expected"]) & valid
  logits = _logits(*nnx.split(model), jnp.asarray(ex["inputs"]))
  forced = (np.asarray(jnp.argmax(logits, -1)) == ex["targets"])[ex["scored"]]
  return dict(ex, tokens=tokens,
              token_accuracy=float(hit.sum() / valid.sum()),
              sequence_accuracy=float((hit == valid).all(axis=1).mean()),
              teacher_forced_accuracy=float(forced.mean()))
