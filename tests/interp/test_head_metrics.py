"""Head metrics on hand-built patterns with known scores, and the plots."""

import math
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
from matplotlib.backends import backend_agg
import numpy as np

import mha_jax
from mha_jax.interp import head_metrics
from mha_jax.measure import plots

T = 8
# Jitted once: op-by-op dispatch of the unjitted metrics is slow on 2 cores.
_js_distance = jax.jit(head_metrics.js_distance)
_entropy = jax.jit(head_metrics.entropy)
_confidence = jax.jit(head_metrics.confidence)


def _batch(*patterns):
  """Stack `[Tq, Tk]` patterns as heads of one example: `[1, H, Tq, Tk]`."""
  return jnp.stack([jnp.asarray(p, jnp.float32) for p in patterns])[None]


def previous_token_pattern(t=T):
  """Every query on the previous key; position 0 (no previous) on itself."""
  return jnp.eye(t, k=-1).at[0, 0].set(1.0)


def uniform_causal_pattern(t=T):
  w = jnp.tril(jnp.ones((t, t)))
  return w / jnp.sum(w, axis=-1, keepdims=True)


def repeated_tokens(seg=4, reps=2):
  """Distinct tokens 10..10+seg-1 repeated `reps` times: `[1, seg*reps]`."""
  return jnp.tile(jnp.arange(10, 10 + seg), reps)[None]


def shifted_pattern(t, back):
  """Query i attends to key i-back (or to key 0 while i < back)."""
  rows = jnp.maximum(jnp.arange(t) - back, 0)
  return jax.nn.one_hot(rows, t)


class MetricTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_previous_token_pattern(self):
    w = _batch(previous_token_pattern())
    m = self.variant(head_metrics.head_metrics)(w)
    np.testing.assert_allclose(m["previous_token"], [1.0])
    np.testing.assert_allclose(m["entropy"], [0.0], atol=1e-7)
    np.testing.assert_allclose(m["confidence"], [1.0])
    self.assertEqual(int(m["positional_offset"][0]), 1)
    np.testing.assert_allclose(m["positional_share"], [1.0])
    # Offsets 0 (position 0) then 1 for the other T-1 queries.
    np.testing.assert_allclose(m["mean_distance"], [(T - 1) / T], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_uniform_causal_entropy_is_log_visible_keys(self):
    w = _batch(uniform_causal_pattern())
    # Query i sees i+1 keys; the mean over queries of log(i+1) = log(T!)/T.
    expected = math.lgamma(T + 1) / T
    got = self.variant(head_metrics.entropy)(w)
    np.testing.assert_allclose(got, [expected], rtol=1e-6)
    got_bits = self.variant(lambda x: head_metrics.entropy(x, base=2.0))(w)
    np.testing.assert_allclose(got_bits, [expected / math.log(2)], rtol=1e-6)
    # Previous-token weight of a uniform row is 1/(i+1) for i >= 1.
    expected_prev = np.mean([1 / (i + 1) for i in range(1, T)])
    np.testing.assert_allclose(head_metrics.previous_token_score(w),
                               [expected_prev], rtol=1e-6)

  def test_uniform_full_row_entropy_is_log_n(self):
    w = jnp.full((2, 3, 5, 7), 1 / 7)
    np.testing.assert_allclose(head_metrics.entropy(w), [math.log(7)] * 3,
                               rtol=1e-6)
    np.testing.assert_allclose(head_metrics.confidence(w), [1 / 7] * 3, rtol=1e-6)

  def test_positional_at_other_offsets(self):
    w = _batch(shifted_pattern(T, 3), uniform_causal_pattern())
    offset, share, is_pos = head_metrics.positional_heads(w)
    self.assertEqual(int(offset[0]), 3)
    np.testing.assert_allclose(share[0], 1.0)
    np.testing.assert_array_equal(is_pos, [True, False])
    values, frac = head_metrics.offset_histogram(w)
    np.testing.assert_allclose(jnp.sum(frac, axis=-1), [1.0, 1.0], rtol=1e-6)
    # Queries 0..2 cannot reach offset 3 and fall back to key 0 (offset i).
    np.testing.assert_allclose(frac[0, list(values).index(3)], (T - 3) / T)
    np.testing.assert_allclose(head_metrics.offset_score(w, 3)[0], 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_induction_and_duplicate_patterns(self):
    seg = 4
    tokens = repeated_tokens(seg)
    t = tokens.shape[1]
    induction = shifted_pattern(t, seg - 1)  # key i-seg+1: after the copy
    duplicate = shifted_pattern(t, seg)  # key i-seg: the earlier copy
    prev = previous_token_pattern(t)
    w = _batch(induction, duplicate, prev)
    ind = self.variant(head_metrics.induction_score)(w, tokens)
    dup = self.variant(head_metrics.duplicate_token_score)(w, tokens)
    np.testing.assert_allclose(ind, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(dup, [0.0, 1.0, 0.0])

  def test_induction_targets_known(self):
    tokens = jnp.array([[5, 6, 5, 7, 5]])
    targets = head_metrics.induction_targets(tokens)[0]
    expected = np.zeros((5, 5), bool)
    expected[2, 1] = True  # 5 at 2: earlier 5 at 0, next key 1
    expected[4, 1] = expected[4, 3] = True  # 5 at 4: after 0 and after 2
    np.testing.assert_array_equal(targets, expected)

  def test_induction_does_not_credit_the_query_itself(self):
    # "3 3": the earlier 3 at 0 is followed by key 1, the query itself.
    tokens = jnp.array([[3, 3, 4, 3, 3]])
    expected = np.zeros((5, 5), bool)
    expected[3, 1] = expected[3, 2] = True  # after the 3s at 0 and 1
    expected[4, 1] = expected[4, 2] = True  # (key 4, itself, left out)
    np.testing.assert_array_equal(head_metrics.induction_targets(tokens)[0],
                                  expected)
    # A current-token head scores 0, not the 2/3 that crediting rows 1
    # and 4 for attending to themselves would give.
    self_head = _batch(np.eye(5, dtype=np.float32))
    np.testing.assert_allclose(head_metrics.induction_score(self_head, tokens),
                               [0.0])

  def test_uniform_causal_floor(self):
    w = head_metrics.uniform_causal_weights(2, T)
    assert w.shape == (2, 1, T, T)
    np.testing.assert_allclose(jnp.sum(w, -1), 1.0, rtol=1e-6)
    # Query i sees i + 1 keys; rows 1..T-1 count for the previous token.
    expected = np.mean([1 / (i + 1) for i in range(1, T)])
    np.testing.assert_allclose(head_metrics.previous_token_score(w), [expected],
                               rtol=1e-6)
    np.testing.assert_allclose(head_metrics.entropy(w),
                               [np.mean(np.log(np.arange(1, T + 1)))],
                               rtol=1e-5)

  def test_token_metrics_reject_bad_shapes(self):
    w = _batch(uniform_causal_pattern())
    with self.assertRaisesRegex(ValueError, "tokens"):
      head_metrics.induction_score(w, jnp.zeros((1, T + 1), jnp.int32))
    with self.assertRaisesRegex(ValueError, "Tq == Tk"):
      head_metrics.induction_score(w[:, :, :3], jnp.zeros((1, T), jnp.int32))
    with self.assertRaisesRegex(ValueError, r"\[B, H, Tq, Tk\]"):
      head_metrics.entropy(w[0])

  def test_alignment_of_anti_diagonal(self):
    # Reversal of a length-5 source padded to 6: query t should read 4 - t.
    src_len, s = 5, 6
    anti = np.zeros((s, s), np.float32)
    for t in range(src_len):
      anti[t, src_len - 1 - t] = 1.0
    anti[src_len:, 0] = 1.0  # padded queries: anything
    w = _batch(anti, np.full((s, s), 1 / s))
    target = jnp.asarray([[max(src_len - 1 - t, 0) for t in range(s)]])
    valid = jnp.arange(s)[None] < src_len
    # A third head reads the neighbour after the target: wrong, but close.
    off_by_one = np.zeros((s, s), np.float32)
    for t in range(s):
      off_by_one[t, min(max(src_len - 1 - t, 0) + 1, s - 1)] = 1.0
    w = jnp.concatenate([w, _batch(off_by_one)], axis=1)
    acc, mass, near = head_metrics.alignment_scores(w, target, valid)
    # Uniform rows put their argmax on key 0: right only for t = 4.
    np.testing.assert_allclose(acc, [1.0, 1 / src_len, 0.0], rtol=1e-6)
    np.testing.assert_allclose(mass, [1.0, 1 / s, 0.0], rtol=1e-6)
    # Within +-1: the uniform head has 3 of its 6 keys there (only 2 for
    # target 0, row 4), the shifted head all its weight.
    np.testing.assert_allclose(near, [1.0, (4 * 3 + 2) / (6 * 5), 1.0],
                               rtol=1e-6)

  def test_aligned_source_of_a_reversal(self):
    src = np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])  # 0 = PAD
    target, valid = head_metrics.aligned_source(src)
    np.testing.assert_array_equal(target[0, :3], [2, 1, 0])
    np.testing.assert_array_equal(valid[0], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(target[1], [4, 3, 2, 1, 0])
    # The target positions really hold the reversed sequence.
    tgt = np.take_along_axis(src, np.asarray(target), axis=1)
    np.testing.assert_array_equal(tgt[0, :3], [7, 6, 5])
    # Another padding id; a source that is not [B, S] names the argument.
    target, valid = head_metrics.aligned_source(src + 1, pad_id=1)
    np.testing.assert_array_equal(target[0, :3], [2, 1, 0])
    with self.assertRaisesRegex(ValueError, "`src` must be"):
      head_metrics.aligned_source(src[0])

  @chex.variants(with_jit=True, without_jit=True)
  def test_js_self_zero_and_disjoint_one_bit(self):
    a = shifted_pattern(T, 0)  # attend to self
    b = shifted_pattern(T, 1)
    w = _batch(a, a, b)
    jsd = self.variant(head_metrics.js_divergence)(w)
    dist = self.variant(head_metrics.js_distance)(w)
    # Rows 1.. are disjoint one-hots (1 bit = log 2 nats); row 0 coincides.
    disjoint = (T - 1) / T
    expected = np.array([[0, 0, disjoint], [0, 0, disjoint],
                         [disjoint, disjoint, 0]])
    np.testing.assert_allclose(jsd, expected, atol=1e-6)
    np.testing.assert_allclose(dist, expected, atol=1e-6)

  def test_js_disjoint_is_log2_nats(self):
    p = jnp.array([[1.0, 0.0]])
    q = jnp.array([[0.0, 1.0]])
    jsd_bits = head_metrics.js_divergence(_batch(p, q))[0, 1]
    np.testing.assert_allclose(jsd_bits * math.log(2), math.log(2), rtol=1e-6)

  def test_empty_rows_are_skipped_without_nan(self):
    # A padded sequence: keys 5.. are masked for every query, and with a
    # padded query block too, so some rows are entirely zero.
    key = jax.random.PRNGKey(0)
    q = jax.random.normal(key, (2, T, 2, 4))
    mask = mha_jax.padding_mask(jnp.array([T, 0]), T)  # 2nd sequence: empty
    _, w = mha_jax.attend(q, q, q, mask=mask, is_causal=True)
    toks = repeated_tokens(4)
    toks = jnp.concatenate([toks, toks])
    metrics = jax.jit(head_metrics.head_metrics)
    full = metrics(w[:1], toks[:1])
    both = metrics(w, toks)
    for name in full:
      self.assertTrue(np.all(np.isfinite(both[name])), name)
      np.testing.assert_allclose(both[name], full[name], rtol=1e-6,
                                 err_msg=name)
    # Gradients of a metric through the empty rows stay finite.
    grad = jax.jit(jax.grad(lambda x: jnp.sum(head_metrics.entropy(x))
                    + jnp.sum(head_metrics.js_distance(x))))(w)
    self.assertTrue(np.all(np.isfinite(grad)))

  def test_js_matches_independent_numpy(self):
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(6) * 0.5, size=(2, 3, 4))  # [B, H, Tq, Tk]

    def jsd(p, q):
      m = (p + q) / 2
      kl = lambda a, b: sum(x * math.log2(x / y) for x, y in zip(a, b) if x)
      return (kl(p, m) + kl(q, m)) / 2

    expected = np.zeros((3, 3))
    for i in range(3):
      for j in range(3):
        expected[i, j] = np.mean([math.sqrt(jsd(w[b, i, r], w[b, j, r]))
                                  for b in range(2) for r in range(4)])
    np.testing.assert_allclose(_js_distance(w), expected, atol=1e-5)


_patterns = st.integers(0, 2**31 - 1).map(
    lambda s: np.random.default_rng(s).dirichlet(np.full(6, 0.3),
                                                 size=(1, 4, 6)))


class PaddedPerExampleTest(absltest.TestCase):
  """The per-example scores of a padded encoder batch, on hand-built
  patterns: example 0 has 4 real tokens of 5 (the last is PAD), example 1
  all 5."""

  CLS, SEP, DOT, COMMA, PAD = 1, 2, 7, 8, 0
  TOKENS = jnp.asarray([[1, 7, 2, 2, 0], [1, 5, 8, 7, 2]])
  MASK = TOKENS != 0

  def _patterns(self):
    """`[2, 4, 5, 5]`: on [CLS] (key 0), next token, previous token,
    uniform over the real keys; example 0's padded row (query 4) puts all
    its weight on key 0, which no score may count."""
    t = 5
    on_cls = jnp.zeros((t, t)).at[:, 0].set(1.0)
    nxt = jnp.eye(t, k=1).at[t - 1, t - 1].set(1.0)
    prev = jnp.eye(t, k=-1).at[0, 0].set(1.0)
    ex0 = [on_cls, nxt.at[3].set(jnp.eye(t)[3]), prev]
    ex1 = [on_cls, nxt, prev]
    real0 = jnp.asarray([1.0, 1, 1, 1, 0])
    ex0.append(jnp.broadcast_to(real0 / 4, (t, t)))
    ex1.append(jnp.full((t, t), 1 / 5))
    w = jnp.stack([jnp.stack(ex0), jnp.stack(ex1)])
    return w.at[0, :, 4].set(jnp.zeros(t).at[0].set(1.0))

  def test_class_shares_take_the_class_as_data(self):
    w = self._patterns()
    cls = head_metrics.class_share(
        w, head_metrics.in_class(self.TOKENS, [self.CLS]), self.MASK)
    # The previous-token head is on [CLS] at queries 0 (itself) and 1.
    np.testing.assert_allclose(cls, [[1, 0, 2 / 4, 1 / 4],
                                     [1, 0, 2 / 5, 1 / 5]], atol=1e-6)
    punct = head_metrics.in_class(self.TOKENS, [self.DOT, self.COMMA])
    np.testing.assert_array_equal(punct, [[0, 1, 0, 0, 0], [0, 0, 1, 1, 0]])
    share = head_metrics.class_share(w, punct, self.MASK)
    # Next-token head: example 0's query 0 goes to "." (key 1) of 4 rows;
    # example 1's queries 1 and 2 go to keys 2 and 3, both punctuation.
    np.testing.assert_allclose(share[:, 1], [1 / 4, 2 / 5], atol=1e-6)
    np.testing.assert_allclose(share[:, 3], [1 / 4, 2 / 5], atol=1e-6)
    sep = head_metrics.class_share(
        w, head_metrics.in_class(self.TOKENS, [self.SEP]), self.MASK)
    # Example 0's query 3 looks back at [SEP] (key 2); example 1's [SEP]
    # is last, so no query's previous token is [SEP].
    np.testing.assert_allclose(sep[:, 2], [1 / 4, 0.0], atol=1e-6)

  def test_previous_next_and_self_shares(self):
    w = self._patterns()
    share = lambda d: head_metrics.offset_share(w, d, self.MASK,
                                                keys=self.MASK)
    # The next-token head scores 1: example 0's query 3 has no real next
    # token (PAD), so it does not count although it sits on itself.
    np.testing.assert_allclose(share(-1), [[0, 1, 0, 1 / 4],
                                           [0, 1, 0, 1 / 5]], atol=1e-6)
    # The [CLS] head is its query 1's previous token (of 3 or 4 rows that
    # have one).
    np.testing.assert_allclose(share(1), [[1 / 3, 0, 1, 1 / 4],
                                          [1 / 4, 0, 1, 1 / 5]], atol=1e-6)
    # On itself: [CLS] head at query 0; previous head at query 0; example
    # 0's next head at query 3.
    np.testing.assert_allclose(share(0), [[1 / 4, 1 / 4, 1 / 4, 1 / 4],
                                          [1 / 5, 1 / 5, 1 / 5, 1 / 5]],
                               atol=1e-6)

  def test_next_token_score_mirrors_previous(self):
    nxt = _batch(jnp.eye(T, k=1).at[T - 1, 0].set(1.0))
    np.testing.assert_allclose(head_metrics.next_token_score(nxt), [1.0])
    np.testing.assert_allclose(head_metrics.previous_token_score(nxt), [0.0])
    prev = _batch(previous_token_pattern())
    np.testing.assert_allclose(head_metrics.next_token_score(prev), [0.0])

  def test_entropy_and_uniform_floor_over_real_tokens(self):
    w = self._patterns()
    ent = head_metrics.entropy_per_example(w, self.MASK)
    np.testing.assert_allclose(ent[:, 0], [0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(ent[:, 3], [math.log(4), math.log(5)],
                               rtol=1e-6)
    visible = jnp.broadcast_to(self.MASK[:, None, :], (2, 5, 5))
    uni = head_metrics.uniform_weights(visible)
    np.testing.assert_allclose(uni[:, 0], w[:, 3].at[0, 4].set(w[0, 3, 0]),
                               atol=1e-6)
    np.testing.assert_allclose(head_metrics.uniform_weights(
        jnp.zeros((1, 2, 3), bool)), np.zeros((1, 1, 2, 3)))

  def test_an_example_without_rows_scores_0(self):
    w = self._patterns()
    rows = self.MASK.at[1].set(False)
    share = head_metrics.class_share(w, self.MASK, rows)
    np.testing.assert_allclose(share[1], np.zeros(4))
    np.testing.assert_allclose(head_metrics.per_example_mean(
        jnp.ones((2, 4, 5)), rows), [[1] * 4, [0] * 4])


class PropertyTest(absltest.TestCase):

  @hypothesis.settings(max_examples=25, deadline=None)
  @hypothesis.given(_patterns)
  def test_js_distance_is_a_metric(self, w):
    d = np.asarray(_js_distance(w), np.float64)
    np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-6)
    np.testing.assert_allclose(d, d.T, atol=1e-6)
    self.assertTrue(np.all(d >= 0) and np.all(d <= 1 + 1e-6))
    for k in range(4):  # triangle inequality through every third head
      self.assertTrue(np.all(d <= d[:, k:k + 1] + d[k:k + 1, :] + 1e-4))

  @hypothesis.settings(max_examples=25, deadline=None)
  @hypothesis.given(_patterns)
  def test_entropy_and_confidence_bounds(self, w):
    ent = np.asarray(_entropy(w))
    conf = np.asarray(_confidence(w))
    self.assertTrue(np.all(ent >= -1e-6) and np.all(ent <= math.log(6) + 1e-5))
    self.assertTrue(np.all(conf >= 1 / 6 - 1e-6) and np.all(conf <= 1 + 1e-6))
    # Max weight m bounds entropy from below: H >= -log m (min-entropy).
    row_ent = np.asarray(head_metrics.row_entropy(jnp.asarray(w, jnp.float32)))
    self.assertTrue(np.all(row_ent >= -np.log(w.max(-1)) - 1e-5))


class PlotTest(absltest.TestCase):

  def _assert_png(self, path):
    with open(path, "rb") as f:
      data = f.read()
    self.assertGreater(len(data), 1000)
    self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")

  def _renderer(self, fig):
    # The figures are made outside pyplot, on a canvas that cannot draw;
    # Agg lays them out as savefig does, without choosing a backend.
    canvas = backend_agg.FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()

  def _text_boxes(self, fig, texts):
    renderer = self._renderer(fig)
    return [t.get_window_extent(renderer) for t in texts
            if t.get_visible() and t.get_text()]

  def _assert_apart(self, boxes):
    for i, a in enumerate(boxes):
      for b in boxes[i + 1:]:
        self.assertFalse(a.overlaps(b), (a, b))

  def test_long_sequences_get_readable_tick_labels(self):
    # 33 positions on a 2.6-inch panel: every label at 7 pt would overlap,
    # so every second one is drawn, none overlapping another.
    t = 33
    w = np.full((1, 2, t, t), 1.0 / t)
    labels = [str(10 + i) for i in range(t)]
    fig = plots.attention_grid(w, q_labels=labels, k_labels=labels,
                               cell=2.6)
    ax = fig.axes[0]
    for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
      self.assertEqual([x.get_text() for x in ticks], labels[::2])
      self.assertTrue(all(x.get_fontsize() >= 7 for x in ticks))
      self._assert_apart(self._text_boxes(fig, ticks))
    self.assertEqual(list(ax.get_xticks()), list(range(0, t, 2)))

  def test_metric_bars_legend_covers_no_bar(self):
    vals = np.array([[0.9, 0.1, 0.8], [0.85, 0.9, 0.95]])
    fig = plots.metric_bars({"induction": vals, "other": vals})
    renderer = self._renderer(fig)
    self.assertTrue(all(ax.get_legend() is None for ax in fig.axes))
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    self.assertEqual([t.get_text() for t in legend.get_texts()],
                     ["layer 0", "layer 1"])
    for ax in fig.axes:
      self.assertFalse(box.overlaps(ax.get_window_extent(renderer)))

  def test_setting_bars_labels_do_not_overlap(self):
    labels = ["h=1", "h=2", "h=4, d_model=256 (d_k=256)",
              "h=1 + MLP (F=256)"]
    fig = plots.setting_bars(labels, [0.5, 1e-3, 0.6, 0.5], ylabel="NMSE",
                             logy=True)
    self._assert_apart(self._text_boxes(fig, fig.axes[0].get_xticklabels()))

  def test_attention_grid_has_one_axes_per_head(self):
    rng = np.random.default_rng(0)
    layers, heads, t = 2, 3, 6
    w = rng.dirichlet(np.ones(t), size=(layers, heads, t))
    path = os.path.join(self.enter_context(tempfile.TemporaryDirectory()),
                        "grid.png")
    labels = list("abcdef")
    fig = plots.attention_grid(w, q_labels=labels, k_labels=labels,
                               title="test", path=path)
    self.assertLen(fig.axes, layers * heads)
    self.assertEqual(fig.axes[3].get_title(), "L1H0")
    self.assertEqual([t.get_text() for t in fig.axes[3].get_xticklabels()],
                     labels)
    self._assert_png(path)
    with self.assertRaisesRegex(ValueError, "layer 0"):
      plots.attention_grid([w[0, 0]])

  def test_metric_bars_and_loss_curves(self):
    path = self.enter_context(tempfile.TemporaryDirectory())
    metrics = {"entropy": np.ones((2, 4)), "induction": np.zeros((2, 4))}
    fig = plots.metric_bars(metrics, path=path + "/bars.png")
    self.assertLen(fig.axes, 2)
    self.assertLen(fig.axes[0].patches, 2 * 4)  # one bar per (layer, head)
    self._assert_png(path + "/bars.png")
    fig = plots.loss_curves({"a": ([0, 1, 2], [3.0, 2.0, 1.0]),
                             "b": ([0, 1, 2], [3.0, 2.5, 2.0])},
                            path=path + "/loss.png")
    self.assertLen(fig.axes[0].get_lines(), 2)
    np.testing.assert_allclose(fig.axes[0].get_lines()[1].get_ydata(),
                               [3.0, 2.5, 2.0])
    self._assert_png(path + "/loss.png")


if __name__ == "__main__":
  absltest.main()
