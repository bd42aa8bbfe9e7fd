"""User rules (`score_mod`, `mask_mod`) on every path that takes them,
against a float64 NumPy reference that applies the rule to the whole score
matrix and differentiates it by hand; and the errors of a malformed rule."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from tests.core.rule_reference import Rule
from tests.core.rule_reference import reference


# "flash": one (batch, kv head) at a time (the CPU default), with a block
# mask where the rule has a mask_mod; "flash_batched": all heads per block
# (the GPU default), without one.
PATHS = ("vmap", "einsum", "flash", "flash_batched")


def _run(path, q, k, v, w, rule, table):
  """out and d sum(out * w) / d (q, k, v, table) on `path`, jitted."""
  bm = None
  if path == "flash" and rule.mask_mod is not None:
    # Built once, outside the compiled step (it is NumPy).
    bm = block_mask.create(rule.mask_mod, q.shape[0], None, q.shape[1],
                           k.shape[1], 4, 4)

  def loss(q, k, v, table):
    rules = rule.rules(table)
    if path in ("vmap", "einsum"):
      out, _ = attention.attend(q, k, v, implementation=path, rules=rules)
    else:
      rules = rules.replace(block_mask=bm)
      attention.check_attend_inputs(q, k, v, None, None, "flash",
                                    rules=rules)
      out = flash.flash_attention(q, k, v, rules=rules, block_q=4,
                                  block_k=4,
                                  head_loop=path != "flash_batched")
    return jnp.sum(out * w), out
  (_, out), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, table)
  return out, grads


def _check_rule(name, b, tq, tk, h, kh, seed, paths=PATHS[:3]):
  rng = np.random.default_rng(seed)
  rule = Rule(name, b, h, tk, rng)
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in
             ((b, tq, h, 8), (b, tk, kh, 8), (b, tk, kh, 8)))
  w = rng.normal(size=(b, tq, h, 8)).astype(np.float32)
  table = (jnp.zeros((1,)) if rule.table is None else
           jnp.asarray(rule.table))
  want_out, *want_grads, dmod = reference(q, k, v, w, rule)
  for path in paths:
    out, grads = _run(path, q, k, v, w, rule, table)
    np.testing.assert_allclose(out, want_out, atol=2e-5, err_msg=path)
    for got, want, what in zip(grads, want_grads, "qkv"):
      np.testing.assert_allclose(got, want, atol=5e-5,
                                 err_msg=f"{path} d{what}")
    if rule.table is not None:  # the table gets every dmod at its offset
      want_table = np.zeros(rule.table.shape)
      rel = (tk - tq + np.arange(tq))[:, None] - np.arange(tk)[None] + tk - 1
      for hi in range(h):
        np.add.at(want_table[hi], rel, dmod[:, hi].sum(0))
      np.testing.assert_allclose(grads[3], want_table, atol=5e-5,
                                 err_msg=f"{path} dtable")


RULES = ("relative_bias", "documents", "prefix_lm", "soft_cap",
         "window_sinks")


def draw_shape(rng) -> dict:
  """A random shape: batch 1-2, 5-9 queries (two or three blocks of 4),
  0-4 more keys, heads (H, K) of (2, 1) or (2, 2)."""
  tq = int(rng.integers(5, 10))
  return dict(b=int(rng.integers(1, 3)), tq=tq,
              tk=tq + int(rng.integers(0, 5)),
              heads=[(2, 1), (2, 2)][int(rng.integers(2))],
              seed=int(rng.integers(100)))


# One shape per rule, each from its own seeded draw: every new shape
# compiles every path, and the suite's time is budgeted. (Hypothesis with
# one example would not do: its first example is the smallest, b = 1 and
# one query and one key for every rule.) tests/real_models/
# test_score_mod_shapes.py runs hypothesis over many shapes in the heavy
# tier.
@pytest.mark.parametrize("index, name", list(enumerate(RULES)))
def test_rule_matches_float64_reference_on_every_path(index, name):
  shape = draw_shape(np.random.default_rng(1000 + index))
  (h, kh) = shape.pop("heads")
  _check_rule(name, shape["b"], shape["tq"], shape["tk"], h, kh,
              shape["seed"])


@pytest.mark.parametrize("name", ["relative_bias", "documents"])
def test_batched_kernel_matches_float64_reference(name):
  # The batched kernel sums the table's gradient over (B, K) in one block.
  _check_rule(name, 2, 6, 9, 4, 2, seed=5, paths=("flash_batched",))


def test_fully_masked_rows_give_zero_output_and_zero_gradients():
  # The project's empty-row policy (attention.py): output 0 and finite
  # gradients (0 to the keys through those rows), not NaN, on every path;
  # the reference gives exactly that for rows with no allowed key.
  _check_rule("empty_rows", 2, 6, 6, 2, 1, seed=3, paths=PATHS)


@pytest.mark.parametrize("rule, field, match", [
    (lambda s, b, h: s, "score_mod", "takes 3 positional"),
    (lambda s, b, h, qi, ki: jnp.stack([s, s]), "score_mod",
     "one value per"),
    (lambda s, b, h, qi, ki: qi, "score_mod", "a float score, got int32"),
    (lambda b, h, qi, ki: qi - ki, "mask_mod", "a bool, got int32"),
    (3.0, "mask_mod", "must be a function"),
])
def test_malformed_rule_is_refused_naming_it(rule, field, match):
  q = jnp.zeros((1, 4, 2, 8))
  with pytest.raises((TypeError, ValueError),
                     match=rf"attend: `{field}`.*{match}"):
    attention.attend(q, q, q, implementation="flash",
                     rules=score_rules.ScoreRules(**{field: rule}))


@pytest.mark.parametrize("implementation", ["xla", "cudnn", "pallas_tpu"])
def test_paths_without_user_rules_refuse_them(implementation):
  q = jnp.zeros((1, 4, 2, 8))
  with pytest.raises(ValueError, match=re.escape(
      f"attend: implementation={implementation!r} does not apply `mask_mod` "
      "(user rules); use one of ['auto', 'einsum', 'flash', 'pallas_gpu', "
      "'vmap']")):
    attention.attend(q, q, q, implementation=implementation,
                     rules=score_rules.ScoreRules(
                         mask_mod=lambda b, h, qi, ki: ki <= qi))


def test_user_rules_compose_with_every_builtin_rule_and_gradient():
  # All built-ins at once (bias, ALiBi, soft cap, window, segments, sinks,
  # causal) with a user score_mod and mask_mod: the blockwise kernel's
  # gradients to every input equal the reference path's (vmap, itself
  # checked against float64 above and in test_score_rules.py).
  b, t, h = 2, 11, 4
  ks = jax.random.split(jax.random.key(1), 6)
  q = jax.random.normal(ks[0], (b, t, h, 8))
  k, v = (jax.random.normal(kk, (b, t, 2, 8)) for kk in ks[1:3])
  args = (q, k, v, jax.random.normal(ks[3], (h, 2 * t - 1)),
          jax.random.normal(ks[4], (1, h, t, t)),
          jax.random.normal(ks[5], (h,)), jnp.array([0.1, 0.2, 0.3, 0.4]))
  seg = jnp.array(np.sort(np.random.default_rng(0).integers(0, 3, (b, t)),
                          axis=1))

  def grads(path):
    def loss(q, k, v, table, bias, sinks, slopes):
      rules = score_rules.ScoreRules(
          soft_cap=1.5, alibi_slopes=slopes, sinks=sinks,
          local_window=(6, 2), q_segment_ids=seg, kv_segment_ids=seg,
          score_mod=lambda s, b, h, qi, ki: s * (1 + 0.1 * b) + table[
              h, qi - ki + t - 1],
          mask_mod=lambda b, h, qi, ki: (ki + h) % 5 != 0)
      if path == "vmap":
        out, _ = attention.attend(q, k, v, bias=bias, is_causal=True,
                                  rules=rules)
      else:
        out = flash.flash_attention(q, k, v, bias=bias, is_causal=True,
                                    rules=rules, block_q=4, block_k=4)
      return jnp.sum(jnp.sin(out))
    return jax.jit(jax.grad(loss, argnums=tuple(range(7))))(*args)
  for got, want, name in zip(grads("flash"), grads("vmap"),
                             ["q", "k", "v", "table", "bias", "sinks",
                              "slopes"]):
    np.testing.assert_allclose(got, want, atol=2e-5, err_msg=name)
