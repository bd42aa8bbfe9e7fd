"""Autoregressive generation from a `DecoderLM` that owns its KV cache.

Shape letters: B batch, P padded prompt length, T new tokens in one call,
N generated tokens, S cache slots (max_len), V vocabulary, D d_model.

This module is only the decoding loop: the model computes every logit,
through the same forward as training (`model(tokens, cache=cache)` returns
the logits and the new cache), so cached logits are the model's logits.

Positions are per sequence: a token written to slot `length[b] + t` has
position `length[b] + t`, for learned and sinusoidal tables as for rotary,
so a ragged batch (right-padded prompts of unequal length) decodes exactly
as each prompt would alone.

`decode_loop` is pure and un-jitted (prefill, then a `lax.scan` of one-token
steps, so it traces once for any prompt values or lengths); `generate` jits
it once per (model structure, shapes, N) and raises `OverflowError` when a
sequence would run past the cache.

Shapes are what compiles, so `generate` buckets them (`bucket`): it pads
the prompt's width P to the next power of two (at least `MIN_BUCKET`), and
sizes a default cache to the next power of two that holds every row. A
prompt of 20 tokens and one of 30 then share one program; for a given N,
prompt lengths up to 2^k need at most 2(k - 3) programs (one width
bucket's lengths span at most two cache buckets), not one per length.
Padding to buckets rather than to one fixed width: the padded columns are
real work in the prefill (at most as many as the real ones), while a fixed
width (the model's 8,192 slots for SmolLM2) would make every prompt and
every decoding step pay for the longest.
Padded columns and unwritten slots are masked, so a bucketed call gives
the tokens of an unbucketed one, and logits within float32 rounding
(tests/models/test_generate_buckets.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mha_jax.core import kv_cache
from mha_jax.models import sampling
from mha_jax.models import transformer


MIN_BUCKET = 16  # the narrowest prompt width and cache `generate` compiles


def bucket(n: int) -> int:
  """The width `generate` compiles for `n` tokens: the next power of two,
  at least `MIN_BUCKET`."""
  return max(MIN_BUCKET, 1 << (int(n) - 1).bit_length())


def _check_token_lm(model, fn):
  if not isinstance(model, transformer.DecoderLM):
    raise TypeError(f"{fn}: `model` must be a DecoderLM, got "
                    f"{type(model).__name__}")
  c = model.config
  if c.input_dim > 0:
    raise ValueError(f"{fn}: `model` reads continuous features "
                     f"(input_dim={c.input_dim}); generation needs a "
                     "token model")
  if c.out_features != c.vocab_size:
    raise ValueError(f"{fn}: `model` predicts {c.out_features} classes but "
                     f"embeds {c.vocab_size} tokens; its outputs cannot be "
                     "fed back as inputs")


def prefill(model, prompt, cache, *, lengths=None):
  """Run right-padded prompts `[B, P]`; returns the logits at each row's last
  real token `[B, V]`, the new cache and its status."""
  b, p = prompt.shape
  lengths = (jnp.full((b,), p, jnp.int32) if lengths is None
             else jnp.asarray(lengths, jnp.int32))
  logits, cache = model(prompt, cache=cache, lengths=lengths)
  last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)
  return last[:, 0], cache, kv_cache.status(cache)  # [B, V]


def decode_step(model, token, cache, *, active=None):
  """One token per sequence `[B]` -> next-token logits `[B, V]`, cache,
  status. Rows where `active [B]` is False write nothing and stay put."""
  lengths = None if active is None else jnp.asarray(active, jnp.int32)
  logits, cache = model(token[:, None], cache=cache, lengths=lengths)
  return logits[:, 0], cache, kv_cache.status(cache)


def decode_loop(model, prompt, max_new_tokens: int, *, lengths=None,
                new_tokens=None, temperature=0.0, rng=None, top_k=None,
                top_p=None, max_len: int | None = None):
  """Prefill, then `max_new_tokens - 1` cached steps under `lax.scan`.

  `new_tokens [B]` (None: all N) gives each row its own budget: a row
  stops writing to its cache once it has that many tokens, and its later
  tokens are `PAD_ID` 0, so ragged budgets share one compiled loop.
  Returns `(tokens [B, N], logits [B, N, V], CacheStatus)`: token n of row b
  was chosen from `logits[b, n]` (the model's, before `filter_logits`);
  step n draws with `fold_in(rng, n)`. The status covers every call (the
  caller must check it).
  """
  b = prompt.shape[0]
  caches = model.init_cache(b, max_len)
  key = lambda n: None if rng is None else jax.random.fold_in(rng, n)
  budget = (jnp.full((b,), max_new_tokens, jnp.int32) if new_tokens is None
            else jnp.asarray(new_tokens, jnp.int32))
  last, caches, _ = prefill(model, prompt, caches, lengths=lengths)
  pick = lambda logits, n: sampling.sample_next(logits, temperature, key(n),
                                                top_k, top_p)
  first = pick(last, 0)

  def step(carry, n):
    token, caches = carry
    # Token n-1 is fed (written) only if token n is still within budget.
    active = n < budget  # [B]
    logits, caches, _ = decode_step(model, token, caches, active=active)
    nxt = jnp.where(active, pick(logits, n), 0)
    return (nxt, caches), (nxt, logits)

  (_, caches), (tokens, logits) = jax.lax.scan(
      step, (first, caches), jnp.arange(1, max_new_tokens))
  tokens = jnp.concatenate([first[:, None], tokens.T], axis=1)  # [B, N]
  logits = jnp.concatenate([last[:, None], logits.swapaxes(0, 1)], axis=1)
  # Overflow is sticky (a row's length stays past max_len), so the final
  # caches tell whether any call overflowed.
  return tokens, logits, kv_cache.status(caches)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens",
                                             "max_len", "sample"))
def decode_jit(graphdef, state, prompt, lengths, new_tokens, temperature,
               rng, top_k, top_p, *, max_new_tokens, max_len, sample):
  """The program `generate` compiles and runs; `prepare` gives its
  arguments (a profiler or a cost analysis can lower it with them).
  `top_k` and `top_p` are traced scalars or None (an empty pytree: a
  program without that filter)."""
  return decode_loop(nnx.merge(graphdef, state), prompt, max_new_tokens,
                     lengths=lengths, new_tokens=new_tokens,
                     temperature=temperature, rng=rng if sample else None,
                     top_k=top_k, top_p=top_p, max_len=max_len)


def generate(model, prompt, max_new_tokens: int, *, prompt_lengths=None,
             new_tokens=None, temperature: float = 0.0, rng=None,
             top_k: int | None = None, top_p: float | None = None,
             max_len: int | None = None, return_logits: bool = False,
             bucket_shapes: bool = True):
  """Continue right-padded prompts `[B, P]` by `max_new_tokens` tokens.

  Args:
    model: a token `DecoderLM`.
    prompt: int tokens `[B, P]`; row b's first `prompt_lengths[b]` are real.
    max_new_tokens: N >= 1 tokens to generate per row.
    prompt_lengths: `[B]` ints in [1, P]; None means every row is full.
    new_tokens: `[B]` ints in [1, N], each row's own budget (later tokens
      are 0); None means N for every row.
    temperature: 0 picks the argmax; > 0 samples and needs `rng`.
    rng: a PRNG key for sampling (the same key gives the same tokens).
    top_k: an int >= 1, or None: sample among the k most likely tokens
      (those tied with the k-th too). Needs temperature > 0.
    top_p: a number in (0, 1], or None: sample among the smallest set of
      most likely tokens whose probability reaches `top_p` (at least one
      token). Needs temperature > 0. Applied as Hugging Face does:
      temperature, then top-k, then top-p on what top-k left; the exact
      tie and boundary rules are `filter_logits`'. Unlike transformers,
      top_k = 0 is an error here, not "off": None is off.
    max_len: cache slots; row b needs `prompt_lengths[b] + new_tokens[b]
      - 1` of them. None: with `bucket_shapes`, the `bucket` of the most
      any row needs (at most the model's `max_len`), else the model's.
    return_logits: also return the model's logits `[B, N, V]` each token
      came from (before temperature and filtering).
    bucket_shapes: pad the prompt to `bucket(P)` columns (at most the
      model's `max_len`) and size a default cache by `bucket`, so that
      prompt lengths in one bucket share one compiled program (the module
      docstring); False compiles for the exact P.

  Returns:
    `tokens [B, N]` (and the logits). Raises `OverflowError` if a row would
    run past `max_len`: no position is ever wrapped or clamped.
  """
  args, static = prepare(model, prompt, max_new_tokens,
                         prompt_lengths=prompt_lengths,
                         new_tokens=new_tokens, temperature=temperature,
                         rng=rng, top_k=top_k, top_p=top_p,
                         max_len=max_len, bucket_shapes=bucket_shapes)
  tokens, logits, status = decode_jit(*args, **static)
  kv_cache.raise_if_overflow(status)  # never expected after the check above
  return (tokens, logits) if return_logits else tokens


def prepare(model, prompt, max_new_tokens: int, *, prompt_lengths=None,
            new_tokens=None, temperature: float = 0.0, rng=None,
            top_k: int | None = None, top_p: float | None = None,
            max_len: int | None = None, bucket_shapes: bool = True):
  """`generate`'s checks and buckets: returns `(args, static)` for
  `decode_jit(*args, **static)`, raising on bad input or overflow."""
  fn = "generate"
  _check_token_lm(model, fn)
  # Host-side NumPy from here to the jitted call: eager jnp ops would
  # dispatch (and compile) small programs of their own for each shape.
  prompt = np.asarray(prompt)
  if prompt.ndim != 2 or not np.issubdtype(prompt.dtype, np.integer):
    raise ValueError(f"{fn}: `prompt` must be int tokens [B, P], got "
                     f"{prompt.dtype} {prompt.shape}")
  b, p = prompt.shape
  if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"{fn}: `max_new_tokens` must be an int >= 1, got "
                     f"{max_new_tokens!r}")
  lengths = (np.full((b,), p, np.int32) if prompt_lengths is None
             else np.asarray(prompt_lengths, np.int32))
  if lengths.shape != (b,) or np.any((lengths < 1) | (lengths > p)):
    raise ValueError(f"{fn}: `prompt_lengths` must be [{b}] ints in [1, "
                     f"P={p}], got {prompt_lengths!r}")
  budget = (np.full((b,), max_new_tokens, np.int32) if new_tokens is None
            else np.asarray(new_tokens, np.int32))
  if budget.shape != (b,) or np.any((budget < 1) | (budget > max_new_tokens)):
    raise ValueError(f"{fn}: `new_tokens` must be [{b}] ints in [1, "
                     f"max_new_tokens={max_new_tokens}], got {new_tokens!r}")
  if temperature < 0 or (temperature > 0 and rng is None):
    raise ValueError(f"{fn}: `temperature` must be 0 (greedy) or > 0 with "
                     f"an `rng` key, got {temperature!r} and rng={rng!r}")
  sampling.check_filters(fn, temperature, top_k, top_p)
  need = lengths + budget - 1  # [B] cache slots each row fills
  worst = int(np.argmax(need))
  if max_len is None:
    max_len = model.config.max_len
    if bucket_shapes:
      max_len = min(max_len, bucket(need[worst]))  # O(S) per step
  if int(need[worst]) > max_len:
    raise OverflowError(f"{fn}: row {worst}'s prompt of {int(lengths[worst])}"
                        f" tokens plus {int(budget[worst])} new ones needs "
                        f"{int(need[worst])} cache slots, but `max_len`="
                        f"{max_len}")
  # No wider than the model takes (its `max_len`, the embedder's bound).
  width = min(bucket(p), max(p, model.config.max_len))
  if bucket_shapes and width > p:
    # The padding columns lie past every row's length: never written to
    # the cache, and their logits are never read.
    prompt = np.pad(prompt, ((0, 0), (0, width - p)))  # [B, width]
  graphdef, state = nnx.split(model)
  args = (graphdef, state, prompt, lengths, budget, np.float32(temperature),
          jax.random.PRNGKey(0) if rng is None else rng,
          None if top_k is None else np.int32(min(top_k, 2**31 - 1)),
          None if top_p is None else np.float32(top_p))
  return args, dict(max_new_tokens=max_new_tokens, max_len=max_len,
                    sample=rng is not None)
