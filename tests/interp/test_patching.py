"""Activation, path and attribution patching; clean/corrupted pairs.

Known answers come from the hand-wired circuit of `tests/wired_circuit.py`
(one path matters: layer-1 head 0 -> the keys of layer-2 head 1), from
patching a run into itself (1 and 0 by definition), from a model that is
linear in the patched site (attribution is exact there), and from
shrinking a perturbation (attribution's error shrinks faster than the
change). Last, the calibration of attribution against activation
patching and patching fractions from per-example sums (`calibration`).
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mha_jax.interp import calibration
from mha_jax.interp import corruption
from mha_jax.interp import patching
from mha_jax.training import tasks
from mha_jax.measure import stats

import random_decoder
import wired_circuit as wc


@pytest.fixture(scope="module")
def wired():
  return nnx.split(wc.build()), wc.pairs()


def _metric(pairs):
  return patching.logprob_metric(pairs["targets"], pairs["loss_mask"])


# The joint sets the wired tests route: the AND of keys and values (the
# previous-token head into the keys, the embedding into the values), and
# the previous-token head everywhere (its whole output).
_WIRED_ROUTES = np.stack([
    patching.route(2, [(0, "k"), (patching.EMBED, "v")]),
    patching.route(2, [(0, to) for to in patching.ROUTES])])


@functools.partial(jax.jit, static_argnums=0)
def _wired_paths(graphdef, state, pairs, noising):
  """The grid, one single path through the public function, the joint
  sets and the activation patching of each head's z, in one direction.
  Every kind of pairs has the same shapes: one compile serves them all."""
  model = nnx.merge(graphdef, state)
  args = dict(model=model, clean=pairs["inputs"],
              corrupted=pairs["corrupted"], metric=_metric(pairs))
  return {"grid": patching.path_patching_grid(
              sender_layer=0, receiver_layer=1, noising=noising, **args),
          "one": patching.path_patching(
              sender=(0, 0), receiver=(1, 1, "k"), noising=noising, **args),
          "embed_v": patching.path_patching(
              sender=(patching.EMBED,), receiver=(1, 1, "v"),
              noising=noising, **args),
          "joint": patching.joint_path_patching(
              routes=_WIRED_ROUTES, sender_layer=0, receiver_layer=1,
              noising=noising, **args),
          "z": patching.activation_patching(
              sites=("blocks.0.attn.z", "blocks.1.attn.z"), noising=noising,
              **args)}


@functools.partial(jax.jit, static_argnums=0)
def _reference(graphdef, state, pairs):
  return patching.reference_metrics(nnx.merge(graphdef, state),
                                    pairs["inputs"], pairs["corrupted"],
                                    _metric(pairs))


def test_the_wired_patterns_are_one_hot(wired):
  """What the known answers below rest on."""
  (graphdef, state), _ = wired
  model = nnx.merge(graphdef, state)
  for kind in wc.WIRED_KINDS:
    pairs = wc.pairs(kind)
    for tokens in (pairs["inputs"], pairs["corrupted"]):
      assert min(wc.checks(model, tokens).values()) > 1 - 1e-4, kind
    m_clean, m_corrupt = _reference(graphdef, state, pairs)
    assert m_clean > -0.5 and m_corrupt < -3.0, kind


# What each corruption breaks on the wired model, as grid entries that
# must be 1 (every other entry 0): the previous-token head L1H1 (sender 0)
# into the keys of the induction head L2H2 (receiver 1), the embedding
# into its values or queries. The first copy holds both a key's previous
# token and the value it copies, so noising either path removes all of
# it; the other three each break one path only.
_BREAKS = {"first_copy": (("k", (0, 1)), ("k_all", (0,)), ("embed_v", (1,)),
                          ("embed_v_all", ())),
           "key": (("k", (0, 1)), ("k_all", (0,))),
           "value": (("embed_v", (1,)), ("embed_v_all", ())),
           "second_copy": (("embed_q", (1,)), ("embed_q_all", ()))}


def _only(grid, ones, err):
  """Every entry of `grid` 0 except `ones` (key, index) pairs, which are 1."""
  for key, value in grid.items():
    want = np.zeros(np.shape(value))
    for k, idx in ones:
      if k == key:
        want[idx] = 1.0
    np.testing.assert_allclose(value, want, atol=1e-3, err_msg=f"{err} {key}")


@pytest.mark.parametrize("kind", list(_BREAKS))
def test_each_corruption_reveals_exactly_the_wired_paths_it_breaks(wired,
                                                                    kind):
  (graphdef, state), _ = wired
  pairs = wc.pairs(kind)
  noise = _wired_paths(graphdef, state, pairs, jnp.asarray(True))
  denoise = _wired_paths(graphdef, state, pairs, jnp.asarray(False))
  _only(noise["grid"], _BREAKS[kind], f"{kind} noise")
  np.testing.assert_allclose(noise["one"], noise["grid"]["k"][0, 1],
                             atol=1e-6)
  np.testing.assert_allclose(noise["embed_v"], noise["grid"]["embed_v"][1],
                             atol=1e-6)
  if kind == "first_copy":
    # An AND: restoring the keys alone finds the earlier copy, whose
    # tokens (the values) are still corrupted, and restoring the values
    # alone finds nothing to copy them from: every path alone restores 0.
    _only(denoise["grid"], (), "first_copy denoise")
  else:
    # One path broken: restoring it alone restores everything.
    _only(denoise["grid"], _BREAKS[kind], f"{kind} denoise")
  # Keys and values together restore (and remove) all of it, except
  # where the queries were broken, which neither path touches.
  and_ = 0.0 if kind == "second_copy" else 1.0
  for d in (noise, denoise):
    np.testing.assert_allclose(d["joint"][0], and_, atol=1e-3)


def test_a_heads_every_path_at_once_is_its_whole_output(wired):
  """Routing the previous-token head to q, k, v and the readout is
  patching its z; the induction head's z restores all of the second copy
  (its residual stream is then the clean one)."""
  (graphdef, state), pairs = wired
  z0, z1 = "blocks.0.attn.z", "blocks.1.attn.z"
  for noising in (True, False):
    d = _wired_paths(graphdef, state, pairs, jnp.asarray(noising))
    np.testing.assert_allclose(d["z"][z0][0], d["joint"][1], atol=1e-5)
    np.testing.assert_allclose(d["z"][z0][1], 0.0, atol=1e-3)
  np.testing.assert_allclose(d["z"][z1], [0.0, 1.0], atol=1e-5)


@functools.partial(jax.jit, static_argnums=0)
def _activation(graphdef, state, source, target, pairs, reference):
  model = nnx.merge(graphdef, state)
  return patching.activation_patching(
      model, source, target, _metric(pairs),
      ("blocks.0.resid_pre", "blocks.0.attn.z", "blocks.1.attn.pattern",
       "blocks.1.attn.v"), per_position=True, reference=reference)


def test_a_run_patched_into_itself_scores_1_clean_and_0_corrupted(wired):
  (graphdef, state), pairs = wired
  ref = _reference(graphdef, state, pairs)
  clean = _activation(graphdef, state, pairs["inputs"], pairs["inputs"],
                      pairs, ref)
  corrupt = _activation(graphdef, state, pairs["corrupted"],
                        pairs["corrupted"], pairs, ref)
  shapes = {"blocks.0.resid_pre": (wc.T,), "blocks.0.attn.z": (2, wc.T),
            "blocks.1.attn.pattern": (2, wc.T), "blocks.1.attn.v": (2, wc.T)}
  for site, shape in shapes.items():
    assert clean[site].shape == shape
    np.testing.assert_allclose(clean[site], 1.0, atol=1e-5, err_msg=site)
    np.testing.assert_allclose(corrupt[site], 0.0, atol=1e-5, err_msg=site)


def _random_model(**overrides):
  return random_decoder.model(3, **overrides)


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _estimates(graphdef, state, clean, corrupted, metric_args, kind, sites,
               noising):
  """Activation and attribution patching per head and position (kind
  "logit": `logit_metric` of (targets, mask); "logprob_0": the mean
  log-softmax of output 0). `noising` is traced: one compile, both ways;
  None leaves it out, to the functions' default."""
  model = nnx.merge(graphdef, state)
  if kind == "logit":
    metric = patching.logit_metric(*metric_args)
  else:
    metric = lambda out: jnp.mean(jax.nn.log_softmax(out)[..., 0])
  way = {} if noising is None else {"noising": noising}
  return {name: fn(model, clean, corrupted, metric, sites, per_position=True,
                   **way)
          for name, fn in (("act", patching.activation_patching),
                           ("attr", patching.attribution_patching))}


def _both_estimates(*args):
  return {(name, n): v for n in (False, True)
          for name, v in _estimates(*args, jnp.asarray(n)).items()}


def test_attribution_is_exact_where_the_metric_is_linear_in_the_site():
  """Without a final LayerNorm the logits are linear in the last layer's
  head outputs, and the metric (a mean logit) linear in the logits."""
  graphdef, state = nnx.split(_random_model(final_ln=False))
  rng = np.random.default_rng(0)
  clean, corrupt, targets = (rng.integers(0, 10, (4, 6)) for _ in range(3))
  mask = np.ones((4, 6), np.float32)
  mask[:, :2] = 0.0
  sites = ("blocks.1.attn.z", "blocks.1.resid_post")
  out = _both_estimates(graphdef, state, clean, corrupt, (targets, mask),
                        "logit", sites)
  for noising in (False, True):
    for site in sites:
      act, attr = out["act", noising][site], out["attr", noising][site]
      assert np.max(np.abs(act)) > 0.05  # a real change is being compared
      np.testing.assert_allclose(attr, act, atol=2e-4, err_msg=site)


def test_denoising_is_the_default_of_both_estimates():
  """Clean patched into corrupted unless `noising` says otherwise. With a
  final LayerNorm the metric is not linear in the sites, so the two ways
  give different shares and a default of noising would show."""
  graphdef, state = nnx.split(_random_model())
  rng = np.random.default_rng(0)
  clean, corrupt, targets = (rng.integers(0, 10, (4, 6)) for _ in range(3))
  args = (graphdef, state, clean, corrupt, (targets, np.ones((4, 6))),
          "logit", ("blocks.0.attn.z", "blocks.1.resid_pre"))
  ways = _both_estimates(*args)
  default = _estimates(*args, None)
  for name in ("act", "attr"):
    for site, value in default[name].items():
      assert np.max(np.abs(ways[name, True][site] - ways[name, False][site])
                    ) > 0.05, (name, site)
      # Two compiled programs (a constant way against a traced one): equal
      # up to float32 rounding of O(1) shares; the ways differ by > 0.05.
      np.testing.assert_allclose(value, ways[name, False][site], atol=1e-5,
                                 err_msg=f"{name} {site}")


@functools.partial(jax.jit, static_argnums=(0, 5))
def _per_head_attribution(graphdef, state, clean, corrupted, metric_args,
                          sites, noising):
  return patching.attribution_patching(
      nnx.merge(graphdef, state), clean, corrupted,
      patching.logit_metric(*metric_args), sites, noising=noising)


def test_attribution_on_pattern_and_scores_is_heads_by_positions():
  """The pattern sites put heads before positions ([B, H, Tq, Tk]), the
  z sites after them: the per-position estimate is `[H, T]` for both.
  Without a final LayerNorm or MLPs the logits are linear in the last
  layer's pattern (z = pattern v, v unchanged), so there attribution is
  exact: the activation patching of each head at each query position.
  Scores have no such answer, but their per-position estimates must add
  up to the per-head one (both are sums of the same products)."""
  graphdef, state = nnx.split(_random_model(final_ln=False))
  rng = np.random.default_rng(0)
  clean, corrupt, targets = (rng.integers(0, 10, (4, 6)) for _ in range(3))
  mask = np.ones((4, 6), np.float32)
  mask[:, :2] = 0.0
  pattern, scores = sites = ("blocks.1.attn.pattern", "blocks.1.attn.scores")
  out = _both_estimates(graphdef, state, clean, corrupt, (targets, mask),
                        "logit", sites)
  for noising in (False, True):
    act, attr = out["act", noising], out["attr", noising]
    assert attr[pattern].shape == attr[scores].shape == (2, 6)  # [H, T]
    assert np.max(np.abs(act[pattern])) > 0.05
    np.testing.assert_allclose(attr[pattern], act[pattern], atol=2e-4)
    per_head = _per_head_attribution(graphdef, state, clean, corrupt,
                                     (targets, mask), sites,
                                     jnp.asarray(noising))
    for site in sites:
      np.testing.assert_allclose(attr[site].sum(-1), per_head[site],
                                 rtol=1e-5, atol=1e-6, err_msg=site)


def test_attribution_agrees_with_patching_to_first_order():
  """A continuous-input model, corrupted = clean + delta * noise: the
  gap between the first-order estimate and the real patch (both as
  shares of the clean-minus-corrupted change) shrinks like delta."""
  graphdef, state = nnx.split(_random_model(vocab_size=0, input_dim=4,
                                            output_dim=3))
  rng = np.random.default_rng(1)
  clean, noise = (rng.normal(size=(4, 6, 4)).astype(np.float32)
                  for _ in range(2))
  sites = ("blocks.0.attn.z", "blocks.1.attn.z", "blocks.1.resid_pre")
  gaps = []
  for delta in (0.1, 0.01):
    out = _both_estimates(graphdef, state, clean, clean + delta * noise,
                          (), "logprob_0", sites)
    gaps.append(max(float(np.max(np.abs(out["act", n][s] - out["attr", n][s])))
                    for n in (False, True) for s in sites))
  assert gaps[1] < 0.02
  assert gaps[1] < gaps[0] / 4  # first order: about / 10


@functools.partial(jax.jit, static_argnums=0)
def _joint_vs_activation(graphdef, state, clean, corrupted, metric_args,
                         routes, noising):
  model = nnx.merge(graphdef, state)
  metric = patching.logit_metric(*metric_args)
  args = (model, clean, corrupted, metric)
  return (patching.joint_path_patching(*args, routes, sender_layer=0,
                                       receiver_layer=1, noising=noising),
          patching.activation_patching(
              *args, ("blocks.0.attn.z", "blocks.1.resid_pre"),
              noising=noising))


def test_joint_routes_that_cover_a_whole_output_are_activation_patching():
  """In a 2-layer attention-only model a layer-0 head's output reaches the
  logits only through layer 1's q, k, v and directly: routed to all four
  it is patching its z; every sender (embedding included) to all four is
  patching layer 1's resid_pre. Exact, for a random model with a final
  LayerNorm (nonlinear), in both directions."""
  graphdef, state = nnx.split(_random_model())
  rng = np.random.default_rng(5)
  clean, corrupt, targets = (rng.integers(0, 10, (4, 6)) for _ in range(3))
  everything = [(s, to) for s in (0, 1, patching.EMBED)
                for to in patching.ROUTES]
  routes = np.stack([patching.route(2, [(h, to) for to in patching.ROUTES])
                     for h in (0, 1)] + [patching.route(2, everything)])
  for noising in (False, True):
    joint, act = _joint_vs_activation(graphdef, state, clean, corrupt,
                                      (targets, np.ones((4, 6))), routes,
                                      jnp.asarray(noising))
    assert np.min(np.abs(act["blocks.0.attn.z"])) > 0.05  # real changes
    np.testing.assert_allclose(joint[:2], act["blocks.0.attn.z"], atol=1e-4)
    np.testing.assert_allclose(joint[2], act["blocks.1.resid_pre"],
                               atol=1e-4)


def test_route_refuses_unknown_senders_and_receivers():
  with pytest.raises(ValueError, match="receiver must be one of"):
    patching.route(2, [(0, "z")])
  with pytest.raises(ValueError, match=r"sender must be a head in \[0, 2\)"):
    patching.route(2, [(2, "k")])
  with pytest.raises(ValueError, match=r"`routes` must be \[N, 4, 3\]"):
    patching.joint_path_patching(_random_model(), np.zeros((1, 6), int),
                                 np.zeros((1, 6), int), lambda x: x.sum(),
                                 np.zeros((4, 3)), sender_layer=0,
                                 receiver_layer=1, reference=(0.0, 1.0))


def test_path_patching_refuses_a_receiver_that_cannot_receive(wired):
  (graphdef, state), pairs = wired
  model = nnx.merge(graphdef, state)
  args = (model, pairs["inputs"], pairs["corrupted"], _metric(pairs))
  with pytest.raises(ValueError, match="receiver layer .0. must come after"):
    patching.path_patching(*args, sender=(0, 0), receiver=(0, 1, "k"))
  with pytest.raises(ValueError, match="`receiver` must be"):
    patching.path_patching(*args, sender=(0, 0), receiver=(1, 1, "z"))


def _task_cfg(**kw):
  return ml_collections.ConfigDict(dict(
      batch_size=16, seq_len=20, vocab_size=12, min_segment=3,
      max_segment=6) | kw)


def test_induction_pairs_resample_exactly_the_first_copy():
  cfg = _task_cfg()
  key = jax.random.key(4)
  p, batch = jax.tree.map(np.asarray, jax.jit(lambda k: (
      corruption.induction_pairs(k, cfg), tasks.induction_batch(k, cfg)))(key))
  for k in ("inputs", "targets", "loss_mask"):  # the task's own batch
    np.testing.assert_array_equal(p[k], batch[k])
  pos = np.arange(cfg.seq_len)
  for b in range(cfg.batch_size):
    seg, s1, s2 = p["segment"][b], p["first"][b], p["second"][b]
    first = (pos >= s1) & (pos < s1 + seg)
    x, y = p["inputs"][b], p["corrupted"][b]
    assert np.all(x[first] != y[first]) and np.all(x[~first] == y[~first])
    assert np.all((y >= tasks.NUM_SPECIAL) & (y < cfg.vocab_size))
    n = min(seg, cfg.seq_len - s2)  # the second copy may run past T
    np.testing.assert_array_equal(x[s2:s2 + n], x[s1:s1 + n])
    np.testing.assert_array_equal(p["loss_mask"][b],
                                  (pos >= s2) & (pos < s2 + seg - 1))


def test_induction_pairs_with_a_fixed_layout():
  cfg = _task_cfg(batch_size=4)
  p = jax.jit(lambda k: corruption.induction_pairs(k, cfg, layout=(4, 2, 9))
              )(jax.random.key(5))
  x, y = np.asarray(p["inputs"]), np.asarray(p["corrupted"])
  np.testing.assert_array_equal(x[:, 9:13], x[:, 2:6])
  assert np.all(x[:, 2:6] != y[:, 2:6])
  np.testing.assert_array_equal(np.delete(x, range(2, 6), 1),
                                np.delete(y, range(2, 6), 1))
  np.testing.assert_array_equal(np.asarray(p["loss_mask"])[0],
                                np.isin(np.arange(20), [9, 10, 11]))
  with pytest.raises(ValueError, match="layout"):
    corruption.induction_pairs(jax.random.key(5), cfg, layout=(4, 2, 4))


# Calibration (`mha_jax.interp.calibration`).


def test_a_scaled_estimate_ranks_right_and_has_the_scale_as_slope():
  actual = np.array([0.9, 0.05, -0.1, 0.3])
  cal = calibration.calibration(actual, 0.1 * actual + 0.02, k=2)
  assert cal["slope"] == pytest.approx(0.1)
  assert cal["pearson"] == pytest.approx(1.0)
  assert cal["top_k"] == 1.0 and cal["n"] == 4


def test_top_k_agreement_counts_the_shared_largest_magnitudes():
  actual = np.array([0.9, 0.05, -0.6, 0.3])
  # Largest |actual|: 0 then 2; the estimate's: 3 then 0.
  estimate = np.array([0.5, 0.0, 0.1, -0.8])
  assert calibration.top_k_agreement(actual, estimate, 1) == 0.0
  assert calibration.top_k_agreement(actual, estimate, 2) == 0.5
  assert calibration.top_k_agreement(actual, estimate, 4) == 1.0


def test_calibration_without_spread_has_no_slope_or_r():
  cal = calibration.calibration([0.2, 0.2, 0.2], [0.1, 0.3, 0.2])
  assert cal["slope"] is None and cal["pearson"] is None


def test_bad_inputs_are_refused_by_name():
  with pytest.raises(ValueError, match="same number"):
    calibration.calibration([1.0, 2.0], [1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match="`k` must be in"):
    calibration.top_k_agreement([1.0, 2.0], [1.0, 2.0], 3)
  with pytest.raises(ValueError, match="at least 2 examples"):
    calibration.bootstrap_fractions(np.zeros((1, 1)), [0.0], [1.0], False)


def _metric_sums(rng, b=40):
  count = rng.integers(1, 5, b).astype(float)
  clean = -0.2 * count + rng.normal(0, 0.1, b)
  corrupt = -3.0 * count + rng.normal(0, 0.5, b)
  patched = np.stack([clean * 0.3 + corrupt * 0.7, clean, corrupt])
  return patched, clean, corrupt


def test_pooled_fractions_are_the_patching_scores():
  """A run equal to the clean one scores 1 denoising and 0 noising; the
  corrupted run the reverse; a mix of the two sums scores its share."""
  patched, clean, corrupt = _metric_sums(np.random.default_rng(0))
  den = calibration.pooled_fractions(patched, clean, corrupt, False)
  noi = calibration.pooled_fractions(patched, clean, corrupt, True)
  np.testing.assert_allclose(den[1:], [1.0, 0.0], atol=1e-12)
  np.testing.assert_allclose(noi[1:], [0.0, 1.0], atol=1e-12)
  np.testing.assert_allclose(den[0], 0.3, atol=1e-12)  # linear in sums
  np.testing.assert_allclose(den + noi, 1.0, atol=1e-12)


def test_bootstrap_fractions_match_the_generic_bootstrap():
  """Same seed, same draws: the vectorised interval of each set equals
  `stats.bootstrap_interval` of the fraction recomputed per resample."""
  patched, clean, corrupt = _metric_sums(np.random.default_rng(1))
  got = calibration.bootstrap_fractions(patched, clean, corrupt, True,
                                        resamples=300, seed=4)
  rows = np.column_stack([patched[0], clean, corrupt])
  want = stats.bootstrap_interval(
      rows, lambda r: calibration.pooled_fractions(
          r[:, 0][None], r[:, 1], r[:, 2], True)[0],
      resamples=300, seed=4)
  np.testing.assert_allclose(got[0], want, rtol=1e-12)
  assert got[0][0] < 0.7 < got[0][1]  # noising the 0.3 mix: 0.7
