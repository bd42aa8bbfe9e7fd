"""Boolean masks: known answers for causal (bottom-right), padding, combine."""

import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import masks

T, F = True, False


def test_causal_square_is_lower_triangular():
  np.testing.assert_array_equal(masks.causal_mask(3),
                                [[T, F, F], [T, T, F], [T, T, T]])


def test_causal_is_bottom_right_aligned_when_keys_run_ahead():
  # Two new queries after two cached keys: query i sits at position 2 + i.
  np.testing.assert_array_equal(masks.causal_mask(2, 4),
                                [[T, T, T, F], [T, T, T, T]])
  # One decoding step sees the whole cache.
  np.testing.assert_array_equal(masks.causal_mask(1, 3), [[T, T, T]])


def test_causal_with_more_queries_than_keys_leaves_early_rows_empty():
  # Queries at positions -2, -1, 0, 1 against keys 0, 1.
  np.testing.assert_array_equal(masks.causal_mask(4, 2),
                                [[F, F], [F, F], [T, F], [T, T]])


def test_causal_accepts_zero_lengths_and_rejects_each_negative_one():
  assert masks.causal_mask(0).shape == (0, 0)
  assert masks.causal_mask(0, 3).shape == (0, 3)
  np.testing.assert_array_equal(masks.causal_mask(2, 0), np.zeros((2, 0)))
  with pytest.raises(ValueError, match="q_len=-1"):
    masks.causal_mask(-1)
  with pytest.raises(ValueError, match="q_len=-1, kv_len=2"):
    masks.causal_mask(-1, 2)
  with pytest.raises(ValueError, match="q_len=2, kv_len=-1"):
    masks.causal_mask(2, -1)


def test_padding_mask_marks_keys_beyond_each_length():
  m = masks.padding_mask(jnp.array([1, 3]), 4)
  assert m.shape == (2, 1, 1, 4) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(m[:, 0, 0], [[T, F, F, F], [T, T, T, F]])


@pytest.mark.parametrize("lengths,match", [
    (jnp.array([[1, 2]]), "shape \\[B\\]"),
    (jnp.array([1.0, 2.0]), "must be integer"),
])
def test_padding_mask_rejects_bad_lengths(lengths, match):
  with pytest.raises((ValueError, TypeError), match=match):
    masks.padding_mask(lengths, 3)


def test_combine_masks_is_logical_and_skipping_none():
  assert masks.combine_masks() is None
  assert masks.combine_masks(None, None) is None
  a = jnp.array([[T, T], [F, T]])
  b = jnp.array([T, F])  # broadcasts over rows
  np.testing.assert_array_equal(masks.combine_masks(a, None, b),
                                [[T, F], [F, F]])


def test_combine_masks_rejects_float_masks():
  with pytest.raises(TypeError, match="mask 1 must be boolean"):
    masks.combine_masks(jnp.ones((2,), bool), jnp.zeros((2,)))


def test_combine_padding_with_causal_broadcasts_to_four_dims():
  # The everyday combination: [B, 1, 1, Tk] padding and [Tq, Tk] causal.
  m = masks.combine_masks(masks.padding_mask(jnp.array([2, 3]), 3),
                          masks.causal_mask(3))
  assert m.shape == (2, 1, 3, 3)
  np.testing.assert_array_equal(m[0, 0], [[T, F, F], [T, T, F], [T, T, F]])
  np.testing.assert_array_equal(m[1, 0], masks.causal_mask(3))
