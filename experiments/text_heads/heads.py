"""What heads look at in real text: scores for byte-level code, a taxonomy.

Shape letters: B batch, H heads, T length of a self-attention sequence
(queries and keys are the same T positions of a causal decoder), L layers,
D fixed offsets, V byte values (256).

Each score takes one layer's weights `[B, H, T, T]` and, where the keys
it credits depend on the text, the byte ids `tokens [B, T]` (bytes +
`first_id`, as the `text` task makes them). It returns `[H]`: the mean,
over the queries that have at least one such key, of the weight the head
puts on those keys (the convention of `mha_jax.interp.head_metrics`, whose
previous-token, duplicate-token and induction scores apply unchanged).
The keys each score credits, its "targets" `[B, T, T]` (query, key):

  * first token: key 0, for every later query. A head that parks its
    weight there is an attention sink.
  * fixed offset d: the key d positions back (`head_metrics.offset_score`);
    `fixed_offset` reports the best d in 0..D per head (0 = itself).
  * line start: the newline that began the query's line.
  * indentation: the spaces and tabs that open the query's line, for
    queries past them.
  * open bracket: the innermost `(`, `[` or `{` still open before the
    query (all three kinds counted together, inside strings and comments
    too: a syntactic-LOOKING relation, not a parse).
  * word start: for a query inside a word (ASCII letters, digits, `_`
    and non-ASCII bytes) and at least its second byte, the byte just
    before the word (a space, `.`, `(`, ...). The query's previous byte is
    then part of the word, so a previous-byte head gets no credit.
  * span induction with k bytes: the key right after an earlier
    occurrence of the k bytes that end at the query (k = 1 is
    `head_metrics.induction_targets`; larger k asks for a longer match, which
    a byte-level induction head needs because single bytes repeat
    everywhere).
  * strict span induction with k bytes: the same keys, less those that
    a head without any copying would also hit. A key fewer than
    `min_distance` positions back is dropped (so a head at one fixed
    offset below it, the previous-byte head included, scores 0 however
    the text repeats), and so is every key of a query whose k bytes are
    one byte repeated (runs of spaces, `====`), where the earlier
    "occurrence" is the run itself. The plain score credits a
    previous-byte head inside every run of k + 1 equal bytes, which
    indented code is full of.
  * rare byte: the earlier byte(s) rarest in the training counts
    (Voita et al.'s "rare words" head, on bytes).
  * repeated text: for a segment of n bytes given twice, the byte after
    the earlier copy (offset n - 1) for each query in the second copy
    (Olsson et al.'s repeated-sequence test, on held-out text).

Uniform causal attention on the same sequences is the floor of every
score (`head_metrics.uniform_causal_weights`). `classify` turns scores into
the taxonomy with thresholds its caller states; `in_context_score` is
Olsson et al.'s in-context-learning score. All array functions are pure
and jit-able (loops only over static sizes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.interp import head_metrics
from mha_jax.training import tasks

NEWLINE, SPACE, TAB = 10, 32, 9
OPEN_BRACKETS, CLOSE_BRACKETS = (40, 91, 123), (41, 93, 125)  # ( [ {  ) ] }
# The taxonomy, in the order a head that clears several thresholds is
# assigned (it is listed under every class it clears as well).
CLASSES = ("sink", "induction", "positional", "syntactic", "other")


def _check(weights, tokens, fn):
  w = jnp.asarray(weights, jnp.float32)
  if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
    raise ValueError(f"{fn}: `weights` must be [B, H, T, T], got shape "
                     f"{w.shape}")
  if tokens is not None and jnp.shape(tokens) != (w.shape[0], w.shape[-1]):
    raise ValueError(f"{fn}: `tokens` must be [B, T]=[{w.shape[0]}, "
                     f"{w.shape[-1]}], got {jnp.shape(tokens)}")
  return w


def target_score(weights: jax.Array, targets: jax.Array) -> jax.Array:
  """`[H]`: mean weight on `targets [B or 1, T, T]` over queries with one.

  Rows with no weight (no visible key) and queries without a target are
  left out; a head with no query left scores 0.
  """
  w = _check(weights, None, "target_score")
  t = jnp.asarray(targets, bool)[:, None]  # [B, 1, T, T]
  mass = jnp.sum(jnp.where(t, w, 0.0), axis=-1)  # [B, H, T]
  counts = head_metrics.valid_rows(w) & jnp.any(t, axis=-1)
  total = jnp.sum(jnp.where(counts, mass, 0.0), axis=(0, 2))
  n = jnp.sum(counts, axis=(0, 2))
  return jnp.where(n > 0, total / jnp.maximum(n, 1), 0.0)


def _key_is(index):
  """`[B, T, T]` bool: key == `index [B, T]` (per query), index >= 0."""
  t = index.shape[-1]
  keys = jnp.arange(t)[None, None, :]
  return (keys == index[..., None]) & (index >= 0)[..., None]


def _last_before(flag):
  """`[B, T]`: for each position i, the last j < i where `flag`, or -1."""
  t = flag.shape[-1]
  idx = jnp.where(flag, jnp.arange(t)[None, :], -1)
  last = jax.lax.cummax(idx, axis=1)  # last j <= i
  return jnp.pad(last[:, :-1], ((0, 0), (1, 0)), constant_values=-1)


def first_token_targets(batch: int, length: int) -> jax.Array:
  """`[B, T, T]`: key 0 for every query after position 0."""
  t = jnp.zeros((length, length), bool).at[1:, 0].set(True)
  return jnp.broadcast_to(t, (batch, length, length))


def line_start_targets(tokens, *, first_id: int = tasks.NUM_SPECIAL):
  """`[B, T, T]`: the newline that began each query's line (if in view)."""
  tokens = jnp.asarray(tokens)
  return _key_is(_last_before(tokens == NEWLINE + first_id))


def indentation_targets(tokens, *, first_id: int = tasks.NUM_SPECIAL):
  """`[B, T, T]`: the leading spaces/tabs of the query's line, for queries
  on that line past them (lines whose start is in view)."""
  tokens = jnp.asarray(tokens)
  t = tokens.shape[-1]
  pos = jnp.arange(t)[None, :]
  ws = (tokens == SPACE + first_id) | (tokens == TAB + first_id)
  # Leading whitespace: everything since the last newline is whitespace.
  last_other = jax.lax.cummax(jnp.where(ws, -1, pos), axis=1)  # [B, T]
  after_newline = jnp.take_along_axis(
      tokens, jnp.maximum(last_other, 0), axis=1) == NEWLINE + first_id
  leading = ws & (last_other >= 0) & after_newline  # [B, T]
  line = _last_before(tokens == NEWLINE + first_id)  # [B, T]
  keys = pos[:, None, :]  # [1, 1, T]
  queries = pos[:, :, None]  # [1, T, 1]
  return (leading[:, None, :] & (keys > line[..., None]) & (keys < queries)
          & (line >= 0)[..., None] & ~leading[..., None])


def open_bracket_targets(tokens, *, first_id: int = tasks.NUM_SPECIAL):
  """`[B, T, T]`: the innermost bracket still open before each query.

  With depth = opened minus closed so far, the innermost open bracket
  before query i is the last opening bracket j < i whose depth after it
  equals the depth before i: depth cannot climb back to that level
  without another opening bracket, which would come later.
  """
  tokens = jnp.asarray(tokens)
  t = tokens.shape[-1]
  is_open = jnp.isin(tokens, jnp.asarray(OPEN_BRACKETS) + first_id)
  is_close = jnp.isin(tokens, jnp.asarray(CLOSE_BRACKETS) + first_id)
  depth = jnp.cumsum(is_open.astype(jnp.int32) - is_close, axis=1)  # after
  before = jnp.pad(depth[:, :-1], ((0, 0), (1, 0)))  # [B, T]
  pos = jnp.arange(t)
  cand = (is_open[:, None, :] & (depth[:, None, :] == before[..., None])
          & (pos[None, None, :] < pos[None, :, None]))  # [B, Tq, Tk]
  last = jnp.max(jnp.where(cand, pos[None, None, :], -1), axis=-1)
  return _key_is(last)


def _is_word_byte(b):
  """`b` (bytes, any shape) in [0-9A-Za-z_] or non-ASCII (>= 128)."""
  return (((b >= 48) & (b <= 57)) | ((b >= 65) & (b <= 90))
          | ((b >= 97) & (b <= 122)) | (b == 95) | (b >= 128))


def word_start_targets(tokens, *, first_id: int = tasks.NUM_SPECIAL):
  """`[B, T, T]`: the byte before the word of each query that is at least
  the second byte of a word (the word's start is in view)."""
  tokens = jnp.asarray(tokens)
  t = tokens.shape[-1]
  word = _is_word_byte(tokens - first_id)
  boundary = _last_before(~word)  # [B, T]
  pos = jnp.arange(t)[None, :]
  inside = word & (boundary >= 0) & (boundary < pos - 1)
  return _key_is(jnp.where(inside, boundary, -1))


def span_induction_targets(tokens, k: int = 1):
  """`[B, T, T]`: key j + 1 < i where bytes j-k+1..j equal bytes i-k+1..i.

  k = 1 equals `head_metrics.induction_targets`. The query itself (j + 1 = i)
  is left out, as there.
  """
  tokens = jnp.asarray(tokens)
  if k < 1:
    raise ValueError(f"span_induction_targets: `k` must be >= 1, got {k}")
  t = tokens.shape[-1]
  same = tokens[:, :, None] == tokens[:, None, :]  # [B, Tq, Tk]
  match = same
  for m in range(1, k):  # same[i - m, j - m]: shift both axes by m
    match = match & jnp.pad(same[:, :-m, :-m], ((0, 0), (m, 0), (m, 0)))
  earlier = jnp.arange(t)[None, :] < jnp.arange(t)[:, None]
  dup = match & earlier[None]
  follows = jnp.pad(dup[..., :-1], ((0, 0), (0, 0), (1, 0)))  # True at j+1
  return follows & ~jnp.eye(t, dtype=bool)[None]


def strict_span_induction_targets(tokens, k: int = 3, *,
                                  min_distance: int = 2):
  """`[B, T, T]`: `span_induction_targets(tokens, k)` with key <= i -
  min_distance, for queries whose k bytes i-k+1..i are not all one byte.

  `min_distance` >= 2: distance 1 is the previous byte, the key this
  score exists to leave out. As in the plain score, a query fewer than k
  bytes into the window has no span and so no key.
  """
  tokens = jnp.asarray(tokens)
  if min_distance < 2:
    raise ValueError("strict_span_induction_targets: `min_distance` must "
                     f"be >= 2, got {min_distance}")
  t = tokens.shape[-1]
  run = jnp.ones(tokens.shape, bool)  # [B, T]: bytes i-k+1..i all equal
  for m in range(1, k):
    run = run & jnp.pad(tokens[:, m:] == tokens[:, :-m], ((0, 0), (m, 0)),
                        constant_values=True)
  pos = jnp.arange(t)
  far = pos[None, :] <= pos[:, None] - min_distance  # [Tq, Tk]
  return span_induction_targets(tokens, k) & far[None] & ~run[..., None]


def rare_byte_targets(tokens, counts, *, first_id: int = tasks.NUM_SPECIAL):
  """`[B, T, T]`: the earlier key(s) whose byte has the fewest training
  counts (`counts [V]`) among the keys before the query."""
  tokens = jnp.asarray(tokens)
  t = tokens.shape[-1]
  counts = jnp.asarray(counts, jnp.float32)
  freq = counts[jnp.clip(tokens - first_id, 0, counts.shape[0] - 1)]
  lowest = jax.lax.cummin(freq, axis=1)  # over keys <= i
  lowest = jnp.pad(lowest[:, :-1], ((0, 0), (1, 0)),
                   constant_values=jnp.inf)  # over keys < i
  pos = jnp.arange(t)
  return ((freq[:, None, :] == lowest[..., None])
          & (pos[None, None, :] < pos[None, :, None]))


def repeat_targets(length: int, n: int) -> jax.Array:
  """`[1, T, T]`: for queries n <= i < 2n, key i - n + 1 (the byte after
  the earlier copy of the query's byte when bytes n..2n-1 repeat 0..n-1)."""
  if not (1 <= n and 2 * n <= length):
    raise ValueError(f"repeat_targets: need 2 n <= T, got n={n}, T={length}")
  q = jnp.arange(length)[:, None]
  k = jnp.arange(length)[None, :]
  return ((q >= n) & (q < 2 * n) & (k == q - n + 1))[None]


def offset_profile(weights, max_offset: int) -> jax.Array:
  """`[H, D + 1]`: mean weight at offsets 0..max_offset (1 = previous)."""
  return jnp.stack([head_metrics.offset_score(weights, d)
                    for d in range(max_offset + 1)], axis=-1)


def fixed_offset(weights, max_offset: int):
  """`(offset [H], weight [H])`: each head's best fixed offset in
  0..max_offset and the mean weight it puts there."""
  prof = offset_profile(weights, max_offset)
  return jnp.argmax(prof, axis=-1), jnp.max(prof, axis=-1)


def text_scores(weights, tokens, *, counts, max_offset: int, span: int = 3,
                first_id: int = tasks.NUM_SPECIAL) -> dict:
  """Every text score of one layer on natural text: name -> `[H]`.

  first_token, line_start, indentation, open_bracket, word_start,
  span_induction (k = `span`), span_induction_strict (k = `span`, keys
  more than `max_offset` back: no offset the positional class tests is
  credited), rare_byte, fixed_offset (best d) and fixed_offset_weight;
  plus `head_metrics.head_metrics` (previous-token, induction, duplicate-token,
  entropy, ...).
  """
  w = _check(weights, tokens, "text_scores")
  b, _, t, _ = w.shape
  d, mass = fixed_offset(w, max_offset)
  out = dict(head_metrics.head_metrics(w, tokens))
  out.update(
      first_token=target_score(w, first_token_targets(b, t)),
      line_start=target_score(w, line_start_targets(tokens,
                                                    first_id=first_id)),
      indentation=target_score(w, indentation_targets(tokens,
                                                      first_id=first_id)),
      open_bracket=target_score(w, open_bracket_targets(tokens,
                                                        first_id=first_id)),
      word_start=target_score(w, word_start_targets(tokens,
                                                    first_id=first_id)),
      span_induction=target_score(w, span_induction_targets(tokens, span)),
      span_induction_strict=target_score(w, strict_span_induction_targets(
          tokens, span, min_distance=max_offset + 1)),
      rare_byte=target_score(w, rare_byte_targets(tokens, counts,
                                                  first_id=first_id)),
      fixed_offset=d, fixed_offset_weight=mass)
  return out


def in_context_score(loss, early, late) -> np.ndarray:
  """Olsson et al.'s in-context-learning score: mean loss at positions
  `late = (start, end)` minus mean loss at `early`, over the last axis of
  `loss [..., T]` (per-position losses). Negative: later bytes, which
  see more context, are predicted better."""
  loss = np.asarray(loss, np.float64)
  (e0, e1), (l0, l1) = early, late
  t = loss.shape[-1]
  if not (0 <= e0 < e1 <= t and 0 <= l0 < l1 <= t):
    raise ValueError(f"in_context_score: position ranges {early}, {late} "
                     f"must lie in [0, {t}] and be non-empty")
  return loss[..., l0:l1].mean(-1) - loss[..., e0:e1].mean(-1)


# Which score decides each class, and how a head's score is compared with
# the same score of uniform attention (its floor).
CLASS_SCORES = {
    "sink": ("first_token",),
    "induction": ("repeat_induction",),
    "positional": ("fixed_offset_weight",),
    "syntactic": ("line_start", "indentation", "open_bracket",
                  "word_start"),
}


def clears_threshold(score, floor, threshold, floor_ratio) -> np.ndarray:
  """`[...]` bool: `score` >= `threshold` and >= `floor_ratio` x `floor`
  (the same score of uniform attention): the taxonomy's rule for one
  score, which `classify` and the detectors' controls both apply."""
  s = np.asarray(score, np.float64)
  return (s >= float(threshold)) & (s >= float(floor_ratio) * np.asarray(
      floor, np.float64))


def classify(scores: dict, floors: dict, thresholds) -> dict:
  """The taxonomy of a model's heads from their scores.

  `scores`: name -> `[L, H]` (the names in `CLASS_SCORES`); `floors`: name
  -> the same score of uniform causal attention (a float, or `[L, H]`
  for a floor that depends on the head, such as the weight at its own
  best offset); `thresholds`: sink, induction, syntactic, positional
  (weights) and floor_ratio. A head clears a class when one of the
  class's scores is >= the class's threshold AND >= floor_ratio times its
  floor. Returns {"label": `[L, H]` str, the first class of `CLASSES`
  it clears, "other" if none; "clears": class -> `[L, H]` bool;
  "counts": class -> number of heads labelled so}.
  """
  shape = np.shape(scores["first_token"])
  clears = {}
  for cls, names in CLASS_SCORES.items():
    thr = float(thresholds[cls])
    hit = np.zeros(shape, bool)
    for name in names:
      floor = np.broadcast_to(np.asarray(floors[name], np.float64), shape)
      hit |= clears_threshold(scores[name], floor, thr, thresholds["floor_ratio"])
    clears[cls] = hit
  label = np.full(shape, "other", object)
  for cls in reversed(CLASSES[:-1]):  # earlier classes overwrite later
    label[clears[cls]] = cls
  return {"label": label, "clears": clears,
          "counts": {c: int(np.sum(label == c)) for c in CLASSES}}
