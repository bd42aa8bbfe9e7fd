"""How the next token is drawn from a decoder's logits: greedy, or sampled
at a temperature with the top-k and top-p (nucleus) filters.

Shape letters: B batch, V vocabulary.

Hugging Face's rules, so that a user coming from transformers or
TransformerLens gets the distribution they know (`filter_logits` says
every tie and boundary); `generate.py` calls `sample_next` once per
decoding step, inside its compiled loop.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp


def check_filters(fn, temperature, top_k, top_p):
  """Refuse a top_k or top_p that is not a filter, or that greedy decoding
  would silently ignore."""
  if top_k is not None and (isinstance(top_k, bool)
                            or not isinstance(top_k, numbers.Integral)
                            or top_k < 1):
    raise ValueError(f"{fn}: `top_k` must be an int >= 1 (or None for no "
                     f"top-k), got {top_k!r}")
  if top_p is not None and (isinstance(top_p, bool)
                            or not isinstance(top_p, numbers.Real)
                            or not 0 < top_p <= 1):
    raise ValueError(f"{fn}: `top_p` must be a number in (0, 1] (or None "
                     f"for no top-p), got {top_p!r}")
  given = {k: v for k, v in (("top_k", top_k), ("top_p", top_p))
           if v is not None}
  if given and temperature == 0:
    names = " and ".join(f"`{k}`" for k in given)
    verb = "apply" if len(given) > 1 else "applies"
    got = ", ".join(f"{k}={v!r}" for k, v in given.items())
    raise ValueError(f"{fn}: {names} {verb} only when sampling: expected "
                     f"temperature > 0 with an `rng` key, got {got} with "
                     f"temperature={temperature!r} (greedy)")


def filter_logits(logits, temperature, top_k=None, top_p=None):
  """The float32 logits `[B, V]` that sampling draws from, in Hugging
  Face's order: divided by `temperature`, then top-k, then top-p, each
  removed token set to -inf (probability 0 after the softmax).

  Top-k keeps every token whose scaled logit is at least the k-th largest
  (ties at the k-th value are all kept, so a row can keep more than k);
  k past V keeps all. Top-p ranks the tokens left by top-k, renormalized,
  from most to least likely (equal logits: the lower token id first) and
  keeps a token when the mass of it and every token ranked below it is
  more than `1 - top_p` (transformers' comparison, in float32): a token
  is kept exactly when the tokens ranked above it hold less than `top_p`,
  which gives the smallest head of the ranking whose mass reaches
  `top_p`, and never fewer than the top token. `top_p` = 1 keeps every
  token of nonzero probability. These are transformers'
  `TopKLogitsWarper` and `TopPLogitsWarper` with `min_tokens_to_keep=1`
  (there, equal logits at the top-p boundary fall to its sort's order).
  `None` skips a filter (and the sort, when both are None).
  `temperature`, `top_k` and `top_p` may be traced: one compiled program
  serves every value.
  """
  # The floor only matters for temperature 0, where `sample_next` takes
  # the argmax anyway.
  scaled = logits.astype(jnp.float32) / jnp.maximum(temperature, 1e-6)
  if top_k is None and top_p is None:
    return scaled
  v = scaled.shape[-1]
  # Descending rank; a stable sort of the negated logits puts the lower id
  # first among equal logits.
  order = jnp.argsort(-scaled, axis=-1, stable=True)  # [B, V]
  ranked = jnp.take_along_axis(scaled, order, axis=-1)  # [B, V] descending
  keep = jnp.ones(ranked.shape, bool)  # [B, V] in rank order
  if top_k is not None:
    k = jnp.clip(jnp.asarray(top_k, jnp.int32), 1, v)
    kth = jnp.take(ranked, k - 1, axis=-1)[:, None]  # [B, 1]
    keep = ranked >= kth
    ranked = jnp.where(keep, ranked, -jnp.inf)
  if top_p is not None:
    probs = jax.nn.softmax(ranked, axis=-1)  # over what top-k left
    # Summed from the least likely up, so that the tail of tiny
    # probabilities is not lost to rounding against a sum near 1 (top_p
    # = 1 must keep them).
    tail = jnp.cumsum(probs[:, ::-1], axis=-1)[:, ::-1]  # [B, V]
    head = jnp.arange(v)[None, :] == 0
    keep = keep & ((tail > 1 - jnp.asarray(top_p, jnp.float32)) | head)
  # Back from rank order to token order.
  rows = jnp.arange(keep.shape[0])[:, None]
  keep = jnp.zeros_like(keep).at[rows, order].set(keep)  # [B, V]
  return jnp.where(keep, scaled, -jnp.inf)


def sample_next(logits, temperature, rng, top_k=None, top_p=None):
  """Next tokens `[B]` from logits `[B, V]`: argmax at temperature 0, else a
  draw from the softmax of `filter_logits(logits, temperature, top_k,
  top_p)`. `temperature`, `top_k` and `top_p` may be traced, so greedy
  and sampled decoding share one compiled program."""
  greedy = jnp.argmax(logits, axis=-1)
  if rng is None:
    return greedy
  scaled = filter_logits(logits, temperature, top_k, top_p)
  drawn = jax.random.categorical(rng, scaled, axis=-1)
  return jnp.where(temperature > 0, drawn, greedy)
