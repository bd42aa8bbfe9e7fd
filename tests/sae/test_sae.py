"""The SAE: planted-dictionary recovery, the loss against a float64 NumPy
reference, the decoder constraint, the buffer's shuffle, resume."""

import json

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.sae import buffer
from mha_jax.sae import sae
from mha_jax.sae import train
from tests import sae_fit


@pytest.mark.parametrize("kind,l1,steps", [("relu", 1.0, 500),
                                           ("topk", 0.0, 300)])
def test_planted_dictionary_is_recovered(kind, l1, steps):
  # 24 atoms in 16 dimensions (overcomplete), 3 active per example: each
  # true atom should have a learned decoder row at cosine > 0.95.
  atoms, x = sae_fit.planted(0, 4096, 16, 24, 3)
  cfg = sae_fit.cfg(kind=kind, d_sae=48, k=3, aux_k=16, l1=l1,
                    learning_rate=1e-2, batch_size=256, num_steps=steps,
                    dead_steps=50, seed=0)
  w_dec = np.asarray(sae_fit.fit(cfg, x)["w_dec"])
  np.testing.assert_allclose(np.linalg.norm(w_dec, axis=1), 1, rtol=1e-5)
  best = np.abs(atoms @ w_dec.T).max(1)
  assert np.mean(best > 0.95) >= 0.9, np.sort(best)


def test_loss_matches_float64_numpy():
  rng = np.random.default_rng(1)
  p = {"w_enc": rng.normal(size=(6, 10)), "b_enc": rng.normal(size=10),
       "w_dec": rng.normal(size=(10, 6)), "b_dec": rng.normal(size=6)}
  x = rng.normal(size=(5, 6))
  pre = (x - p["b_dec"]) @ p["w_enc"] + p["b_enc"]
  f = np.maximum(pre, 0)
  norms = np.linalg.norm(p["w_dec"], axis=1)
  mse = np.mean(np.sum((x - f @ p["w_dec"] - p["b_dec"]) ** 2, -1))
  want = mse + 0.3 * np.mean(np.sum(f * norms, -1))
  p32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p)
  x32 = jnp.asarray(x, jnp.float32)
  got, parts = jax.jit(lambda p, x: sae.loss(p, x, kind="relu", l1=0.3))(
      p32, x32)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  np.testing.assert_allclose(float(parts["l0"]), np.mean(np.sum(f > 0, -1)),
                             rtol=1e-6)
  # TopK keeps each row's 3 largest positive pre-activations.
  keep = np.where(pre >= np.sort(pre, -1)[:, -3:-2], np.maximum(pre, 0), 0)
  np.testing.assert_allclose(
      jax.jit(lambda p, x: sae.encode(p, x, kind="topk", k=3))(p32, x32), keep,
      rtol=1e-5, atol=1e-5)


def test_decoder_gradient_is_orthogonal_to_rows():
  p = sae.init(jax.random.PRNGKey(0), 8, 12)
  g = sae.project_decoder_grad(jax.tree.map(jnp.ones_like, p), p)
  np.testing.assert_allclose(jnp.sum(g["w_dec"] * p["w_dec"], 1), 0,
                             atol=1e-6)


def test_batches_cover_the_buffer_once_per_pass():
  acts = np.arange(40, dtype=np.float32)[:, None]
  first = np.concatenate([buffer.batch_at(acts, i, batch_size=8, seed=3)
                          for i in range(5)])
  assert sorted(first[:, 0]) == list(range(40))
  second = buffer.batch_at(acts, 5, batch_size=8, seed=3)
  assert not np.array_equal(second, first[:8])  # a new shuffle each pass


def test_resume_equals_uninterrupted(tmp_path):
  # 12 steps with resampling at steps 4 and 8, interrupted at 6; with
  # dead_steps 0 every feature counts as dead, so each resampling redraws
  # them all (random draws, Adam resets) and any state not restored shows.
  cfg = sae_fit.cfg(dead_steps=0)
  assert train.resample_steps(cfg) == {4, 8}
  acts = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
  whole = train.train(cfg, acts, tmp_path / "a")
  train.train(cfg, acts, tmp_path / "b", stop_at=6)
  part = train.train_seconds(tmp_path / "b")
  resumed = train.train(cfg, acts, tmp_path / "b")
  # The pace of a resumed run counts both calls' training time.
  assert 0 < part < train.train_seconds(tmp_path / "b")
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(a, b)
  rows = lambda d: [json.loads(r) for r in
                    (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
  assert rows("a") == rows("b") and [r["step"] for r in rows("a")] == [
      4, 8, 12]


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="sae kind: expected one of"):
    sae.check_kind("gated")
  with pytest.raises(ValueError, match="`k` must be a positive int"):
    sae.check_kind("topk", 0)
  with pytest.raises(ValueError, match="`batch_size`=9 is larger"):
    buffer.batch_at(np.zeros((8, 2)), 0, batch_size=9, seed=0)
  with pytest.raises(ValueError, match="flatten_site: expected"):
    buffer.flatten_site(jnp.zeros((2, 3)))
  with pytest.raises(ValueError, match="`acts` must be"):
    train.train(sae_fit.cfg(), np.zeros(5, np.float32), "unused")


def test_topk_breaks_ties_at_the_kth_value_by_index():
  """Equal values at the k-th place: the lowest indices stay, as
  `lax.top_k` orders them (worked by hand)."""
  pre = jnp.array([[1.0, 2.0, 1.0, 1.0, 0.5], [1.0, 1.0, 1.0, 3.0, 3.0]])
  np.testing.assert_array_equal(sae.keep_largest(pre, 3),
                                [[1.0, 2.0, 1.0, 0.0, 0.0],
                                 [1.0, 0.0, 0.0, 3.0, 3.0]])


def test_a_nan_pre_activation_reaches_the_output():
  """TopK does not hide a NaN by masking it out: the loss sees it."""
  pre = jnp.array([[1.0, jnp.nan, 3.0, 0.5]])
  out = np.asarray(sae.activate(pre, kind="topk", k=2))
  assert np.isnan(out).any()


def _top_k_by_sorting(f, k):
  """NumPy: each row's k largest kept, ties by index (a stable sort of
  the negated values), the rest zero."""
  out = np.zeros_like(f)
  for r, row in enumerate(f):
    keep = np.argsort(-row, kind="stable")[:k]
    out[r, keep] = row[keep]
  return out


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    values=hnp.arrays(np.float32, (3, 12), elements=st.sampled_from(
        [0.0, 0.25, 0.5, 1.0, 2.0, 7.0])),
    k=st.integers(1, 12))
def test_keep_largest_keeps_what_top_k_keeps_with_its_gradient(values, k):
  """Against a stable sort in NumPy on rows full of ties and zeros; the
  gradient reaches exactly the kept entries (top_k's scatter gives the
  same), so TopK training is unchanged by the mask."""
  f = jnp.asarray(values)
  expected = _top_k_by_sorting(values, k)
  np.testing.assert_array_equal(sae.keep_largest(f, k), expected)
  grad = jax.grad(lambda f: jnp.sum(sae.keep_largest(f, k) * 3.0))(f)
  kept = np.zeros(values.shape, bool)
  np.put_along_axis(kept, np.asarray(jax.lax.top_k(f, k)[1]), True, axis=1)
  np.testing.assert_array_equal(grad, np.where(kept, 3.0, 0.0))


def test_topk_keeps_at_most_the_positive_features():
  """A row with fewer than k positive pre-activations: TopK is its ReLU
  (zeros are never replaced by negative pre-activations)."""
  pre = jnp.array([[3.0, -1.0, -2.0, 0.5], [-1.0, -2.0, -3.0, -4.0]])
  np.testing.assert_array_equal(sae.activate(pre, kind="topk", k=3),
                                [[3.0, 0.0, 0.0, 0.5], [0.0] * 4])
  np.testing.assert_array_equal(sae.activate(pre, kind="topk", k=1),
                                [[3.0, 0.0, 0.0, 0.0], [0.0] * 4])
