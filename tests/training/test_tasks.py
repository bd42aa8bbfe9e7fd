"""Synthetic tasks: each target checked against its definition in NumPy."""

import functools

import jax
import ml_collections
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from configs import default
from mha_jax.training import tasks


def _cfg(**overrides):
  cfg = default.get_config().task
  cfg.update(overrides)
  return ml_collections.FrozenConfigDict(cfg)


@functools.lru_cache(maxsize=None)
def _maker(cfg):
  """One compiled batch function per task config (tests reuse them)."""
  return jax.jit(functools.partial(tasks.get_task(cfg.name).make_batch,
                                   cfg=cfg))


def _batch(name, seed=0, **overrides):
  cfg = _cfg(name=name, **overrides)
  batch = _maker(cfg)(jax.random.key(seed))
  return {k: np.asarray(v) for k, v in batch.items()}, cfg


# text_tokens trains a tokenizer on its corpus first: its batches are
# checked on a small corpus in tests/training/test_text_tokens.py.
@pytest.mark.parametrize("name", sorted(set(tasks.TASKS) - {"text_tokens"}))
def test_deterministic_in_key_and_shapes(name):
  a, cfg = _batch(name, seed=1)
  b, _ = _batch(name, seed=1)
  c, _ = _batch(name, seed=2)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a["inputs"], c["inputs"])
  bt = (cfg.batch_size, cfg.seq_len)
  assert a["inputs"].shape[:2] == bt
  assert a["targets"].shape[:2] == bt
  assert a["loss_mask"].shape == bt
  assert a["loss_mask"].sum() > 0


def test_copy_targets_repeat_first_half():
  b, cfg = _batch("copy", seq_len=10)
  n = 5
  np.testing.assert_array_equal(b["inputs"][:, n], tasks.SEP)
  # Positions n..2n-1 (mask) predict x_1..x_n.
  np.testing.assert_array_equal(b["targets"][:, n:2 * n], b["inputs"][:, :n])
  assert (b["loss_mask"][:, n:2 * n] == 1).all()
  assert (b["loss_mask"][:, :n] == 0).all()


def test_reverse_targets_are_reversed_source():
  b, cfg = _batch("reverse", seq_len=9, min_len=2, batch_size=64)
  lengths = (b["inputs"] != tasks.PAD).sum(1)
  assert len(set(lengths.tolist())) > 1  # ragged
  for src, tgt, dec, m, n in zip(b["inputs"], b["targets"],
                                 b["decoder_inputs"], b["loss_mask"],
                                 lengths):
    np.testing.assert_array_equal(tgt[:n], src[:n][::-1])
    assert (tgt[n:] == tasks.PAD).all() and (src[n:] == tasks.PAD).all()
    np.testing.assert_array_equal(dec, np.r_[tasks.BOS, tgt[:-1]])
    np.testing.assert_array_equal(m, np.arange(len(m)) < n)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_induction_masked_targets_follow_earlier_occurrence(seed):
  lo, hi = 2, 9
  b, cfg = _batch("induction", seed=seed, seq_len=24, min_segment=lo,
                  max_segment=hi, batch_size=16)
  seq = np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
  for s, m in zip(seq, b["loss_mask"]):
    idx = np.flatnonzero(m)  # target t predicts seq[t + 1]
    assert lo - 1 <= len(idx) <= hi - 1
    assert (np.diff(idx) == 1).all()
    s2 = idx[0]  # seq[s2] starts the second copy, seq[s2 + 1] first target
    seg_len = len(idx) + 1
    # The second copy equals some earlier window, which does not overlap it.
    windows = [s1 for s1 in range(0, s2 - seg_len + 1)
               if np.array_equal(s[s1:s1 + seg_len], s[s2:s2 + seg_len])]
    assert windows, "the repeated segment has no earlier occurrence"


def test_induction_positions_vary_per_example():
  b, _ = _batch("induction", batch_size=64)
  first = b["loss_mask"].argmax(1)
  lengths = b["loss_mask"].sum(1)
  assert len(set(first.tolist())) > 5  # no fixed-position shortcut
  assert len(set(lengths.tolist())) > 2


def test_two_offset_continuous_target():
  b, cfg = _batch("two_offset_continuous", seq_len=7, feature_dim=3)
  u, y = b["inputs"], b["targets"]
  assert y.shape == (cfg.batch_size, 7, 6)
  for t in range(3, 7):
    np.testing.assert_array_equal(y[:, t], np.c_[u[:, t - 1], u[:, t - 3]])
  np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 0, 1, 1, 1, 1])


def test_two_offset_token_target():
  b, cfg = _batch("two_offset_token", seq_len=9, vocab_size=5)
  x, y = b["inputs"], b["targets"]
  assert x.min() >= 0 and x.max() < 5
  for t in range(3, 9):
    np.testing.assert_array_equal(y[:, t] // 5, x[:, t - 1])
    np.testing.assert_array_equal(y[:, t] % 5, x[:, t - 3])
  io = tasks.get_task("two_offset_token").io(cfg)
  assert io["output_dim"] == 25


def test_unknown_task_and_bad_fields_name_the_field():
  with pytest.raises(ValueError, match="config.task.name"):
    tasks.get_task("sort")
  with pytest.raises(ValueError, match="config.task.max_segment"):
    tasks.get_task("induction").check(_cfg(seq_len=9, max_segment=6))
  with pytest.raises(ValueError, match="config.task.vocab_size"):
    tasks.get_task("copy").check(_cfg(vocab_size=3))
