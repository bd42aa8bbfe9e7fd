"""The experiments' own pieces: the low-rank fit, alignment targets, helpers.

Whole experiments take minutes, so they are run by `make experiments`, not
here; these tests check the parts whose mistakes would silently skew a
report.
"""

import jax
import numpy as np

from configs import two_offsets as two_offsets_config
from experiments import common
from experiments import cross_attention
from experiments import head_dim
from experiments import induction


def test_low_rank_fit_exact_at_full_width_not_at_width_one():
  n = 5
  target = head_dim.random_targets(jax.random.PRNGKey(0), 1, n, 2.0)[0]
  x = jax.random.normal(jax.random.PRNGKey(1), (n, n))
  fit = jax.jit(lambda d_k: head_dim.fit_attention(
      target, x, d_k, steps=3000, lr=0.05, key=jax.random.PRNGKey(2)),
                static_argnums=0)
  kl_full, err_full = fit(n)
  kl_one, _ = fit(1)
  assert kl_full < 1e-4 and err_full < 1e-2
  assert kl_one > 100 * kl_full
  # A rank-1 fit of a full-support target keeps a visible error.
  assert kl_one > 1e-2


def test_aligned_source_of_a_reversal():
  src = np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])  # 0 = PAD
  target, valid = cross_attention.aligned_source(src)
  np.testing.assert_array_equal(target[0, :3], [2, 1, 0])
  np.testing.assert_array_equal(valid[0], [1, 1, 1, 0, 0])
  np.testing.assert_array_equal(target[1], [4, 3, 2, 1, 0])
  # The target positions really hold the reversed sequence.
  tgt = np.take_along_axis(src, target, axis=1)
  np.testing.assert_array_equal(tgt[0, :3], [7, 6, 5])


def test_phase_change_finds_the_steepest_drop():
  pc = induction.phase_change([0, 50, 100, 150], [3.0, 2.9, 1.0, 0.9])
  assert (pc["from_step"], pc["to_step"]) == (50, 100)
  np.testing.assert_allclose(pc["drop"], 1.9)


def test_variant_overrides_and_validates():
  base = two_offsets_config.get_config()
  c = common.variant(base, **{"model.num_heads": 8, "train.seed": 3})
  assert (c.model.num_heads, c.train.seed) == (8, 3)
  assert base.model.num_heads != 8 or base.train.seed != 3  # copy, not alias
  try:
    common.variant(base, **{"model.num_heads": 3})  # 64 % 3 != 0
  except ValueError as e:
    assert "num_heads" in str(e)
  else:
    raise AssertionError("variant accepted an invalid config")


def test_md_table_and_mean_std():
  table = common.md_table(["a", "b"], [[1, 2]])
  assert table == "| a | b |\n|---|---|\n| 1 | 2 |"
  m, s = common.mean_std([1.0, 3.0])
  assert (m, s) == (2.0, 1.0)
  assert common.fmt(m, s, digits=1) == "2.0 ± 1.0"
