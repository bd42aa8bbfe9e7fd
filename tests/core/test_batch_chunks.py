"""The einsum path in chunks of the batch on CPU (`batch_chunks`): which
calls it chunks, and that a chunked call computes what the whole batch
does, per row, with masks, biases, dropout, segments, positions and user
rules that read the batch index; checked against the "vmap" path (the
reference, never chunked) and against the same call unchunked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax import hooks as hooks_lib
from mha_jax.core import attention
from mha_jax.core import batch_chunks
from mha_jax.core import score_rules

NO_HOOKS = hooks_lib.NO_HOOKS


def test_count_known_answers():
  # The train-step benchmark's text size: 32 MiB of float32 scores.
  assert batch_chunks.count(16, 8, 256, 256, NO_HOOKS) == 4
  # Its random shape (2 MiB) and the induction experiment's (1 MiB).
  assert batch_chunks.count(8, 4, 128, 128, NO_HOOKS) == 1
  assert batch_chunks.count(64, 4, 32, 32, NO_HOOKS) == 1
  # At the threshold (8 MiB) and a key below it; a batch smaller than 4
  # gives a chunk per row.
  assert batch_chunks.count(4, 1, 1024, 512, NO_HOOKS) == 4
  assert batch_chunks.count(4, 1, 1024, 511, NO_HOOKS) == 1
  assert batch_chunks.count(3, 8, 512, 512, NO_HOOKS) == 3
  assert batch_chunks.count(1, 64, 1024, 1024, NO_HOOKS) == 1
  # A hook on the weights sees the whole batch; other sites do not care.
  assert batch_chunks.count(16, 8, 256, 256,
                            hooks_lib.Hooks(capture=("pattern",))) == 1
  assert batch_chunks.count(16, 8, 256, 256,
                            hooks_lib.Hooks(capture=("scores",))) == 1
  assert batch_chunks.count(16, 8, 256, 256,
                            hooks_lib.Hooks(capture=("z",))) == 4


def test_count_is_one_off_cpu(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert batch_chunks.count(16, 8, 256, 256, NO_HOOKS) == 1


def test_count_is_one_with_several_devices(monkeypatch):
  # A data mesh over host devices splits the batch already.
  monkeypatch.setattr(jax, "device_count", lambda *a: 2)
  assert batch_chunks.count(16, 8, 256, 256, NO_HOOKS) == 1


def test_bounds_cover_the_batch_in_near_equal_runs():
  assert batch_chunks.bounds(16, 4) == [(0, 4), (4, 8), (8, 12), (12, 16)]
  assert batch_chunks.bounds(5, 4) == [(0, 1), (1, 2), (2, 3), (3, 5)]
  assert batch_chunks.bounds(3, 3) == [(0, 1), (1, 2), (2, 3)]


def _normal(rng, *shape):
  return jnp.asarray(rng.normal(size=shape), jnp.float32)


def _case(name, rng, b, tq, tk, h, kh):
  """(attend kwargs beyond q, k, v) for one kind of call."""
  if name == "mask_and_bias":  # a per-row mask, a bias shared by rows
    return {"mask": jnp.asarray(rng.random((b, 1, tq, tk)) < 0.7),
            "bias": _normal(rng, 1, h, tq, tk), "is_causal": True}
  if name == "segments_and_positions":
    seg = np.sort(rng.integers(0, 3, size=(b, tk)), axis=1)
    return {"is_causal": True, "rules": score_rules.ScoreRules(
        q_segment_ids=jnp.asarray(seg[:, -tq:]),
        kv_segment_ids=jnp.asarray(seg),
        q_positions=jnp.asarray(np.tile(np.arange(tk - tq, tk), (b, 1))))}
  if name == "user_rules_by_row":  # each batch row its own window and bias
    return {"rules": score_rules.ScoreRules(
        mask_mod=lambda bi, hi, qi, ki: ki <= qi + bi,
        score_mod=lambda s, bi, hi, qi, ki: s + 0.25 * bi - 0.1 * hi)}
  raise ValueError(name)


def _run(path, q, k, v, w, kwargs):
  def loss(q, k, v):
    out, _ = attention.attend(q, k, v, implementation=path, **kwargs)
    return jnp.sum(out * w), out
  (_, out), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


@pytest.mark.parametrize("name", ["mask_and_bias", "segments_and_positions",
                                  "user_rules_by_row"])
def test_chunked_einsum_equals_the_whole_batch(name, monkeypatch):
  # Tiny shapes: the threshold is lowered so that they are chunked; 5 rows
  # in 4 chunks, one of them of two rows; GQA (4 query heads on 2 kv heads).
  b, tq, tk, h, kh = 5, 6, 7, 4, 2
  rng = np.random.default_rng(3)
  q, k, v = (_normal(rng, b, t, n, 8) for t, n in
             ((tq, h), (tk, kh), (tk, kh)))
  w = _normal(rng, b, tq, h, 8)
  kwargs = _case(name, rng, b, tq, tk, h, kh)
  want, want_grads = _run("vmap", q, k, v, w, kwargs)
  whole, whole_grads = _run("einsum", q, k, v, w, kwargs)
  monkeypatch.setattr(batch_chunks, "MIN_SCORE_BYTES", 0)
  assert batch_chunks.count(b, h, tq, tk, NO_HOOKS) == 4
  got, got_grads = _run("einsum", q, k, v, w, kwargs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  for g, r in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
  # Each row is computed as in the whole batch: the same bits.
  np.testing.assert_array_equal(got, whole)
  for g, r in zip(got_grads, whole_grads):
    np.testing.assert_array_equal(g, r)


def test_chunked_dropout_keeps_each_rows_draw(monkeypatch):
  b, t, h = 4, 5, 2
  rng = np.random.default_rng(4)
  q, k, v = (_normal(rng, b, t, h, 8) for _ in range(3))
  key = jax.random.PRNGKey(7)
  run = lambda: attention.attend(q, k, v, implementation="einsum",
                                 dropout_rate=0.3, dropout_rng=key)
  whole, whole_pattern = run()
  monkeypatch.setattr(batch_chunks, "MIN_SCORE_BYTES", 0)
  got, got_pattern = run()
  np.testing.assert_array_equal(got, whole)
  np.testing.assert_array_equal(got_pattern, whole_pattern)


def test_a_call_above_the_threshold_runs_in_four_chunks():
  # 4 x 1 x 1024 x 1024 float32 scores: 16 MiB, twice the threshold,
  # with a head width of 4 so that it stays cheap. Four chunks of one row:
  # 2 products each, 8 in all, against the reference.
  rng = np.random.default_rng(5)
  q, k, v = (_normal(rng, 4, 1024, 1, 4) for _ in range(3))
  f = lambda q, k, v: attention.attend(q, k, v, implementation="einsum",
                                       is_causal=True)[0]
  eqns = jax.make_jaxpr(f)(q, k, v).jaxpr.eqns
  assert sum(e.primitive.name == "dot_general" for e in eqns) == 8
  want, _ = attention.attend(q, k, v, implementation="vmap", is_causal=True)
  np.testing.assert_allclose(jax.jit(f)(q, k, v), want, rtol=1e-5,
                             atol=1e-6)
