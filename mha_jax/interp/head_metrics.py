"""What does each head look at? Per-head metrics on attention weights.

Shape letters: B batch, H heads, Tq query length, Tk key length, T length of
a self-attention sequence (Tq = Tk = T), N offsets (2 Tk - 1).

Every metric takes weights `[B, H, Tq, Tk]` (what `attend` and the models
return) and gives one number per head, `[H]`, averaged over the batch and the
query rows that count. Queries and keys are placed as `causal_mask` places
them: query i sits at position `Tk - Tq + i`, key j at position j, so the
offset of key j from query i is `Tk - Tq + i - j` (1 = previous token).

Rows whose weights are all zero (a query with no visible key, which the core
turns into weights 0) are left out of every average instead of producing NaN;
a head with no row that counts scores 0.

All functions are pure and jit-able (shapes are static; nothing depends on
values except through `jnp.where`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _check_weights(weights, fn):
  if jnp.ndim(weights) != 4:
    raise ValueError(f"{fn}: `weights` must be [B, H, Tq, Tk], got shape "
                     f"{jnp.shape(weights)}")
  return jnp.asarray(weights, jnp.float32)


def _check_tokens(weights, tokens, fn):
  b, _, tq, tk = weights.shape
  if tq != tk:
    raise ValueError(f"{fn}: needs self-attention weights (Tq == Tk), got "
                     f"Tq={tq}, Tk={tk}")
  if jnp.shape(tokens) != (b, tk):
    raise ValueError(f"{fn}: `tokens` must be [B, T]=[{b}, {tk}], got "
                     f"{jnp.shape(tokens)}")
  return jnp.asarray(tokens)


def positions(tq: int, tk: int):
  """Query positions `[Tq, 1]` and key positions `[1, Tk]`, bottom-right."""
  return (jnp.arange(tq)[:, None] + (tk - tq), jnp.arange(tk)[None, :])


def offsets(tq: int, tk: int) -> jax.Array:
  """Offset `query position - key position`, `[Tq, Tk]` (1 = previous)."""
  q_pos, k_pos = positions(tq, tk)
  return q_pos - k_pos


def _lift(x, ndim):
  """Left-pad `x` with unit axes to rank `ndim` (rank promotion is explicit)."""
  return jnp.reshape(x, (1,) * (ndim - x.ndim) + x.shape)


def _argmax_offset(w):
  """Offset of each row's most attended key, `[B, H, Tq]`."""
  off = _lift(offsets(*w.shape[-2:]), 4)  # [1, 1, Tq, Tk]
  idx = jnp.argmax(w, axis=-1)[..., None]  # [B, H, Tq, 1]
  off = jnp.broadcast_to(off, w.shape)
  return jnp.take_along_axis(off, idx, axis=-1)[..., 0]


def valid_rows(weights: jax.Array) -> jax.Array:
  """`[B, H, Tq]` bool: rows that carry attention (all-zero rows do not)."""
  return jnp.sum(weights, axis=-1) > 0


def _mean_over_rows(values, counts):
  """Mean of `values [B, H, Tq]` over rows where `counts`, per head -> [H]."""
  counts = jnp.broadcast_to(counts, values.shape)
  total = jnp.sum(jnp.where(counts, values, 0.0), axis=(0, 2))
  n = jnp.sum(counts, axis=(0, 2))
  return jnp.where(n > 0, total / jnp.maximum(n, 1), 0.0)


def _xlogy(x, y):
  """x * log(y) with 0 * log(0) = 0 and finite gradients at 0."""
  safe_y = jnp.where(x > 0, y, 1.0)
  return jnp.where(x > 0, x * jnp.log(safe_y), 0.0)


def row_entropy(weights: jax.Array) -> jax.Array:
  """Entropy in nats of every row, `[B, H, Tq]` (0 for an empty row)."""
  return -jnp.sum(_xlogy(weights, weights), axis=-1)


def entropy(weights: jax.Array, *, base: float = math.e) -> jax.Array:
  """Mean entropy of each head's rows, `[H]`; log(n) for uniform over n keys.

  Low entropy = a sharp head (one key per query); log(visible keys) = a head
  that averages over everything it can see, like the source's flat head 1.
  """
  w = _check_weights(weights, "entropy")
  return _mean_over_rows(row_entropy(w), valid_rows(w)) / math.log(base)


def confidence(weights: jax.Array) -> jax.Array:
  """Mean of each row's largest weight, `[H]` (1 = always one-hot)."""
  w = _check_weights(weights, "confidence")
  return _mean_over_rows(jnp.max(w, axis=-1), valid_rows(w))


@jax.jit  # `offset` traced: one program serves every offset
def offset_score(weights: jax.Array, offset: int) -> jax.Array:
  """Mean weight on the key `offset` positions back, `[H]`.

  Only queries that have such a key (position >= offset) count, so a pure
  previous-token head scores exactly 1 although position 0 has no previous.
  """
  w = _check_weights(weights, "offset_score")
  tq, tk = w.shape[-2:]
  at = _lift(offsets(tq, tk) == offset, 4)  # [1, 1, Tq, Tk]
  has_key = jnp.any(at, axis=-1)  # [1, 1, Tq]
  mass = jnp.sum(jnp.where(at, w, 0.0), axis=-1)  # [B, H, Tq]
  return _mean_over_rows(mass, valid_rows(w) & has_key)


def previous_token_score(weights: jax.Array) -> jax.Array:
  """Mean weight on the immediately previous token, `[H]`."""
  return offset_score(weights, 1)


def mean_attention_distance(weights: jax.Array) -> jax.Array:
  """Expected |query position - key position| under each row, `[H]`."""
  w = _check_weights(weights, "mean_attention_distance")
  dist = _lift(jnp.abs(offsets(*w.shape[-2:])), 4).astype(jnp.float32)
  return _mean_over_rows(jnp.sum(w * dist, axis=-1), valid_rows(w))


def offset_histogram(weights: jax.Array):
  """Where each head's argmax lands, as offsets.

  Returns `(offset_values [N], fractions [H, N])`, N = 2 Tk - 1 offsets from
  -(Tk-1) to Tk-1; `fractions[h, n]` is the share of head h's valid rows
  whose most attended key is `offset_values[n]` positions back.
  """
  w = _check_weights(weights, "offset_histogram")
  tk = w.shape[-1]
  values = jnp.arange(-(tk - 1), tk)  # [N]
  hits = _argmax_offset(w)[..., None] == _lift(values, 4)  # [B, H, Tq, N]
  counts = valid_rows(w)[..., None] & hits
  n = jnp.sum(valid_rows(w), axis=(0, 2))[:, None]  # [H, 1]
  return values, jnp.sum(counts, axis=(0, 2)) / jnp.maximum(n, 1)


def positional_heads(weights: jax.Array, *, threshold: float = 0.9):
  """Is each head "positional at offset d"? Returns `(d, share, is_pos)`.

  For each offset d, the share of rows whose argmax lands d positions back,
  among the rows that have a key at offset d (position 0 has no previous
  token, so a perfect previous-token head still has share 1). Only offsets
  that at least half of the valid rows can reach compete: otherwise the
  longest offset, which only the last query has, would win by luck. `d [H]`
  is the offset with the largest share, `share [H]` that share and
  `is_pos [H]` whether `share >= threshold`.
  """
  w = _check_weights(weights, "positional_heads")
  tq, tk = w.shape[-2:]
  values = _lift(jnp.arange(-(tk - 1), tk), 3)  # [1, 1, N]
  has_key = jnp.any(offsets(tq, tk)[..., None] == values, axis=1)  # [Tq, N]
  eligible = valid_rows(w)[..., None] & _lift(has_key, 4)  # [B, H, Tq, N]
  hits = eligible & (_argmax_offset(w)[..., None] == _lift(values, 4))
  n_eligible = jnp.sum(eligible, axis=(0, 2))  # [H, N]
  n_valid = jnp.sum(valid_rows(w), axis=(0, 2))[:, None]  # [H, 1]
  share = jnp.where(2 * n_eligible >= n_valid,
                    jnp.sum(hits, axis=(0, 2)) / jnp.maximum(n_eligible, 1),
                    0.0)  # [H, N]
  best = jnp.argmax(share, axis=-1)  # [H]
  best_share = jnp.max(share, axis=-1)
  return values[0, 0, best], best_share, best_share >= threshold


def _earlier_same_token(tokens):
  """`[B, T, T]` bool: key j < query i holds the same token as query i."""
  t = tokens.shape[-1]
  same = tokens[:, :, None] == tokens[:, None, :]  # [B, Tq, Tk]
  earlier = jnp.arange(t)[None, :] < jnp.arange(t)[:, None]  # [Tq, Tk]
  return same & earlier[None]


def duplicate_token_score(weights: jax.Array, tokens: jax.Array) -> jax.Array:
  """Mean weight on earlier copies of the query's own token, `[H]`.

  Only queries whose token occurred before count.
  """
  return _token_target_score(weights, tokens, _earlier_same_token,
                             "duplicate_token_score")


def induction_targets(tokens: jax.Array) -> jax.Array:
  """`[B, T, T]` bool: key j+1 < i follows an earlier copy j of query i's token.

  This is where an induction head looks: "last time I saw this token, what
  came next?" Key j+1 <= i, so it is always visible under a causal mask.
  The query itself (j + 1 = i, when a token repeats immediately: "x x") is
  left out, as TransformerLens does: attending to oneself is what a
  current-token head does, and it must not count as induction.
  """
  dup = _earlier_same_token(tokens)  # [B, Tq, Tk], True at j
  # Shift right along keys: True at j+1 where dup was True at j.
  follows = jnp.pad(dup[..., :-1], ((0, 0), (0, 0), (1, 0)))
  t = tokens.shape[-1]
  return follows & ~jnp.eye(t, dtype=bool)[None]


def induction_score(weights: jax.Array, tokens: jax.Array) -> jax.Array:
  """Mean weight on the tokens that followed earlier copies, `[H]`.

  Only queries with such a token before them count (see
  `induction_targets`). A perfect induction head scores 1; a previous-token
  or uniform head scores about 1/(visible keys) per target unless the
  pattern happens to coincide (`uniform_causal_weights` gives that floor).
  """
  return _token_target_score(weights, tokens, induction_targets,
                             "induction_score")


def _token_target_score(weights, tokens, targets_fn, fn):
  """Mean weight on `targets_fn(tokens) [B, T, T]` over rows with a target."""
  w = _check_weights(weights, fn)
  target = targets_fn(_check_tokens(w, tokens, fn))[:, None]  # [B, 1, T, T]
  mass = jnp.sum(jnp.where(target, w, 0.0), axis=-1)  # [B, H, T]
  return _mean_over_rows(mass, valid_rows(w) & jnp.any(target, axis=-1))


def alignment_scores(weights: jax.Array, target: jax.Array,
                     valid: jax.Array | None = None):
  """How well each head's rows point at a known key.

  `target [B, Tq]` is the index of the right key for every query (for
  example the aligned source token in cross-attention) and `valid [B, Tq]`
  marks the queries that count. Returns `(accuracy, mass, mass_within_1)`,
  each `[H]`: the share of rows whose argmax is the target, the mean weight
  on the target, and the mean weight on keys target-1..target+1 (a head
  that spreads over the neighbours of the right token is not lost).
  """
  w = _check_weights(weights, "alignment_scores")
  b, _, tq, tk = w.shape
  if jnp.shape(target) != (b, tq):
    raise ValueError(f"alignment_scores: `target` must be [B, Tq]=[{b}, "
                     f"{tq}], got {jnp.shape(target)}")
  valid = jnp.ones((b, tq), bool) if valid is None else jnp.asarray(valid)
  counts = valid_rows(w) & valid[:, None, :].astype(bool)  # [B, H, Tq]
  hit = jnp.argmax(w, axis=-1) == target[:, None, :]
  onehot = jax.nn.one_hot(target, tk, dtype=w.dtype)[:, None]  # [B,1,Tq,Tk]
  mass = jnp.sum(w * onehot, axis=-1)
  near = jnp.abs(jnp.arange(tk)[None, None, :] - target[..., None]) <= 1
  mass_near = jnp.sum(jnp.where(near[:, None], w, 0.0), axis=-1)
  return (_mean_over_rows(hit.astype(jnp.float32), counts),
          _mean_over_rows(mass, counts), _mean_over_rows(mass_near, counts))


def aligned_source(src: jax.Array, pad_id: int = 0):
  """Where a decoder that reverses `src` should look: `(target, valid)`.

  `src [B, S]` holds right-padded source tokens (`pad_id` after each row's
  length n). Decoder step t of a reversal emits source token n - 1 - t, so
  `target [B, S]` is that source position (clipped at 0 past the end) and
  `valid [B, S]` marks the steps t < n that have one. Feed both to
  `alignment_scores` with cross-attention weights `[B, H, S, S]`.
  """
  src = jnp.asarray(src)
  if src.ndim != 2:
    raise ValueError(f"aligned_source: `src` must be [B, S] tokens, got "
                     f"shape {src.shape}")
  lengths = jnp.sum(src != pad_id, axis=-1, keepdims=True)  # [B, 1]
  t = jnp.arange(src.shape[1])[None, :]  # [1, S]
  return jnp.maximum(lengths - 1 - t, 0), t < lengths


def uniform_causal_weights(batch: int, length: int) -> jax.Array:
  """`[B, 1, T, T]`: each query spreads evenly over the keys it can see.

  The floor every score is read against: a head that looks nowhere in
  particular. `head_metrics(uniform_causal_weights(B, T), tokens)` scores
  it on the same sequences as the real heads.
  """
  visible = jnp.tril(jnp.ones((length, length), jnp.float32))
  w = visible / jnp.sum(visible, axis=-1, keepdims=True)
  return jnp.broadcast_to(w, (batch, 1, length, length))


def js_divergence(weights: jax.Array) -> jax.Array:
  """Mean Jensen-Shannon divergence between every pair of heads, `[H, H]`.

  In bits (log base 2), so it lies in [0, 1]: 0 for identical rows, 1 for
  rows with disjoint support (log 2 = 0.693 in nats). Averaged over the rows
  that are valid in both heads.
  """
  w = _check_weights(weights, "js_divergence")
  return _mean_over_pairs(_row_jsd(w), w)


def js_distance(weights: jax.Array) -> jax.Array:
  """Jensen-Shannon distance between heads, `[H, H]`, in [0, 1].

  Per row, the square root of the divergence in bits (a true metric), then
  averaged over rows; the average of metrics is still a metric, so the
  triangle inequality holds between heads.
  """
  w = _check_weights(weights, "js_distance")
  jsd = _row_jsd(w)
  dist = jnp.sqrt(jnp.where(jsd > 0, jsd, 0.0))
  return _mean_over_pairs(dist, w)


def _row_jsd(w):
  """JS divergence in bits per row between heads, `[B, H, H, Tq]`."""
  p = w[:, :, None]  # [B, H, 1, Tq, Tk]
  q = w[:, None, :]  # [B, 1, H, Tq, Tk]
  m = 0.5 * (p + q)
  # p * log(p / m), not p log p - p log m: the ratio is exactly 1 where the
  # heads agree, so a head's distance to itself is exactly 0 (the difference
  # of logs leaves ~1e-10, which the square root turns into ~1e-5).
  kl_pm = jnp.sum(_xlogy(p, p / jnp.where(m > 0, m, 1.0)), axis=-1)
  kl_qm = jnp.sum(_xlogy(q, q / jnp.where(m > 0, m, 1.0)), axis=-1)
  # Rounding can leave a tiny negative value; clamp to keep sqrt defined.
  return jnp.maximum(0.5 * (kl_pm + kl_qm), 0.0) / math.log(2.0)


def _mean_over_pairs(values, w):
  """Mean of `values [B, H, H, Tq]` over rows valid in both heads -> [H, H]."""
  valid = valid_rows(w)
  both = valid[:, :, None] & valid[:, None, :]  # [B, H, H, Tq]
  total = jnp.sum(jnp.where(both, values, 0.0), axis=(0, 3))
  n = jnp.sum(both, axis=(0, 3))
  return jnp.where(n > 0, total / jnp.maximum(n, 1), 0.0)


# One compiled program for all the metrics: called eagerly, each of their
# few dozen operations compiled on its own for every new shape (seconds).
@jax.jit
def head_metrics(weights: jax.Array,
                 tokens: jax.Array | None = None) -> dict[str, jax.Array]:
  """Every per-head metric at once: a dict of `[H]` arrays.

  Token-based scores (induction, duplicate) are included when `tokens [B, T]`
  is given. `positional_offset` is the most common argmax offset and
  `positional_share` the fraction of rows where it wins.
  """
  offset, share, _ = positional_heads(weights)
  out = {
      "entropy": entropy(weights),
      "confidence": confidence(weights),
      "previous_token": previous_token_score(weights),
      "mean_distance": mean_attention_distance(weights),
      "positional_offset": offset,
      "positional_share": share,
  }
  if tokens is not None:
    out["induction"] = induction_score(weights, tokens)
    out["duplicate_token"] = duplicate_token_score(weights, tokens)
  return out


# ------------------------------------------------- per example, padded rows
#
# The scores above pool rows over the batch. An encoder's padded batch needs
# two more things: the rows that count are the real query tokens (a padded
# query still attends), and an interval over sentences needs one score per
# sentence. These take `rows [B, Tq]` (True = a real query) and return
# `[B, H]`: each example's mean over its rows (0 for an example without one).


def per_example_mean(values: jax.Array, rows: jax.Array) -> jax.Array:
  """Mean of `values [B, H, Tq]` over each example's `rows` (`[B, Tq]`, or
  `[B, H, Tq]` where heads differ), `[B, H]`."""
  rows = jnp.asarray(rows, bool)
  rows = rows[:, None, :] if rows.ndim == 2 else rows  # [B, 1 or H, Tq]
  total = jnp.sum(jnp.where(rows, values, 0.0), axis=-1)
  n = jnp.sum(rows, axis=-1)
  return jnp.where(n > 0, total / jnp.maximum(n, 1), 0.0)


def target_share(weights: jax.Array, targets: jax.Array,
                 rows: jax.Array) -> jax.Array:
  """Each example's mean weight on `targets`, `[B, H]`.

  `targets [B, Tq, Tk]` (or broadcastable to it) marks the keys that count
  for each query; only `rows [B, Tq]` that have a target are averaged.
  """
  w = _check_weights(weights, "target_share")
  b, _, tq, tk = w.shape
  target = jnp.broadcast_to(jnp.asarray(targets, bool), (b, tq, tk))
  mass = jnp.sum(jnp.where(target[:, None], w, 0.0), axis=-1)  # [B, H, Tq]
  return per_example_mean(mass, jnp.asarray(rows, bool)
                          & jnp.any(target, axis=-1))


def in_class(tokens: jax.Array, class_ids) -> jax.Array:
  """`[B, T]` bool: tokens whose id is one of `class_ids` (a token class as
  data: `[CLS]`'s id, `[SEP]`'s, the ids of "." and ",")."""
  return jnp.isin(jnp.asarray(tokens), jnp.asarray(class_ids).reshape(-1))


def class_share(weights: jax.Array, key_class: jax.Array,
                rows: jax.Array) -> jax.Array:
  """Each example's mean weight on keys of a class `key_class [B, Tk]`,
  `[B, H]`, over `rows [B, Tq]` (Clark et al.'s share on [SEP], [CLS] or
  punctuation)."""
  return target_share(weights, jnp.asarray(key_class, bool)[:, None, :],
                      rows)


def offset_share(weights: jax.Array, offset: int, rows: jax.Array,
                 keys: jax.Array | None = None) -> jax.Array:
  """Each example's mean weight on the key `offset` positions back, `[B,
  H]`: 1 the previous token, -1 the next, 0 the token itself. Only rows
  whose key at that offset exists and is one of `keys [B, Tk]` (the real
  tokens; default all) count, so a perfect next-token head scores 1 although
  the last token has no next."""
  b, _, tq, tk = jnp.shape(weights)
  keys = jnp.ones((b, tk), bool) if keys is None else jnp.asarray(keys, bool)
  at = _lift(offsets(tq, tk) == offset, 3)  # [1, Tq, Tk]
  return target_share(weights, at & keys[:, None, :], rows)


def next_token_score(weights: jax.Array) -> jax.Array:
  """Mean weight on the immediately next token, `[H]` (bidirectional
  attention; the mirror of `previous_token_score`)."""
  return offset_score(weights, -1)


def entropy_per_example(weights: jax.Array, rows: jax.Array) -> jax.Array:
  """Each example's mean row entropy in nats over `rows [B, Tq]`, `[B, H]`."""
  w = _check_weights(weights, "entropy_per_example")
  return per_example_mean(row_entropy(w), jnp.asarray(rows, bool)[:, None]
                          & valid_rows(w))


def uniform_weights(visible: jax.Array) -> jax.Array:
  """`[B, 1, Tq, Tk]`: each query spread evenly over its `visible [B, Tq,
  Tk]` keys (rows with none stay 0); for a padded encoder `visible` is
  `mask[:, None, :]` broadcast over queries."""
  v = jnp.asarray(visible, jnp.float32)
  return (v / jnp.maximum(jnp.sum(v, -1, keepdims=True), 1.0))[:, None]
