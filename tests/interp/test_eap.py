"""Edge attribution patching (`eap`, `eap_graph`).

Known answers: the edges of a small graph counted by hand; the
hand-wired induction circuit of `tests/wired_circuit.py`, whose only
paths are known; the full and empty circuits (the clean and the ablated
runs, the mean-ablated one built here with plain activation patches);
one edge removed against `patching.path_patching_grid`, which recomputes
a receiver's input its own way; the first-order estimate where the
metric is linear in the receiver's stream (exact there); and the
completeness of integrated gradients (the embedding's scores sum to the
metric's difference as the steps grow).
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp_stats

from mha_jax.interp import eap
from mha_jax.interp import eap_graph
from mha_jax.interp import patching
from mha_jax.models.transformer import DecoderLM
from mha_jax.models.transformer import Encoder

import random_decoder
import wired_circuit as wc


def _config(**overrides):
  return random_decoder.config(**({"max_len": 5, "mlp_dim": 16}
                                  | overrides))


def _random_model(seed=3, **overrides):
  return random_decoder.model(seed, **({"max_len": 5, "mlp_dim": 16}
                                       | overrides))


def _abstract(**overrides):
  """Shapes only: enough for the graph and the refusals."""
  return nnx.eval_shape(lambda: DecoderLM(_config(**overrides),
                                          rngs=nnx.Rngs(0)))


def _tokens(seed=0, b=3, t=5):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.integers(0, 10, (b, t))) for _ in range(3)]


# The graph.


def test_a_small_graph_has_the_edges_counted_by_hand():
  """2 layers, 2 query heads sharing 1 kv head, MLPs. Receivers: per
  layer q 2, k 1, v 1, MLP 1, then the logits: 11. Edges: the embedding
  to all 11; each layer-0 head to MLP0, layer 1's 5 and the logits (7);
  MLP0 to layer 1's 5 and the logits (6); each layer-1 head to MLP1 and
  the logits (2); MLP1 to the logits (1): 11 + 14 + 6 + 4 + 1 = 36. In a
  parallel block the MLP reads the block's input: 4 edges fewer."""
  g = eap_graph.graph(_abstract(num_kv_heads=1, attention_only=False))
  assert g.senders == ("embed", "L0H0", "L0H1", "MLP0", "L1H0", "L1H1",
                       "MLP1")
  assert g.receivers == ("L0H0.q", "L0H1.q", "L0H0.k", "L0H0.v", "MLP0",
                         "L1H0.q", "L1H1.q", "L1H0.k", "L1H0.v", "MLP1",
                         "logits")
  ex = g.exists
  assert g.num_edges == 36 and ex.shape == (7, 11)
  assert ex[0].all() and ex[:, -1].all()
  assert not ex[1:, :4].any()  # nothing reaches layer 0's heads
  assert ex[1:3, 4].all() and not ex[3, 4]  # heads, not MLP0, -> MLP0
  assert not ex[4:, 5:9].any()  # no head reaches its own layer's heads
  parallel = eap_graph.graph(_abstract(num_kv_heads=1, attention_only=False,
                                       parallel_block=True))
  assert parallel.num_edges == 32 and not parallel.exists[1:3, 4].any()
  only_attn = eap_graph.graph(_abstract())
  # Receivers 2 x (2 + 2 + 2) + 1; edges 13 + 2 x 7 + 2 x 1.
  assert len(only_attn.receivers) == 13 and only_attn.num_edges == 29


# The wired induction circuit.


@functools.partial(jax.jit, static_argnums=0)
def _wired(graphdef, state, pairs):
  """EAP and EAP-IG scores, and the exact metric change of removing each
  edge alone from the full circuit (noising: corrupted into clean)."""
  model = nnx.merge(graphdef, state)
  args = (model, pairs["inputs"], pairs["corrupted"],
          patching.logprob_metric(pairs["targets"], pairs["loss_mask"]))
  exists = eap_graph.graph(model).exists
  masks = jnp.asarray(np.stack([exists & (np.arange(exists.size) != i
                                          ).reshape(exists.shape)
                                for i in np.flatnonzero(exists)]))
  m_clean, m_corrupt = patching.reference_metrics(*args)
  return (eap.edge_scores(*args), eap.edge_scores(*args, method="eap-ig",
                                                  steps=16),
          eap.circuit_metric(*args, masks) - m_clean, m_clean - m_corrupt)


# What each corruption breaks (wired_circuit's docstring), as edges: the
# previous-token head L0H0 reads the token before through its values and
# writes it where the induction head L1H1's keys read it; L1H1's values
# (first copy) and queries (second copy) read the embedding; L1H1 writes
# the prediction, which the logits read.
_KNOWN = {"first_copy": {("embed", "L0H0.v"), ("L0H0", "L1H1.k"),
                         ("embed", "L1H1.v"), ("L1H1", "logits")},
          "key": {("embed", "L0H0.v"), ("L0H0", "L1H1.k"),
                  ("L1H1", "logits")},
          "value": {("embed", "L1H1.v"), ("L1H1", "logits")},
          "second_copy": {("embed", "L1H1.q"), ("L1H1", "logits")}}


@pytest.mark.parametrize("kind", list(_KNOWN))
def test_the_wired_circuit_is_found_and_exactly_its_edges_matter(kind):
  pairs = wc.pairs(kind)
  scores, ig, removed, diff = _wired(*nnx.split(wc.build()), pairs)
  g = scores.graph
  edges = [(g.senders[s], g.receivers[r]) for s, r in np.argwhere(g.exists)]
  removed = dict(zip(edges, np.asarray(removed)))
  known = _KNOWN[kind]
  assert diff > 4.0
  # Exact: removing a known edge alone removes all of the behaviour (each
  # is needed: an AND); removing any other edge changes nothing.
  for edge, change in removed.items():
    want = -float(diff) if edge in known else 0.0
    np.testing.assert_allclose(change, want, atol=1e-3, err_msg=str(edge))
  # EAP-IG ranks the known edges first, all with the sign of a loss, and
  # every other edge far below them.
  top = eap_graph.ranked_edges(ig)
  assert {(s, r) for s, r, _ in top[:len(known)]} == known, top[:6]
  assert all(v < 0 for _, _, v in top[:len(known)])
  assert abs(top[len(known)][2]) < 0.1 * abs(top[len(known) - 1][2])
  # L1H0 writes nothing: its receivers have no gradient, its output no
  # change; both methods score its edges exactly 0.
  for sc in (scores, ig):
    values = np.asarray(sc.scores)
    cols = [i for i, name in enumerate(g.receivers) if name[:5] == "L1H0."]
    assert np.all(values[:, cols] == 0.0)
    assert np.all(values[g.senders.index("L1H0")] == 0.0)
  # The induction head's softmax is saturated (one-hot to float
  # precision), so EAP's gradient at the clean run misses the K-composition
  # edge that IG's points on the way from the corrupted run find.
  if ("L0H0", "L1H1.k") in known:
    k_edge = np.asarray(scores.scores)[g.senders.index("L0H0"),
                                       g.receivers.index("L1H1.k")]
    assert abs(k_edge) < 1e-3


# Random models: exact evaluation against path patching, the full and
# empty circuits, the estimates against exact patching.

_MODELS = {
    # Attention only, no final LayerNorm: the logits are linear in the
    # final stream, and with `logit_metric` so is the metric.
    "linear_readout": dict(final_ln=False),
    # GQA (4 query heads, 2 kv heads) with MLPs and a final LayerNorm.
    "gqa_mlp": dict(num_heads=4, num_kv_heads=2, attention_only=False),
    # GQA with parallel blocks (GPT-NeoX): each MLP reads its block's input.
    "parallel": dict(num_heads=4, num_kv_heads=2, attention_only=False,
                     parallel_block=True, positions="rotary"),
}


_ESTIMATED = ("linear_readout", "gqa_mlp")


def _removals(graph, edges):
  """`[N, S, R]` full masks less one edge each."""
  full = graph.exists
  out = np.repeat(full[None], len(edges), axis=0)
  for i, (s, r) in enumerate(edges):
    out[i, graph.senders.index(s), graph.receivers.index(r)] = False
  return jnp.asarray(out)


def _path_edges(config):
  """Every edge path_patching_grid scores: the layer-0 heads and the
  embedding into layer 1's q, k, v (kv heads for k, v) and the logits."""
  n_kv = config.num_kv_heads or config.num_heads
  senders = [f"L0H{h}" for h in range(config.num_heads)] + ["embed"]
  out = []
  for s in senders:
    out += [(s, f"L1H{h}.q") for h in range(config.num_heads)]
    out += [(s, f"L1H{j}.{x}") for x in "kv" for j in range(n_kv)]
    out.append((s, "logits"))
  return out


def _grid_metrics(grid, config, m_clean, m_corrupt):
  """The grid's noising scores as metrics, in `_path_edges`' order."""
  rows = []
  for s in range(config.num_heads + 1):
    pre = "" if s < config.num_heads else "embed_"
    for x in ("q", "k", "v"):
      rows += list(grid[pre + x][s] if not pre else grid[pre + x])
    rows.append(grid["logits"][s] if not pre else grid["embed_logits"])
  return m_clean - np.asarray(rows) * (m_clean - m_corrupt)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _random_report(graphdef, state, clean, corrupted, targets, name):
  model = nnx.merge(graphdef, state)
  metric = patching.logit_metric(targets, jnp.ones(targets.shape))
  args = (model, clean, corrupted, metric)
  graph = eap_graph.graph(model)
  exists = jnp.asarray(graph.exists)
  edges = _path_edges(model.config)
  every = [(graph.senders[s], graph.receivers[r])
           for s, r in np.argwhere(graph.exists)]
  estimated = name in _ESTIMATED  # then every edge is also removed alone
  # One lax.map: the full and empty masks, the paths, every edge.
  removed = eap.circuit_metric(*args, jnp.concatenate(
      [jnp.stack([exists, ~exists]), _removals(graph, edges)]
      + ([_removals(graph, every)] if estimated else [])))
  ref = patching.reference_metrics(*args)
  # As many rows as the batch: averaged over the wrong axis, the means
  # would still broadcast (and differ).
  mean_over = jnp.concatenate([clean[:1], corrupted[1:]])
  mean = eap.circuit_metric(model, clean, None, metric,
                            jnp.stack([exists, ~exists]), ablation="mean",
                            mean_inputs=mean_over)
  out = dict(
      ref=ref, full_empty=removed[:2], path=removed[2:2 + len(edges)],
      grid=patching.path_patching_grid(*args, sender_layer=0,
                                       receiver_layer=1, noising=True),
      mean_full=mean[0], mean_empty=mean[1])
  if estimated:
    out.update(singles=removed[2 + len(edges):] - ref[0],
               eap=eap.edge_scores(*args),
               ig1=eap.edge_scores(*args, method="eap-ig", steps=1),
               ig=eap.edge_scores(*args, method="eap-ig", steps=24))
  # Mean ablation of every edge = every sender's output replaced by its
  # mean, by plain activation patches of the sender sites.
  sites = eap._sender_sites(model.config)
  _, acts = model(mean_over, capture=sites)
  means = {s: jnp.broadcast_to(jnp.mean(acts[s], axis=0), acts[s].shape[1:])
           for s in sites}
  out["mean_patched"] = metric(model(clean, patch={
      s: (lambda v: lambda x: jnp.broadcast_to(v, x.shape))(v)
      for s, v in means.items()}))
  return out


@functools.lru_cache(maxsize=None)
def _report(name):
  clean, corrupted, targets = _tokens()
  model = _random_model(**_MODELS[name])
  return _random_report(*nnx.split(model), clean, corrupted, targets,
                        name), model.config


@pytest.mark.parametrize("name", list(_MODELS))
def test_full_and_empty_circuits_are_the_clean_and_ablated_runs(name):
  out, _ = _report(name)
  m_clean, m_corrupt = out["ref"]
  assert abs(m_clean - m_corrupt) > 0.1  # a real difference
  np.testing.assert_allclose(out["full_empty"], [m_clean, m_corrupt],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out["mean_full"], m_clean, rtol=1e-5, atol=1e-5)
  assert abs(out["mean_patched"] - m_clean) > 0.05
  np.testing.assert_allclose(out["mean_empty"], out["mean_patched"],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(_MODELS))
def test_one_edge_removed_is_path_patching_of_that_path(name):
  out, config = _report(name)
  want = _grid_metrics(out["grid"], config, *out["ref"])
  assert np.max(np.abs(want - out["ref"][0])) > 0.1  # some paths matter
  np.testing.assert_allclose(out["path"], want, rtol=1e-5, atol=1e-5)


def test_eap_is_exact_where_the_metric_is_linear_in_the_receiver():
  """No final norm, a logit metric: the metric is linear in the logits'
  stream, so every edge into the logits is estimated exactly."""
  out, _ = _report("linear_readout")
  exact, est = np.asarray(out["singles"]), out["eap"]
  g = est.graph
  into_logits = [i for i, (s, r) in enumerate(np.argwhere(g.exists))
                 if g.receivers[r] == "logits"]
  got = np.asarray(est.scores)[:, -1]
  assert len(into_logits) == len(g.senders)
  assert np.max(np.abs(exact[into_logits])) > 0.1
  np.testing.assert_allclose(got, exact[into_logits], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", _ESTIMATED)
def test_eap_agrees_with_exact_edge_patching_in_sign_and_rank(name):
  out, _ = _report(name)
  exact = np.asarray(out["singles"])
  est = np.asarray(out["eap"].scores)[out["eap"].exists]
  big = np.abs(exact) > 0.1 * np.max(np.abs(exact))
  assert big.sum() >= 5
  assert np.mean(np.sign(est[big]) == np.sign(exact[big])) >= 0.8
  assert sp_stats.spearmanr(est, exact).statistic > 0.7


@pytest.mark.parametrize("name", _ESTIMATED)
def test_eap_ig_with_one_step_is_eap_and_with_more_is_complete(name):
  """IG's points are at k / steps, k = 1..steps: one step is the clean
  run. The embedding reaches the metric only through the receivers, so
  its scores summed over them are the right Riemann sum of the metric's
  change along the straight line from the corrupted embedding to the
  clean one: m_x - m_c in the limit; EAP's sum is only its last slope."""
  out, _ = _report(name)
  np.testing.assert_allclose(out["ig1"].scores, out["eap"].scores,
                             rtol=1e-4, atol=1e-6)
  m_clean, m_corrupt = out["ref"]
  want = m_corrupt - m_clean
  err = {k: abs(float(np.sum(out[k].scores[0])) - want)
         for k in ("eap", "ig")}
  assert err["ig"] < 0.1 * abs(want)
  assert err["ig"] < 0.5 * err["eap"]


# The faithfulness curve.


@functools.partial(jax.jit, static_argnums=0)
def _wired_curves(graphdef, state, pairs):
  model = nnx.merge(graphdef, state)
  args = (model, pairs["inputs"], pairs["corrupted"],
          patching.logprob_metric(pairs["targets"], pairs["loss_mask"]))
  scores = eap.edge_scores(*args, method="eap-ig", steps=16)
  return (eap.faithfulness_curve(*args, scores, counts=[29, 0, 4]),
          eap.faithfulness_curve(*args, scores))


def test_the_wired_circuits_four_edges_are_all_of_its_faithfulness():
  """The top 4 edges of EAP-IG on the first copy are the known circuit:
  alone they restore the clean metric (faithfulness 1), none restores 0.
  Points (0, 0), (4/29, 1), (1, 1) by the trapezoidal rule: CPR =
  (4/29) / 2 + 25/29 = 27/29, CMD = (4/29) / 2 = 2/29."""
  counts, fractions = _wired_curves(*nnx.split(wc.build()),
                                    wc.pairs("first_copy"))
  np.testing.assert_array_equal(counts["counts"], [0, 4, 29])
  np.testing.assert_allclose(counts["fractions"], [0, 4 / 29, 1])
  np.testing.assert_allclose(counts["faithfulness"], [0, 1, 1], atol=1e-3)
  np.testing.assert_allclose(counts["cpr"], 27 / 29, atol=1e-3)
  np.testing.assert_allclose(counts["cmd"], 2 / 29, atol=1e-3)
  # MIB's fractions of 29 edges: 0 (x5), 1, 1, 3, 6, 14, 29 edges.
  np.testing.assert_array_equal(fractions["counts"],
                                [0] * 5 + [1, 1, 3, 6, 14, 29])
  curve = np.asarray(fractions["faithfulness"])
  np.testing.assert_allclose(curve[[0, -3, -2, -1]], [0, 1, 1, 1], atol=1e-3)
  assert 0 < fractions["cpr"] < 1 and fractions["cmd"] > 0


# Refusals.


def test_bad_inputs_are_refused_by_name():
  model = _abstract()
  x, y = jnp.zeros((2, 5), int), jnp.zeros((2, 4), int)
  metric = lambda logits: jnp.sum(logits)
  for placement in ("sandwich", "post"):
    bad = _abstract(norm_placement=placement)
    with pytest.raises(ValueError, match=f"norm_placement='{placement}'"):
      eap.edge_scores(bad, x, x, metric)
    with pytest.raises(ValueError, match="norm_placement"):
      eap.circuit_metric(bad, x, x, metric, np.ones((5, 13), bool))
  with pytest.raises(ValueError, match=r"same shape, got \(2, 5\) and "
                     r"\(2, 4\)"):
    eap.edge_scores(model, x, y, metric)
  with pytest.raises(ValueError, match=r"`steps` must be an int >= 1, got 0"):
    eap.edge_scores(model, x, x, metric, method="eap-ig", steps=0)
  with pytest.raises(ValueError, match="`method` must be one of"):
    eap.edge_scores(model, x, x, metric, method="ig")
  with pytest.raises(ValueError, match=r"`edge_mask` must be \[S, R\]=\[5, "
                     r"13\].*got shape \[13, 5\]"):
    eap.circuit_metric(model, x, x, metric, np.ones((13, 5), bool))
  with pytest.raises(ValueError, match="`mean_inputs`.*ablation='mean'"):
    eap.circuit_metric(model, x, x, metric, np.ones((5, 13), bool),
                       ablation="mean")
  with pytest.raises(ValueError, match=r"`mean_inputs` must be \[N, T=5"):
    eap.circuit_metric(model, x, None, metric, np.ones((5, 13), bool),
                       ablation="mean", mean_inputs=y)
  scores = eap_graph.EdgeScores(jnp.zeros((5, 13)), eap_graph.graph(model))
  with pytest.raises(ValueError, match=r"`counts` must lie in \[0, 29\]"):
    eap.faithfulness_curve(model, x, x, metric, scores, counts=[30])
  for other in (object(), nnx.eval_shape(lambda: Encoder(
      _config(vocab_size=10), rngs=nnx.Rngs(0)))):
    with pytest.raises(TypeError, match="must be a DecoderLM"):
      eap_graph.graph(other)
