"""The corruptions that target one input of an induction head each.

Properties of `corruption.corrupt` on random task batches: which tokens
each kind replaces (and that every replacement is another symbol), which
predictions it scores, and that "no_match" leaves no earlier occurrence
of a second-copy token. Their effect on a circuit whose paths are known
is tested on the wired model (test_patching.py).
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import pytest

from mha_jax.interp import corruption
from mha_jax.training import tasks

_CFG = ml_collections.ConfigDict(dict(batch_size=16, seq_len=20,
                                      vocab_size=12, min_segment=3,
                                      max_segment=6))


@pytest.fixture(scope="module")
def pairs():
  """Every kind's pairs from one key: the same clean batch each time."""
  draw = jax.jit(lambda k: {kind: corruption.induction_pairs(k, _CFG,
                                                             kind=kind)
                            for kind in corruption.KINDS})
  return jax.tree.map(np.asarray, draw(jax.random.key(11)))


def _offsets(p, b, start):
  return np.arange(_CFG.seq_len) - p[start][b]


@pytest.mark.parametrize("kind,start,parity", [
    ("second_copy", "second", None), ("key", "first", 0),
    ("value", "first", 1), ("first_copy", "first", None)])
def test_a_kind_replaces_exactly_its_tokens(pairs, kind, start, parity):
  p, clean = pairs[kind], pairs["first_copy"]
  np.testing.assert_array_equal(p["inputs"], clean["inputs"])
  for b in range(_CFG.batch_size):
    off = _offsets(p, b, start)
    hit = (off >= 0) & (off < p["segment"][b])
    if parity is not None:
      hit &= off % 2 == parity
    x, y = p["inputs"][b], p["corrupted"][b]
    assert np.all(x[hit] != y[hit]) and np.all(x[~hit] == y[~hit]), b
    assert np.all((y >= tasks.NUM_SPECIAL) & (y < _CFG.vocab_size))


@pytest.mark.parametrize("kind", ["key", "value"])
def test_key_and_value_score_the_even_predictions_only(pairs, kind):
  p, clean = pairs[kind], pairs["first_copy"]
  for b in range(_CFG.batch_size):
    even = _offsets(p, b, "second") % 2 == 0
    np.testing.assert_array_equal(p["loss_mask"][b],
                                  clean["loss_mask"][b] * even)
  # Every batch keeps some scored prediction (segments are >= 2 long).
  assert np.all(p["loss_mask"].sum(1) >= 1)


def test_no_match_leaves_no_earlier_occurrence(pairs):
  p = pairs["no_match"]
  np.testing.assert_array_equal(p["loss_mask"], pairs["first_copy"]
                                ["loss_mask"])
  changed = 0
  for b in range(_CFG.batch_size):
    s2, seg = p["second"][b], p["segment"][b]
    x, y = p["inputs"][b], p["corrupted"][b]
    wanted = set(x[s2:s2 + seg].tolist())
    before = np.arange(_CFG.seq_len) < s2
    assert not wanted & set(y[before].tolist()), b
    # Only tokens of that set, before the second copy, are redrawn.
    keep = ~(before & np.isin(x, list(wanted)))
    np.testing.assert_array_equal(x[keep], y[keep])
    assert np.all((y >= tasks.NUM_SPECIAL) & (y < _CFG.vocab_size))
    changed += int(np.sum(~keep))
  assert changed >= _CFG.batch_size  # the first copy at least, per example


def test_no_match_draws_every_allowed_symbol():
  """The redrawn tokens are spread over all the symbols outside the
  second copy, not one fixed replacement."""
  cfg = ml_collections.ConfigDict(_CFG.to_dict() | {"batch_size": 256})
  p = jax.tree.map(np.asarray, jax.jit(lambda k: corruption.induction_pairs(
      k, cfg, kind="no_match"))(jax.random.key(2)))
  drawn = p["corrupted"][p["corrupted"] != p["inputs"]]
  assert set(drawn.tolist()) == set(range(tasks.NUM_SPECIAL,
                                          cfg.vocab_size))


def test_an_unknown_kind_is_refused():
  with pytest.raises(ValueError, match="`kind` must be one of"):
    corruption.induction_pairs(jax.random.key(0), _CFG, kind="keys")
