"""Block masks: exact block states against NumPy, the known block counts of
causal, window and document masks, and a blockwise kernel that visits
exactly the blocks the mask lists (shown by tampering with the list)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import masks
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash


def _numpy_states(mask_np, b_n, h_n, tq, tk, bq, bk):
  """The block states from the whole [Tq, Tk] mask, by definition."""
  nq, nk = -(-tq // bq), -(-tk // bk)
  out = np.zeros((b_n, h_n, nq, nk), np.int8)
  qi = (tk - tq + np.arange(tq))[:, None]
  ki = np.arange(tk)[None, :]
  for b in range(b_n):
    for h in range(h_n):
      ok = np.broadcast_to(mask_np(b, h, qi, ki), (tq, tk))
      for i in range(nq):
        for j in range(nk):
          blk = ok[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
          out[b, h, i, j] = (block_mask.FULL if blk.all() else
                             block_mask.PARTIAL if blk.any() else
                             block_mask.EMPTY)
  return out


def test_states_are_exact_for_a_rule_of_batch_and_head(monkeypatch):
  # Tiny chunks, so that the chunked evaluation and its padded last
  # chunk (13 rows of blocks of 3, lengths not multiples) are exercised.
  monkeypatch.setattr(block_mask, "CHUNK", 40)
  ids = np.array([[0] * 5 + [1] * 6 + [2] * 4, [0] * 9 + [1] * 6])
  jids = jnp.asarray(ids)
  rule = lambda b, h, qi, ki: (jids[b, qi] == jids[b, ki]) & (
      qi - ki <= 2 + 3 * h)
  rule_np = lambda b, h, qi, ki: (ids[b][qi] == ids[b][ki]) & (
      qi - ki <= 2 + 3 * h)
  got = block_mask.create(rule, 2, 2, 13, 15, 3, 4)
  np.testing.assert_array_equal(
      got.state, _numpy_states(rule_np, 2, 2, 13, 15, 3, 4))
  assert (got.q_block, got.kv_block, got.q_offset) == (3, 4, 2)


def test_known_block_counts_of_causal_window_and_documents():
  n, blk = 64, 8  # 8 x 8 blocks
  causal = block_mask.create(masks.causal_mod(), None, None, n, n, blk, blk)
  # The 8 diagonal blocks are partial, the 28 below them full.
  assert causal.counts() == {"empty": 28, "partial": 8, "full": 28}
  window = block_mask.create(
      masks.and_mods(masks.causal_mod(), masks.window_mod(16)), None, None,
      n, n, blk, blk)
  # Query block i >= 2 sees key blocks i - 2 (partial), i - 1 (full) and
  # i (partial); block 1 sees 0 (full) and 1; block 0 only itself.
  assert window.counts() == {"empty": 64 - 21, "partial": 14, "full": 7}
  ids = np.repeat(np.arange(4), 16)[None]  # 4 documents of 2 blocks each
  docs = block_mask.create(
      masks.and_mods(masks.causal_mod(), masks.documents_mod(ids)), 1, None,
      n, n, blk, blk)
  # Per document: two diagonal blocks (partial) and the one below (full).
  assert docs.counts() == {"empty": 64 - 12, "partial": 8, "full": 4}
  assert docs.computed() == 12


def _dense(q, k, v, ok):
  """float64 NumPy attention with the boolean mask `ok [H?, T, T]` (one
  batch row, one kv head)."""
  q, k, v = (np.asarray(x, np.float64)[0] for x in (q, k, v))
  s = np.einsum("qhd,kd->hqk", q, k[:, 0]) / math.sqrt(q.shape[-1])
  s = np.where(ok, s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("hqk,kd->qhd", p, v[:, 0])[None]


def _qkv(seed, b=1, t=24, h=2, kh=1):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(ks[0], (b, t, h, 8)),
          jax.random.normal(ks[1], (b, t, kh, 8)),
          jax.random.normal(ks[2], (b, t, kh, 8)))


# None: the CPU default under a shared block mask, the batched kernel.
@pytest.mark.parametrize("head_loop", [None, True])
def test_kernel_visits_exactly_the_listed_blocks(head_loop):
  q, k, v = _qkv(0, b=2)  # two rows: the loop and the batch differ
  rule = masks.causal_mod()
  bm = block_mask.create(rule, None, None, 24, 24, 8, 8)
  run = lambda bm_, rule_=rule: flash.flash_attention(
      q, k, v, rules=score_rules.ScoreRules(mask_mod=rule_, block_mask=bm_),
      head_loop=head_loop)
  dense = lambda ok: np.concatenate([
      _dense(q[i:i + 1], k[i:i + 1], v[i:i + 1], ok) for i in range(2)])
  causal = np.tril(np.ones((24, 24), bool))
  np.testing.assert_allclose(run(bm), dense(causal), atol=1e-5)
  # Listed empty, block (2, 0) is skipped: its keys drop out of rows 16-23.
  state = bm.state.copy()
  state[0, 0, 2, 0] = block_mask.EMPTY
  skipped = causal.copy()
  skipped[16:24, 0:8] = False
  np.testing.assert_allclose(run(block_mask.BlockMask(
      state, 24, 24, 8, 8, 0)), dense(skipped), atol=1e-5)
  # Listed full, diagonal block (1, 1) gets no mask_mod work: its upper
  # triangle is attended.
  state = bm.state.copy()
  state[0, 0, 1, 1] = block_mask.FULL
  opened = causal.copy()
  opened[8:16, 8:16] = True
  np.testing.assert_allclose(run(block_mask.BlockMask(
      state, 24, 24, 8, 8, 0)), dense(opened), atol=1e-5)


def test_parts_record_which_sub_blocks_have_an_allowed_pair():
  # Documents under the causal rule, lengths not multiples of the blocks
  # of 4 x 6 (parts of 2 x 3): the parts by definition from the whole mask.
  ids = np.array([0] * 5 + [1] * 6 + [2] * 4)
  jids = jnp.asarray(ids)
  rule = lambda b, h, qi, ki: (jids[qi] == jids[ki]) & (ki <= qi)
  bm = block_mask.create(rule, None, None, 15, 15, 4, 6)
  ok = np.zeros((16, 18), bool)  # padded to whole blocks: never allowed
  ok[:15, :15] = (ids[:, None] == ids[None]) & np.tri(15, dtype=bool)
  want = ok.reshape(4, 2, 2, 3, 2, 3).any(axis=(2, 5)).transpose(0, 2, 1, 3)
  np.testing.assert_array_equal(bm.parts[0, 0], want)


def test_kernel_with_sub_blocks_hidden_by_the_builtin_rules():
  # Documents split mid-block under a window: blocks whose allowed
  # sub-blocks are some, none or all of those the built-in rules leave;
  # with the causal rule in the mask rule, or built in (is_causal, which
  # hides sub-blocks itself and cuts the lists with them).
  q, k, v = _qkv(2)
  ids = np.array([0] * 7 + [1] * 10 + [2] * 7)
  docs = masks.documents_mod(ids[None])
  window = masks.and_mods(docs, masks.window_mod(5))
  ok = ((ids[:, None] == ids[None]) & np.tri(24, dtype=bool)
        & ~np.tri(24, k=-6, dtype=bool))
  for rule, is_causal in ((masks.and_mods(masks.causal_mod(), window),
                           False), (window, True)):
    bm = block_mask.create(rule, None, None, 24, 24, 8, 8)
    got = flash.flash_attention(q, k, v, is_causal=is_causal,
                                rules=score_rules.ScoreRules(
                                    mask_mod=rule, block_mask=bm))
    np.testing.assert_allclose(got, _dense(q, k, v, ok), atol=1e-5)


@pytest.mark.cpu_only("head_loop=None runs one (batch, kv head) at a time "
                      "on the CPU backend only (runs_head_loop); "
                      "elsewhere always batched")
def test_cpu_kernel_runs_batched_only_under_a_mask_shared_by_rows_and_heads(
    monkeypatch):
  causal = masks.causal_mod()
  by_head = lambda b, h, qi, ki: (ki <= qi) | (h == 1)
  by_row = lambda b, h, qi, ki: (ki <= qi) | (b == 1)
  shared = block_mask.create(causal, None, None, 16, 16, 8, 8)
  masks_of = {"shared": (causal, shared),
              "by_head": (by_head, block_mask.create(by_head, None, 2, 16,
                                                     16, 8, 8)),
              "by_row": (by_row, block_mask.create(by_row, 2, None, 16, 16,
                                                   8, 8))}
  assert flash.runs_head_loop("cpu", None, 4)
  assert not flash.runs_head_loop("cpu", shared, 4)
  assert flash.runs_head_loop("cpu", masks_of["by_head"][1], 4)
  assert flash.runs_head_loop("cpu", masks_of["by_row"][1], 4)
  assert not flash.runs_head_loop("gpu", masks_of["by_head"][1], 4)
  assert not flash.runs_head_loop("tpu", None, 4)
  # The batched score block, 4 B H Bq Bk bytes, against its bound: B H = 8
  # on blocks of 512 is 8 MiB, within; 9 is over.
  big = block_mask.create(causal, None, None, 1024, 1024, 512, 512)
  assert flash.BATCHED_BLOCK_BYTES == 8 * 2 ** 20
  assert not flash.runs_head_loop("cpu", big, 8)
  assert flash.runs_head_loop("cpu", big, 9)
  # And the default follows it: the per-(batch, kv head) map is entered
  # only where the rule says so.
  entered = []
  loop = flash._flash_by_head
  monkeypatch.setattr(flash, "_flash_by_head",
                      lambda *a: entered.append(1) or loop(*a))
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.float32)
             for _ in range(3))
  for name, (rule, bm) in masks_of.items():
    entered.clear()
    flash.flash_attention(q, k, v, rules=score_rules.ScoreRules(
        mask_mod=rule, block_mask=bm))
    assert bool(entered) == (name != "shared"), name


def test_heads_of_one_group_share_the_merged_lists():
  # H = 2 query heads on one kv head: head 0 causal, head 1 sees all. The
  # group's block (0, 1) is empty for head 0 only, so it is visited
  # (partial), and the results equal the dense reference per head.
  rule = lambda b, h, qi, ki: (ki <= qi) | (h == 1)
  bm = block_mask.create(rule, None, 2, 16, 16, 8, 8)
  num, idx, full = bm.kernel_lists(1, per_head=True)
  np.testing.assert_array_equal(num[0, 0], [2, 2])
  np.testing.assert_array_equal(full[0, 0], [[False, False],
                                             [True, False]])
  q, k, v = _qkv(1, t=16)
  got = flash.flash_attention(q, k, v, rules=score_rules.ScoreRules(
      mask_mod=rule, block_mask=bm))
  ok = np.stack([np.tril(np.ones((16, 16), bool)), np.ones((16, 16), bool)])
  np.testing.assert_allclose(got, _dense(q, k, v, ok), atol=1e-5)


def test_block_mask_that_does_not_fit_the_call_is_refused():
  bm = block_mask.create(masks.causal_mod(), None, None, 16, 16, 8, 8)
  q = jnp.zeros((1, 24, 2, 8))
  rules = score_rules.ScoreRules(mask_mod=masks.causal_mod(), block_mask=bm)
  with pytest.raises(ValueError, match=r"attend: `block_mask` does not fit:"
                     r" it was built for Tq=16, Tk=16, the call has Tq=24"):
    attention.attend(q, q, q, implementation="flash", rules=rules)
  with pytest.raises(ValueError, match="`block_mask`.*no `mask_mod`"):
    attention.attend(q[:, :16], q[:, :16], q[:, :16], implementation="flash",
                     rules=score_rules.ScoreRules(block_mask=bm))
  with pytest.raises(ValueError, match=r"`block_k`=4 differs from the block"
                     " mask's 8"):
    flash.flash_attention(q[:, :16], q[:, :16], q[:, :16], rules=rules,
                          block_k=4)
  with pytest.raises(ValueError, match=r"block_mask.create: `q_len` must be"
                     " a positive int, got 0"):
    block_mask.create(masks.causal_mod(), None, None, 0, 16)
  with pytest.raises(TypeError, match=r"block_mask.create: `mask_mod` must "
                     "return a bool"):
    block_mask.create(lambda b, h, qi, ki: qi - ki, None, None, 8, 8)


def test_visited_blocks_known_answers():
  # The blocks the built-in rules leave, which cut a block mask's lists
  # (values alone cannot show a wrong cut: the rules mask those blocks
  # anyway). Blocks of 4; query block i holds rows 4i..4i+3.
  def visited(tq, tk, causal, window):
    cfg = flash.block_config(jnp.float32, 8, score_rules.ScoreRules(
        local_window=window), causal, tq, tk, 4, 4)
    return flash.visited_blocks(cfg, -(-tq // 4), -(-tk // 4)).astype(int)
  # Causal: key blocks up to the diagonal.
  np.testing.assert_array_equal(visited(16, 16, True, None),
                                np.tri(4, dtype=int))
  # Causal, 5 keys back: rows 4i..4i+3 see keys 4i-5..4i+3.
  np.testing.assert_array_equal(visited(16, 16, True, (5, 0)),
                                [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0],
                                 [0, 1, 1, 1]])
  # No causal rule, 2 keys ahead too: keys 4i-5..4i+5.
  np.testing.assert_array_equal(visited(16, 16, False, (5, 2)),
                                [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1],
                                 [0, 1, 1, 1]])
  # 8 queries at the end of 16 keys (positions 8..15), causal.
  np.testing.assert_array_equal(visited(8, 16, True, None),
                                [[1, 1, 1, 0], [1, 1, 1, 1]])
  # Neither rule: everything.
  assert visited(8, 12, False, None).all()
