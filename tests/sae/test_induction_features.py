"""Where the induction test looks on a repeated input: known answers."""

import numpy as np

from experiments.sae import induction


def test_layout_of_a_repeated_input():
  # [x1 x2 x3 x1 x2 x3]: the second copy is positions 3..5 and an
  # induction head there attends to the token after the earlier copy.
  first, second, source = induction.layout(6, 3)
  assert first.tolist() == [1, 1, 1, 0, 0, 0]
  assert second.tolist() == [0, 0, 0, 1, 1, 1]
  assert source.tolist() == [-1, -1, -1, 1, 2, 3]
  # With a BOS in front everything moves one right.
  first, second, source = induction.layout(7, 3)
  assert np.flatnonzero(first).tolist() == [1, 2, 3]
  assert source.tolist() == [-1, -1, -1, -1, 2, 3, 4]


def test_repeated_loss_batches_score_only_the_predictable_copy():
  # [BOS a b c a b c], repeat_len 3: targets are tokens 1..6; the second
  # copy starts at token 4, whose "a" no rule predicts; "b" and "c"
  # (tokens 5 and 6, targets 4 and 5) are what induction predicts.
  from experiments.sae import per_sae as run
  e = type("E", (), {"bos": 0, "repeat_len": 3})()
  tokens = np.array([[0, 5, 6, 7, 5, 6, 7]] * 3, np.int32)
  batches = run.repeated_batches(tokens, e, size=2)
  assert [len(b["inputs"]) for b in batches] == [2, 1]
  b = batches[0]
  assert b["inputs"][0].tolist() == [0, 5, 6, 7, 5, 6]
  assert b["targets"][0].tolist() == [5, 6, 7, 5, 6, 7]
  assert b["loss_mask"][0].tolist() == [0, 0, 0, 0, 1, 1]
  e.bos = -1  # no BOS: [a b c a b c], targets b c a b c, the last two
  batches = run.repeated_batches(tokens[:, 1:], e)
  assert batches[0]["loss_mask"][0].tolist() == [0, 0, 0, 1, 1]
