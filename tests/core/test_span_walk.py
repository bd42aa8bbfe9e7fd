"""The span walk of a banded block mask (`flash_schedule.span_plan`): its plan
worked by hand, and the kernel on it against a float64 reference (values
and gradients, with a score table, sinks, GQA, padding and empty rows) and
against a tampered list."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import block_mask
from mha_jax.core import masks
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.core.kernels import flash_schedule
from tests.core.rule_reference import reference

# A causal window of 6 keys on blocks of 4: query block i (rows 4i..4i+3)
# sees keys 4i-5..4i+3, key blocks i-2..i.
WINDOW_NUM = np.array([[[1, 2, 3, 3, 3, 3]]], np.int32)
WINDOW_IDX = np.array([[[[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5],
                         [0, 1, 2, 3, 4, 5], [1, 2, 3, 0, 4, 5],
                         [2, 3, 4, 0, 1, 5], [3, 4, 5, 0, 1, 2]]]], np.int32)


def test_span_plan_known_answers(monkeypatch):
  plan = flash_schedule.span_plan(WINDOW_NUM, WINDOW_IDX, 6, 4, 4, 2)
  # 6 x 3 = 18 blocks computed for the 15 listed: within SPAN_SLACK.
  assert plan.length == 3
  np.testing.assert_array_equal(plan.first, [0, 0, 0, 1, 2, 3])
  np.testing.assert_array_equal(plan.listed, [[1, 0, 0], [1, 1, 0]] +
                                [[1, 1, 1]] * 4)
  # SPAN_ROWS // 4 = 128 query blocks per step, cut to a divisor of 6.
  assert plan.group == 6
  monkeypatch.setattr(flash_schedule, "SPAN_ROWS", 16)  # 4, cut to 3
  assert flash_schedule.span_plan(WINDOW_NUM, WINDOW_IDX, 6, 4, 4, 2).group == 3
  # The block mask of the rule gives these lists.
  rule = masks.and_mods(masks.causal_mod(), masks.window_mod(5))
  bm = block_mask.create(rule, None, None, 24, 24, 4, 4)
  num, idx, _ = bm.kernel_lists(1, per_head=False)
  got = flash_schedule.span_plan(num, idx, 6, 4, 4, 2)
  np.testing.assert_array_equal(got.first, plan.first)
  np.testing.assert_array_equal(got.listed, plan.listed)
  # Causal: 6 x 6 = 36 blocks for 21 listed, too many.
  causal_idx = np.broadcast_to(np.arange(6), (1, 1, 6, 6))
  assert flash_schedule.span_plan(np.arange(1, 7)[None, None], causal_idx, 6,
                                  4, 4, 2) is None
  # Lists that differ by head, a span over one walk block (512 x 512) or a
  # query block whose scores pass SPAN_BYTES: no span.
  assert flash_schedule.span_plan(np.repeat(WINDOW_NUM, 2, 1),
                                  np.repeat(WINDOW_IDX, 2, 1), 6, 4, 4,
                                  2) is None
  assert flash_schedule.span_plan(WINDOW_NUM, WINDOW_IDX, 6, 512, 256,
                                  1) is None
  assert flash_schedule.span_plan(WINDOW_NUM, WINDOW_IDX, 6, 4, 4,
                                  2 ** 20) is None
  # A row with no listed block (18 blocks for 12 listed: allowed here) has
  # a span from block 0 and nothing listed.
  monkeypatch.setattr(flash_schedule, "SPAN_SLACK", 2.0)
  num = WINDOW_NUM.copy()
  num[0, 0, 4] = 0
  empty = flash_schedule.span_plan(num, WINDOW_IDX, 6, 4, 4, 2)
  assert empty.first[4] == 0 and not empty.listed[4].any()


def _lists(rows, nk):
  """`(num [1, 1, Nq], idx [1, 1, Nq, Nk])` listing `rows` (key blocks
  per query block), the unlisted blocks after them."""
  num = np.array([[[len(r) for r in rows]]], np.int32)
  idx = np.array([[[list(r) + [j for j in range(nk) if j not in r]
                    for r in rows]]], np.int32)
  return num, idx


def test_span_plan_edges_known_answers(monkeypatch):
  # A short run at the end starts its span early, inside the keys: query
  # block 3 sees block 3 only, and its span of 3 is blocks 1-3.
  plan = flash_schedule.span_plan(*_lists([[0, 1, 2], [1, 2, 3], [1, 2, 3],
                                           [3]], 4), 4, 4, 4, 1)
  np.testing.assert_array_equal(plan.first, [0, 1, 1, 1])
  np.testing.assert_array_equal(plan.listed[3], [0, 0, 1])
  # One block each (a diagonal), with an empty row: spans of 1.
  plan = flash_schedule.span_plan(*_lists([[0], [], [2], [3], [4]], 5), 5, 4,
                                  4, 1)
  assert plan.length == 1
  np.testing.assert_array_equal(plan.first, [0, 0, 2, 3, 4])
  # At the bounds, taken; past them, not. 5 query blocks against 7 key
  # blocks, spans of 2: 10 blocks for 8 listed is SPAN_SLACK = 1.25
  # exactly; for 7 listed, past it.
  rows = [[0], [1], [1, 2], [2, 3], [3, 4]]
  assert flash_schedule.span_plan(*_lists(rows, 7), 7, 4, 4, 1).length == 2
  assert flash_schedule.span_plan(*_lists(rows[:-1] + [[4]], 7), 7, 4, 4,
                                  1) is None
  # A span of 256 x 2 x 512 = 512 x 512 scores (SPAN_AREA): taken;
  # queries of 512, not.
  assert flash_schedule.span_plan(*_lists(rows, 7), 7, 256, 512, 1) is not None
  assert flash_schedule.span_plan(*_lists(rows, 7), 7, 512, 512, 1) is None
  # Blocks of 1024 queries: one query block per step.
  assert flash_schedule.span_plan(*_lists([[0], [1]], 2), 2, 1024, 128,
                                  1).group == 1
  # SPAN_BYTES: one query block's scores are 4 B H x 4 x 3 x 4 = 192 B H
  # bytes; a step holds as many query blocks as fit, a divisor of 6.
  monkeypatch.setattr(flash_schedule, "SPAN_BYTES", 1920)
  group = lambda bh: getattr(flash_schedule.span_plan(
      WINDOW_NUM, WINDOW_IDX, 6, 4, 4, bh), "group", None)
  assert [group(bh) for bh in (3, 5, 7, 10, 11)] == [3, 2, 1, 1, None]


def test_span_walk_reads_the_masks_lists_or_the_calls():
  window = masks.and_mods(masks.causal_mod(), masks.window_mod(5))
  bm = block_mask.create(window, None, None, 24, 24, 4, 4)
  plan = flash.span_walk("cpu", bm, 2)  # the mask's own lists
  assert plan.length == 3
  np.testing.assert_array_equal(plan.first, [0, 0, 0, 1, 2, 3])
  assert flash.span_walk("gpu", bm, 2) is None
  assert flash.span_walk("cpu", bm, 2, head_loop=True) is None


@pytest.mark.cpu_only("the span walk is taken by default on the CPU "
                      "backend only (span_walk); elsewhere no plan is "
                      "made")
def test_call_cuts_the_spans_by_its_builtin_rules(monkeypatch):
  # A window 5 keys back and ahead: its own lists are blocks i-2..i+2,
  # spans of 5 (30 computed for 24 listed, within SPAN_SLACK). The call's
  # is_causal cuts them to i-2..i: spans of 3.
  taken = _spans_taken(monkeypatch)
  rule = masks.window_mod(5, 5)
  bm = block_mask.create(rule, None, None, 24, 24, 4, 4)
  q = jnp.ones((1, 24, 2, 8))
  flash.flash_attention(q, q, q, is_causal=True, rules=score_rules.ScoreRules(
      mask_mod=rule, block_mask=bm))
  assert taken[-1].length == 3


def _spans_taken(monkeypatch):
  """The plans `flash_attention` takes, recorded."""
  taken, plan_of = [], flash_schedule.span_plan
  def record(*args):
    plan = plan_of(*args)
    taken.append(plan)
    return plan
  monkeypatch.setattr(flash_schedule, "span_plan", record)  # span_walk's
  return taken


def check_against_reference(b, t, h, kh, keep, with_sinks, seed):
  """The span walk (spans=True) on blocks of 4 under the rule `keep(qi,
  ki)` with a learned relative-position table (and sink logits), values
  and gradients against the float64 reference; returns the plan taken.
  Also run over random shapes in the heavy tier
  (tests/real_models/test_score_mod_shapes.py)."""
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(h, 2 * t - 1)).astype(np.float32)
  sinks = rng.normal(size=(h,)).astype(np.float32) if with_sinks else None
  rule = types.SimpleNamespace(
      score_np=lambda s, b, h, qi, ki: s + table[h, qi - ki + t - 1],
      dscore_np=lambda s, *_: np.ones_like(s),
      mask_np=lambda b, h, qi, ki: keep(qi, ki), sinks=sinks)
  mask_mod = lambda b, h, qi, ki: keep(qi, ki)
  bm = block_mask.create(mask_mod, None, None, t, t, 4, 4)
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in
             ((b, t, h, 8), (b, t, kh, 8), (b, t, kh, 8)))
  w = rng.normal(size=(b, t, h, 8)).astype(np.float32)

  def loss(q, k, v, table):
    rules = score_rules.ScoreRules(
        score_mod=lambda s, b, h, qi, ki: s + table[h, qi - ki + t - 1],
        mask_mod=mask_mod, block_mask=bm,
        sinks=None if sinks is None else jnp.asarray(sinks))
    out = flash.flash_attention(q, k, v, rules=rules, spans=True)
    return jnp.sum(out * w), out
  (_, out), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, jnp.asarray(table))
  want_out, *want_grads, dmod = reference(q, k, v, w, rule)
  np.testing.assert_allclose(out, want_out, atol=2e-5)
  for got, want, what in zip(grads, want_grads, "qkv"):
    np.testing.assert_allclose(got, want, atol=5e-5, err_msg=f"d{what}")
  want_table = np.zeros(table.shape)
  rel = np.arange(t)[:, None] - np.arange(t)[None] + t - 1
  for hi in range(h):
    np.add.at(want_table[hi], rel, dmod[:, hi].sum(0))
  np.testing.assert_allclose(grads[3], want_table, atol=5e-5)


@pytest.mark.parametrize("case", ["table_sinks_gqa_padding", "empty_rows"])
def test_span_walk_matches_float64_reference(case, monkeypatch):
  # Two query blocks per step (three steps), so that a step's blocks and
  # their spans are told apart.
  monkeypatch.setattr(flash_schedule, "SPAN_ROWS", 8)
  taken = _spans_taken(monkeypatch)
  window = lambda qi, ki: (ki <= qi) & (qi - ki < 6)
  if case == "table_sinks_gqa_padding":
    # 22 queries: the last block is padded.
    check_against_reference(2, 22, 4, 2, window, True, seed=7)
  else:  # one query in four sees nothing
    check_against_reference(1, 24, 2, 1, lambda qi, ki: window(qi, ki) & (
        qi % 4 != 1), False, seed=7)
  assert taken[0].length == 3 and taken[0].group == 2


def _dense(q, k, v, ok):
  """float64 attention of q `[1, T, 1, D]` under bool `ok [T, T]`."""
  q, k, v = (np.asarray(x, np.float64)[0, :, 0] for x in (q, k, v))
  s = np.where(ok, q @ k.T / np.sqrt(q.shape[-1]), -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  return (p / p.sum(-1, keepdims=True) @ v)[None, :, None]


@pytest.mark.cpu_only("spans=None takes the span walk on the CPU backend "
                      "only; the block walk elsewhere skips the mask_mod "
                      "on a listed-full block")
def test_span_walk_computes_only_the_listed_blocks(monkeypatch):
  taken = _spans_taken(monkeypatch)
  rule = masks.and_mods(masks.causal_mod(), masks.window_mod(5))
  bm = block_mask.create(rule, None, None, 40, 40, 4, 4)
  q, k, v = jax.random.normal(jax.random.key(3), (3, 1, 40, 1, 8))
  ok = np.tri(40, dtype=bool) & ~np.tri(40, k=-6, dtype=bool)
  run = lambda state: flash.flash_attention(
      q, k, v, head_loop=False, rules=score_rules.ScoreRules(
          mask_mod=rule, block_mask=block_mask.BlockMask(
              state, 40, 40, 4, 4, 0)))
  # Listed empty, block (3, 2) inside query block 3's span [1, 3] drops
  # out: keys 8-11 leave rows 12-15 (30 blocks computed for 26 listed).
  state = bm.state.copy()
  state[0, 0, 3, 2] = block_mask.EMPTY
  skipped = ok.copy()
  skipped[12:16, 8:12] = False
  np.testing.assert_allclose(run(state), _dense(q, k, v, skipped), atol=1e-5)
  assert taken[-1] is not None and taken[-1].length == 3
  # Listed full, the diagonal block (3, 3) still gets the mask_mod on the
  # span walk (the block walk would skip it there: docs/score_rules.md).
  state = bm.state.copy()
  state[0, 0, 3, 3] = block_mask.FULL
  np.testing.assert_allclose(run(state), _dense(q, k, v, ok), atol=1e-5)
  assert taken[-1] is not None


def test_spans_argument_forces_or_forbids_the_span_walk(monkeypatch):
  taken = _spans_taken(monkeypatch)
  window = masks.and_mods(masks.causal_mod(), masks.window_mod(5))
  causal = masks.causal_mod()
  q = jnp.ones((1, 24, 2, 8))
  run = lambda rule, **kw: flash.flash_attention(
      q, q, q, rules=score_rules.ScoreRules(
          mask_mod=rule, block_mask=block_mask.create(
              rule, None, None, 24, 24, 4, 4)), **kw)
  run(window, spans=False)
  assert not taken  # the block walk, no plan made
  run(window, spans=True)
  assert taken[-1] is not None
  with pytest.raises(ValueError, match=r"`spans`=True, but this block mask "
                     "is not banded"):
    run(causal, spans=True)
  with pytest.raises(ValueError, match=r"`spans`=True.*`head_loop`"):
    run(window, spans=True, head_loop=True)
  with pytest.raises(ValueError, match=r"`spans` must be None, or a bool "
                     "with a block mask, got True without one"):
    flash.flash_attention(q, q, q, spans=True)


def test_span_walk_equals_block_walk_under_every_builtin_rule(monkeypatch):
  # A bias array, ALiBi, a soft cap, segments, sinks, is_causal and a
  # built-in window beside the mask rule: the span walk's values and
  # gradients equal the block walk's (checked against float64 in
  # test_score_mod.py), the built-ins cut to each span.
  taken = _spans_taken(monkeypatch)
  b, t, h = 2, 21, 4
  ks = jax.random.split(jax.random.key(5), 5)
  q = jax.random.normal(ks[0], (b, t, h, 8))
  k, v = (jax.random.normal(kk, (b, t, 2, 8)) for kk in ks[1:3])
  bias = jax.random.normal(ks[3], (1, h, t, t))
  sinks = jax.random.normal(ks[4], (h,))
  seg = jnp.asarray(np.repeat([[0, 1, 2]], 7, axis=1).reshape(1, t)
                    .repeat(b, 0))
  rule = masks.and_mods(masks.window_mod(6), lambda b, h, qi, ki: ki != 3)
  bm = block_mask.create(rule, None, None, t, t, 4, 4)

  def grads(spans):
    def loss(q, k, v, bias, sinks):
      rules = score_rules.ScoreRules(
          soft_cap=1.5, alibi_slopes=jnp.array([0.1, 0.2, 0.3, 0.4]),
          sinks=sinks, local_window=(5, 0), q_segment_ids=seg,
          kv_segment_ids=seg, mask_mod=rule, block_mask=bm)
      out = flash.flash_attention(q, k, v, bias=bias, is_causal=True,
                                  rules=rules, spans=spans)
      return jnp.sum(jnp.sin(out))
    return jax.jit(jax.grad(loss, argnums=tuple(range(5))))(
        q, k, v, bias, sinks)
  want = grads(False)
  assert not taken
  got = grads(True)
  assert taken[-1] is not None
  for g, w, name in zip(got, want, ["q", "k", "v", "bias", "sinks"]):
    np.testing.assert_allclose(g, w, atol=2e-5, err_msg=name)
