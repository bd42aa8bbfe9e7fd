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
