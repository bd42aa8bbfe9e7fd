"""Patching at per-example positions (`positions [R, B, T]`), per-example
raw metrics (`normalise=False`) and a sender's change kept to per-example
positions (`sender_positions [B, T]`).

Known answers: the same patch made one example at a time with the
per-position call (which patches one position of a batch of one) or with
a `jnp.where` patch written here on the model's own call; a set holding
every position is the whole-site patch and an empty set patches nothing;
attribution at a set is the sum of the per-position estimates over it,
one example at a time; routing a head's change, kept to some positions,
to every input of the next layer is patching its z there.
"""

from __future__ import annotations

import functools
import re

from flax import nnx
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.interp import patch_positions
from mha_jax.interp import patching

import random_decoder

B, T, H, V = 3, 6, 2, 10
SITES = ("blocks.0.attn.z", "blocks.0.attn.v", "blocks.1.attn.pattern",
         "blocks.1.resid_pre")


def _model(**overrides):
  """A small random model with a final LayerNorm (the metric is not
  linear in any site)."""
  return random_decoder.split(7, **({"vocab_size": V, "num_heads": H,
                                     "max_len": T} | overrides))


GRAPHDEF, STATE = _model()
_RNG = np.random.default_rng(11)
CLEAN, CORRUPT, TARGETS = (_RNG.integers(0, V, (B, T)) for _ in range(3))


def _per_example(targets):
  return patching.per_example_logprob(targets, jnp.ones(targets.shape))


@functools.partial(jax.jit, static_argnames=("fn", "normalise"))
def _batched(state, clean, corrupted, targets, positions, noising, *, fn,
             normalise):
  """`fn` (activation or attribution patching) at per-example
  `positions`: the raw per-example metric, or (normalise) the score of
  the metrics' sum against reference (1, 0): the raw sum denoising."""
  model = nnx.merge(GRAPHDEF, state)
  per = _per_example(targets)
  if normalise:
    return getattr(patching, fn)(
        model, clean, corrupted, lambda x: jnp.sum(per(x)), SITES,
        positions=positions, noising=noising, reference=(1.0, 0.0))
  return getattr(patching, fn)(model, clean, corrupted, per, SITES,
                               positions=positions, noising=noising,
                               normalise=False)


@functools.partial(jax.jit, static_argnames="fn")
def _one_example(state, clean, corrupted, targets, noising, *, fn):
  """The existing per-position call on a batch of one example, against
  reference (1, 0): its score is the raw metric denoising, 1 minus it
  noising (activation); the estimate's change, minus it noising
  (attribution)."""
  model = nnx.merge(GRAPHDEF, state)
  per = _per_example(targets)
  return getattr(patching, fn)(model, clean, corrupted, lambda x: per(x)[0],
                               SITES, per_position=True, noising=noising,
                               reference=(1.0, 0.0))


@jax.jit
def _target_metric(state, tokens, targets):
  return _per_example(targets)(nnx.merge(GRAPHDEF, state)(tokens))


def _loop(fn, noising):
  """`{site: [..., T, B]}`: the raw metric (activation) or the estimate's
  change (attribution) of each per-position patch, one example at a time."""
  out = {}
  for b in range(B):
    got = _one_example(STATE, CLEAN[b:b + 1], CORRUPT[b:b + 1],
                       TARGETS[b:b + 1], jnp.asarray(noising), fn=fn)
    for site, v in got.items():
      v = np.asarray(v, np.float64)
      if fn == "activation_patching":
        v = 1.0 - v if noising else v
      else:
        v = -v if noising else v
      out.setdefault(site, []).append(v)
  return {site: np.stack(v, -1) for site, v in out.items()}


@hypothesis.settings(max_examples=6, deadline=None)
@hypothesis.given(st.lists(st.lists(st.integers(0, T - 1), min_size=B,
                                    max_size=B), min_size=1, max_size=3),
                  st.booleans())
def test_role_patches_are_each_example_patched_at_its_own_position(index,
                                                                   noising):
  """Set r holds position index[r][b] of example b: the batched patch of
  (site, head, r) is, per example, the per-position patch of that
  example alone at that position."""
  index = np.asarray(index)
  positions = patch_positions.at_positions(index, T)
  got = _batched(STATE, CLEAN, CORRUPT, TARGETS, positions,
                 jnp.asarray(noising), fn="activation_patching",
                 normalise=False)
  loop = _loop("activation_patching", noising)
  rows = np.arange(B)
  for site in SITES:
    want = loop[site][..., index, rows]  # [..., R, B]
    assert got[site].shape == want.shape, site
    np.testing.assert_allclose(got[site], want, atol=2e-5, err_msg=site)


def _hand_patched(positions, noising):
  """`[H, R, B]`: z of layer 0, head h, replaced at set r by a `jnp.where`
  patch on the model's own call, head by head and set by set."""
  model = nnx.merge(GRAPHDEF, STATE)
  source, target = (CORRUPT, CLEAN) if noising else (CLEAN, CORRUPT)
  site = "blocks.0.attn.z"
  _, src = model(source, capture=(site,))
  out = np.zeros((H, len(positions), B))
  for h in range(H):
    for r, mask in enumerate(np.asarray(positions)):
      on = mask[:, :, None, None] & (np.arange(H) == h)[None, None, :, None]
      patch = {site: lambda x, on=on: jnp.where(on, src[site], x)}
      out[h, r] = _per_example(TARGETS)(model(target, patch=patch))
  return out


def test_a_set_of_several_positions_is_a_hand_built_patch():
  """Sets of several positions, a different number in each example, one
  empty for one example."""
  rng = np.random.default_rng(2)
  positions = rng.random((3, B, T)) < 0.4
  positions[1, 0] = False
  positions[2] = np.arange(T) >= np.asarray([1, 3, 5])[:, None]
  for noising in (False, True):
    got = _batched(STATE, CLEAN, CORRUPT, TARGETS, jnp.asarray(positions),
                   jnp.asarray(noising), fn="activation_patching",
                   normalise=False)
    np.testing.assert_allclose(got["blocks.0.attn.z"],
                               _hand_patched(positions, noising), atol=2e-5)


@functools.partial(jax.jit, static_argnames="fn")
def _scores(state, clean, corrupted, targets, positions, noising, *, fn):
  """Normalised scores: at `positions`, and of the whole site."""
  model = nnx.merge(GRAPHDEF, state)
  metric = patching.logprob_metric(targets, jnp.ones(targets.shape))
  args = (model, clean, corrupted, metric, SITES)
  return (getattr(patching, fn)(*args, positions=positions, noising=noising),
          getattr(patching, fn)(*args, noising=noising))


@pytest.mark.parametrize("fn", ["activation_patching",
                                "attribution_patching"])
def test_every_position_is_the_whole_site_and_none_is_nothing(fn):
  positions = jnp.stack([jnp.ones((B, T), bool), jnp.zeros((B, T), bool)])
  for noising in (False, True):
    at, whole = _scores(STATE, CLEAN, CORRUPT, TARGETS, positions,
                        jnp.asarray(noising), fn=fn)
    for site in SITES:
      assert at[site].shape == whole[site].shape + (2,), site
      assert np.max(np.abs(whole[site])) > 0.05, site  # a real change
      np.testing.assert_allclose(at[site][..., 0], whole[site], atol=1e-5,
                                 err_msg=site)
      np.testing.assert_allclose(at[site][..., 1], 0.0, atol=1e-6,
                                 err_msg=site)


@hypothesis.settings(max_examples=4, deadline=None)
@hypothesis.given(st.integers(0, 2 ** 16), st.booleans())
def test_attribution_at_a_set_sums_each_examples_per_position_estimate(
    seed, noising):
  """Per example: the target run's metric plus that example's
  per-position estimates summed over its set; pooled (a scalar metric,
  the sum of the examples'), the sum of those over the examples."""
  positions = np.random.default_rng(seed).random((2, B, T)) < 0.5
  loop = _loop("attribution_patching", noising)  # [..., T, B]
  m_target = np.asarray(_target_metric(
      STATE, CLEAN if noising else CORRUPT, TARGETS), np.float64)
  per = _batched(STATE, CLEAN, CORRUPT, TARGETS, jnp.asarray(positions),
                 jnp.asarray(noising), fn="attribution_patching",
                 normalise=False)
  pooled = _batched(STATE, CLEAN, CORRUPT, TARGETS, jnp.asarray(positions),
                    jnp.asarray(noising), fn="attribution_patching",
                    normalise=True)
  for site in SITES:
    est = np.einsum("...tb,rbt->...rb", loop[site], positions)
    np.testing.assert_allclose(per[site], m_target + est, atol=2e-5,
                               err_msg=site)
    # reference (1, 0): the pooled score is the summed estimate denoising,
    # minus it noising.
    sign = -1.0 if noising else 1.0
    np.testing.assert_allclose(pooled[site], sign * est.sum(-1), atol=2e-5,
                               err_msg=site)


@jax.jit
def _per_example_shares(state, positions):
  model = nnx.merge(GRAPHDEF, state)
  return patching.activation_patching(model, CLEAN, CORRUPT,
                                      _per_example(TARGETS), SITES,
                                      positions=positions)


def test_a_per_example_metric_normalised_is_each_examples_own_share():
  """Normalised, a metric returning `[B]` scores each example against its
  own clean and corrupted metric: the raw patched metric's share."""
  positions = patch_positions.at_positions([[0, 3, 5], [2, 2, 1]], T)
  shares = _per_example_shares(STATE, positions)
  raw = _batched(STATE, CLEAN, CORRUPT, TARGETS, positions,
                 jnp.asarray(False), fn="activation_patching",
                 normalise=False)
  m_c, m_x = (np.asarray(_target_metric(STATE, x, TARGETS), np.float64)
              for x in (CLEAN, CORRUPT))
  for site in SITES:
    want = (np.asarray(raw[site], np.float64) - m_x) / (m_c - m_x)
    np.testing.assert_allclose(shares[site], want, rtol=1e-4, atol=1e-5,
                               err_msg=site)


@jax.jit
def _joint_vs_activation(state, routes, at, noising):
  model = nnx.merge(GRAPHDEF, state)
  metric = patching.logprob_metric(TARGETS, jnp.ones((B, T)))
  args = (model, CLEAN, CORRUPT, metric)
  return (patching.joint_path_patching(*args, routes, sender_layer=0,
                                       receiver_layer=1, noising=noising,
                                       sender_positions=at),
          patching.activation_patching(
              *args, ("blocks.0.attn.z", "blocks.1.resid_pre"),
              positions=at[None], noising=noising),
          patching.path_patching(*args, sender=(0, 1), receiver=(1, -1, "k"),
                                 noising=noising, sender_positions=at),
          patching.path_patching_grid(*args, sender_layer=0,
                                      receiver_layer=1, noising=noising,
                                      sender_positions=at))


def test_a_senders_change_kept_to_positions_is_activation_patching_there():
  """In a 2-layer attention-only model, a layer-0 head's change routed to
  layer 1's q, k, v and the readout is patching its z; kept to a mask of
  positions, patching its z at those positions (and every sender at
  once, layer 1's resid_pre there). An empty mask sends nothing."""
  everything = [(s, to) for s in (0, 1, patching.EMBED)
                for to in patching.ROUTES]
  routes = np.stack([patching.route(H, [(h, to) for to in patching.ROUTES])
                     for h in range(H)] + [patching.route(H, everything)])
  rng = np.random.default_rng(4)
  at = rng.random((B, T)) < 0.5
  at[0] = np.arange(T) == 2
  for noising in (False, True):
    joint, act, one, grid = _joint_vs_activation(
        STATE, routes, jnp.asarray(at), jnp.asarray(noising))
    z = act["blocks.0.attn.z"][:, 0]
    assert np.min(np.abs(z)) > 0.01  # real changes
    np.testing.assert_allclose(joint[:H], z, atol=1e-4)
    np.testing.assert_allclose(joint[H], act["blocks.1.resid_pre"][0],
                               atol=1e-4)
    np.testing.assert_allclose(one, grid["k_all"][1], atol=1e-6)
    none, _, one_none, grid_none = _joint_vs_activation(
        STATE, routes, jnp.zeros((B, T), bool), jnp.asarray(noising))
    np.testing.assert_allclose(none, 0.0, atol=1e-6)
    np.testing.assert_allclose(one_none, 0.0, atol=1e-6)
    for key, value in grid_none.items():
      np.testing.assert_allclose(value, 0.0, atol=1e-6, err_msg=key)


def test_the_position_helpers_build_the_masks():
  np.testing.assert_array_equal(
      patch_positions.at_positions([[0, 2], [1, 1]], 3),
      [[[1, 0, 0], [0, 0, 1]], [[0, 1, 0], [0, 1, 0]]])
  masks = patch_positions.role_masks({"A": [0, 2], "B": [1, 2]}, 4,
                                     ("B", "all", "rest", "A"))
  assert masks.dtype == jnp.bool_
  np.testing.assert_array_equal(masks, [
      [[0, 1, 0, 0], [0, 0, 1, 0]], [[1, 1, 1, 1], [1, 1, 1, 1]],
      [[0, 0, 1, 1], [1, 1, 0, 1]], [[1, 0, 0, 0], [0, 0, 1, 0]]])


def _refused(message, fn, *args, **kw):
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    fn(*args, **kw)


def test_bad_positions_are_refused_by_name():
  model = nnx.merge(GRAPHDEF, STATE)
  metric = patching.logprob_metric(TARGETS, jnp.ones((B, T)))
  args = (model, CLEAN, CORRUPT, metric, SITES)
  good = jnp.ones((1, B, T), bool)
  for fn in ("activation_patching", "attribution_patching"):
    _refused(f"{fn}: `per_position=True` patches one position of every "
             f"example and `positions` each example's own; pass one of "
             f"them, got both", getattr(patching, fn), *args,
             per_position=True, positions=good)
    for bad, what in ((jnp.ones((1, B, T), jnp.int32), "int32 of shape "
                       "(1, 3, 6)"), (jnp.ones((B, T), bool),
                                      "bool of shape (3, 6)"),
                      (jnp.ones((1, T, B), bool), "bool of shape (1, 6, 3)")):
      _refused(f"{fn}: `positions` must be a bool array [R, 3, 6] (R "
               f"position sets, one per role, of the inputs' B and T); got "
               f"{what}", getattr(patching, fn), *args, positions=bad)
  _refused("joint_path_patching: `sender_positions` must be a bool array "
           "[3, 6] (the inputs' B and T); got bool of shape (6, 3)",
           patching.joint_path_patching, model, CLEAN, CORRUPT, metric,
           np.zeros((1, 4, H + 1)), sender_layer=0, receiver_layer=1,
           reference=(0.0, 1.0), sender_positions=jnp.ones((T, B), bool))
  _refused("path_patching: `sender_positions` must be a bool array [3, 6] "
           "(the inputs' B and T); got float32 of shape (3, 6)",
           patching.path_patching, model, CLEAN, CORRUPT, metric,
           sender=(0, 0), receiver=("logits",), reference=(0.0, 1.0),
           sender_positions=jnp.ones((B, T)))
  _refused("attribution_patching: `metric` must return a scalar or one "
           "value per example [3], got shape (3, 6)",
           patching.attribution_patching, model, CLEAN, CORRUPT,
           lambda x: x[..., 0], SITES, normalise=False)
  _refused("at_positions: `index` must be integer positions [R, B] (or "
           "[B]) in [0, 6), got int64 of shape (1, 2) in [0, 6]",
           patch_positions.at_positions, [[0, 6]], T)
  _refused("role_masks: `roles` must be drawn from ('all', 'A', 'rest'), "
           "got 'B'", patch_positions.role_masks, {"A": [0]}, 2, ("A", "B"))
