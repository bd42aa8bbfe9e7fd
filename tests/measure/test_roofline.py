"""`roofline`: the yardsticks compute the products they count, and a
share is taken per round."""

import jax
import numpy as np
import pytest

from mha_jax.measure import roofline


def test_the_share_is_per_round():
  """Each round's rate over the same round's yardstick rate: a round
  where the machine is slower for both gives the same fraction."""
  # work 10, yardstick 40 -> share = (10 / t) / (40 / y)
  got = roofline.share(10, [2.0, 4.0, 1.0], 40, [1.0, 2.0, 1.0])
  assert got == {"median": 0.125, "min": 0.125, "max": 0.25}


def test_the_share_needs_one_yardstick_time_per_round():
  with pytest.raises(ValueError, match="one yardstick time per round, got "
                     "3 times and 2"):
    roofline.share(10, [2.0, 4.0, 1.0], 40, [1.0, 2.0])


def test_the_matmul_yardstick_is_a_square_product_of_2_n_cubed_flops():
  call, flops = roofline.matmul_yardstick(8)
  assert flops == 2 * 8 ** 3
  a = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (8, 8)),
                 np.float64)
  np.testing.assert_allclose(np.asarray(call()), a @ a, rtol=1e-5,
                             atol=1e-5)


def test_the_stream_yardstick_reads_the_bytes_it_counts():
  call, nbytes = roofline.stream_yardstick(rows=16, cols=24)
  assert nbytes == 16 * 24 * 4
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x = np.asarray(jax.random.normal(kx, (1, 16)), np.float64)
  w = np.asarray(jax.random.normal(kw, (16, 24)), np.float64)
  np.testing.assert_allclose(np.asarray(call()), x @ w, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("make, args, name", [
    (roofline.matmul_yardstick, (0,), "n must be >= 1, got 0"),
    (roofline.stream_yardstick, (0, 4), "rows and cols must be >= 1, got 0 "
     "and 4")])
def test_bad_sizes_are_named(make, args, name):
  with pytest.raises(ValueError, match=name):
    make(*args)
