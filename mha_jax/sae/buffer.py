"""Activations for an SAE: token sources, a jitted collector, a shuffled
buffer.

Shape letters: B batch, T tokens, H heads, Dv per-head value width, D the
SAE's input width (H * Dv for a `z` site, d_model for `resid_pre`), N
collected activations.

An SAE reads one hook site of one layer, one row per token: `z [B, T, H,
Dv]` becomes `[B * T, H * Dv]` (heads concatenated, head h in columns
h * Dv .. (h + 1) * Dv, as Kissane et al. 2024 concatenate `hook_z`), a
block site `[B, T, D]` becomes `[B * T, D]`. `collector` compiles the
model's forward once per input shape, returning only that site, so XLA
drops every layer after it (the logits are never formed). `collect`
streams token batches through it into one host array; `batch_at` draws
batch `step` of a fixed shuffle of that array, so that batch depends only
on the seed and the step, and a resumed run sees the batches it would have
seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import functools
import time

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.training import text_corpus


def flatten_site(x):
  """`[B, T, H, Dv] -> [B * T, H * Dv]` (`z`) or `[B, T, D] -> [B * T, D]`."""
  if x.ndim not in (3, 4):
    raise ValueError(f"flatten_site: expected a site of shape [B, T, H, Dv] "
                     f"or [B, T, D], got {list(x.shape)}")
  return x.reshape(x.shape[0] * x.shape[1], -1)


def collector(model, site: str) -> Callable[[jax.Array], jax.Array]:
  """A jitted `tokens [B, T] -> [B, T, ...]` activation of `site` (the
  model's state is an argument, so a new model reuses nothing stale)."""
  if site not in model.hook_names():
    raise ValueError(f"collector: `site` {site!r} is not a hook site of "
                     f"this model; it has e.g. {model.hook_names()[:4]}")
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tokens):
    _, captured = nnx.merge(graphdef, state)(tokens, capture=[site])
    return captured[site]

  return lambda tokens: run(state, jnp.asarray(tokens, jnp.int32))


def collect(forward, batches: Iterable, *, keep=None, what: str = "tokens",
            log_every_s: float = 30.0) -> np.ndarray:
  """`[N, D]` float32: `forward`'s site for every token of every batch.

  `keep [T]` bool (optional) chooses the positions kept (e.g. leaving out
  a window's first token, which attends only to itself). Logs the pace.
  """
  out, done, start, last = [], 0, time.perf_counter(), time.perf_counter()
  for tokens in batches:
    x = forward(tokens)
    if keep is not None:
      x = x[:, np.asarray(keep)]
    out.append(np.asarray(flatten_site(x), np.float32))
    done += tokens.shape[0] * tokens.shape[1]
    now = time.perf_counter()
    if now - last > log_every_s:
      logging.info("collected %d %s (%.0f per second)", done, what,
                   done / (now - start))
      last = now
  return np.concatenate(out)


def batch_at(acts: np.ndarray, step: int, *, batch_size: int, seed: int
             ) -> np.ndarray:
  """`[batch_size, D]`: batch `step` of a shuffle of `acts` (a new
  permutation each pass, from `seed` and the pass number)."""
  n = acts.shape[0]
  if batch_size > n:
    raise ValueError(f"batch_at: `batch_size`={batch_size} is larger than "
                     f"the buffer ({n} activations)")
  epoch, i = divmod(int(step), n // batch_size)
  return acts[_order(n, seed, epoch)[i * batch_size:(i + 1) * batch_size]]


@functools.lru_cache(maxsize=2)
def _order(n: int, seed: int, epoch: int) -> np.ndarray:
  """The shuffle of pass `epoch` (kept: every step of a pass reads it)."""
  return np.random.default_rng([seed, epoch]).permutation(n)


# ----------------------------------------------------------------------------
# Token sources.


def distinct_tokens(n: int, length: int, token_range, *, seed: int
                    ) -> np.ndarray:
  """`[n, length]` random ids from `token_range` [lo, hi), distinct
  within a row: a row's only earlier copy of a token is one placed
  there."""
  lo, hi = token_range
  if hi - lo < length:
    raise ValueError(f"token_range: [{lo}, {hi}) holds {hi - lo} ids, "
                     f"fewer than the {length} distinct ones a row needs")
  rng = np.random.default_rng(seed)
  return np.stack([lo + rng.choice(hi - lo, length, replace=False)
                   for _ in range(n)]).astype(np.int32)


def repeated_tokens(n: int, length: int, token_range, *, seed: int,
                    bos: int | None = None) -> np.ndarray:
  """`[n, 2 length (+1)]`: random tokens, distinct within a row, repeated
  once (after `bos` if given): the input on which induction is the only
  way to predict the second copy (TransformerLens's induction test,
  Olsson et al.)."""
  x = distinct_tokens(n, length, token_range, seed=seed)
  pre = [] if bos is None else [np.full((n, 1), bos, np.int32)]
  return np.concatenate(pre + [x, x], 1)


def text_windows(encode, split: text_corpus.Split, n: int, length: int, *,
                 seed: int) -> np.ndarray:
  """`[n, length]` token ids: consecutive windows of the documents of
  `split` (each document tokenized whole by `encode: list[str] -> list of
  id arrays`), documents in a seeded order, at most a quarter of the
  windows from one document so that no single file dominates."""
  order = np.random.default_rng(seed).permutation(len(split.documents))
  cap = max(1, n // 4)
  rows = []
  for d in order:
    ids = encode([text_corpus.read_text(split.documents[d])])[0]
    k = min(len(ids) // length, cap, n - len(rows))
    rows.extend(ids[i * length:(i + 1) * length] for i in range(k))
    if len(rows) == n:
      return np.stack(rows).astype(np.int32)
  raise ValueError(f"text_windows: the {split.name} split holds only "
                   f"{len(rows)} windows of {length} tokens; asked for {n}")
