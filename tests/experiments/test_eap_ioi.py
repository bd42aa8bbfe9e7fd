"""The EAP-on-IOI experiment's own logic: the seeded split, the
hand-built circuit as edges (counted by hand), random circuits, heads
ranked by their edges, the overlap, the faithfulness curve against the
library's `eap.faithfulness_curve` and a linear known answer, and the
smoke run end to end with its report rendered again from results.json
(the committed report regenerates in tests/measure/test_templates.py).
"""

from __future__ import annotations

import json
import pathlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.eap_ioi import circuits
from experiments.eap_ioi import report
from experiments.eap_ioi import run
from mha_jax.interp import eap
from mha_jax.interp import eap_graph
from mha_jax.measure import bootstrap
from mha_jax.measure import report as report_lib
from mha_jax.models.transformer import DecoderLM

import entry_points
import random_decoder

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _graph(**overrides):
  """2 layers, 2 query heads on 1 kv head, MLPs: 36 edges
  (tests/interp/test_eap.py counts them)."""
  config = random_decoder.config(**({"num_kv_heads": 1,
                                     "attention_only": False,
                                     "mlp_dim": 16} | overrides))
  return eap_graph.graph(nnx.eval_shape(lambda: DecoderLM(
      config, rngs=nnx.Rngs(0))))


def test_split_is_disjoint_seeded_and_refuses_too_many():
  a, b = circuits.split(128, 64, 64, seed=0)
  assert len(a) == len(b) == 64 and not set(a) & set(b)
  assert sorted(set(a) | set(b)) == list(range(128))
  a2, b2 = circuits.split(128, 64, 64, seed=0)
  assert (a == a2).all() and (b == b2).all()
  a3, _ = circuits.split(128, 64, 64, seed=1)
  assert not (a == a3).all()
  # The first `score` of the seed's permutation, sorted.
  order = np.random.default_rng(0).permutation(128)
  assert (a == np.sort(order[:64])).all()
  with pytest.raises(ValueError, match="at most the 10 prompts, got 6 and 6"):
    circuits.split(10, 6, 6, seed=0)


def test_hand_built_heads_are_every_class_and_round():
  circuit = {"name_movers": {"heads": [[3, 1], [2, 0]]},
             "negative_movers": {"heads": [[3, 0]]},
             "paths": {"s_inhibition": {"heads": [[2, 0]]},
                       "output_kv": {"heads": [[1, 1]]},
                       "previous_token": {"skipped": "no receivers"}}}
  assert circuits.hand_built_heads(circuit) == [[1, 1], [2, 0], [3, 0],
                                                [3, 1]]


def test_the_committed_ioi_circuit_names_nine_heads():
  saved = json.loads((ROOT / "docs/results/ioi/results.json").read_text())
  heads = circuits.hand_built_heads(saved["circuits"]["smollm2"])
  assert heads == [[11, 6], [16, 0], [17, 2], [17, 4], [20, 0], [23, 3],
                   [24, 4], [29, 0], [29, 1]]


def test_head_mask_has_the_edges_counted_by_hand():
  """Heads {L1H0}: senders embed, MLP0, L1H0, MLP1; receivers L1H0.q,
  the kv head serving it (L1H0.k, L1H0.v, which also serves L1H1), MLP0,
  MLP1, logits. Edges: embed to all 6; MLP0 to L1's q, k, v, MLP1 and
  the logits (5); L1H0 to MLP1 and the logits (2); MLP1 to the logits
  (1): 14."""
  g = _graph()
  mask = circuits.head_mask(g, [[1, 0]], num_heads=2)
  assert mask.sum() == 14
  s, r = g.senders.index, g.receivers.index
  assert mask[s("embed"), r("L1H0.k")] and mask[s("MLP0"), r("L1H0.v")]
  assert not mask[s("embed"), r("L1H1.q")]  # a head not in the circuit
  assert not mask[s("L0H0"), r("MLP0")]
  assert not (mask & ~g.exists).any()
  # L1H1 is served by the same kv head: the same count, its own q.
  other = circuits.head_mask(g, [[1, 1]], num_heads=2)
  assert other.sum() == 14 and other[s("embed"), r("L1H0.k")]
  every = circuits.head_mask(g, [[l, h] for l in range(2) for h in range(2)],
                             num_heads=2)
  assert (every == g.exists).all()
  # Two kv heads: L1H0's k and v no longer serve L1H1's group.
  g2 = _graph(num_kv_heads=2)
  assert circuits.head_mask(g2, [[1, 0]], num_heads=2).sum() == 14


def test_random_masks_have_k_existing_edges_and_differ():
  g = _graph()
  m = circuits.random_masks(g, [1, 5, 20], draws=3, seed=0)
  assert m.shape == (3, 3) + g.shape
  assert (m.sum((2, 3)) == np.array([[1] * 3, [5] * 3, [20] * 3])).all()
  assert not (m & ~g.exists).any()
  assert not (m[2, 0] == m[2, 1]).all()
  assert (m == circuits.random_masks(g, [1, 5, 20], draws=3, seed=0)).all()


def test_heads_rank_by_the_summed_size_of_the_edges_they_send():
  g = _graph()
  scores = np.zeros(g.shape, np.float32)
  s, r = g.senders.index, g.receivers.index
  scores[s("L0H1"), r("logits")] = -3.0  # |score| counts, not its sign
  scores[s("L1H0"), r("logits")] = 1.0
  scores[s("L1H0"), r("MLP1")] = 1.5
  scores[s("MLP0"), r("logits")] = 9.0  # not a head
  ranked = circuits.ranked_heads(eap_graph.EdgeScores(jnp.asarray(scores),
                                                      g))
  assert [n for n, _ in ranked] == ["L0H1", "L1H0", "L0H0", "L1H1"]
  assert ranked[0][1] == 3.0 and ranked[1][1] == 2.5
  o = circuits.overlap(ranked, [[1, 0], [1, 1]], k=2)
  assert o == {"k": 2, "found": ["L1H0"], "missing": ["L1H1"],
               "ranks": {"L1H0": 2, "L1H1": 4}}


def test_a_linear_curve_has_known_areas_and_a_ratio_of_means():
  """Faithfulness equal to the fraction: CPR = CMD = 1/2. The ratio is of
  means: prompts with small differences do not dominate."""
  x = np.array([0.25, 0.5, 0.75])
  n = 8
  idx = bootstrap.draws(n, 200, 0)
  c = circuits.curve(np.outer(x, np.full(n, 2.0)), np.zeros(n),
                     np.full(n, 2.0), x, idx)
  np.testing.assert_allclose(c["faithfulness"], x)
  assert c["cpr"] == pytest.approx(0.5) and c["cmd"] == pytest.approx(0.5)
  assert c["cpr_ci95"][0] <= 0.5 <= c["cpr_ci95"][1]
  clean = np.array([1.0, 3.0])
  f = circuits.faithfulness(np.array([[0.5, 0.5]]), np.zeros(2), clean,
                            bootstrap.draws(2, 10, 0))
  assert f["value"][0] == pytest.approx(1.0 / 4.0)  # not (0.5 + 1/6) / 2
  with pytest.raises(ValueError, match="strictly inside"):
    circuits.curve(np.zeros((2, n)), np.zeros(n), np.ones(n), [0.0, 0.5],
                   idx)


def test_curve_agrees_with_the_librarys_faithfulness_curve():
  """The experiment assembles the curve from per-prompt metrics (for its
  intervals); on means it must be the library's CPR and CMD."""
  model = random_decoder.model(3, max_len=5, mlp_dim=16,
                               attention_only=False, num_kv_heads=1)
  rng = np.random.default_rng(0)
  clean, corrupted = (jnp.asarray(rng.integers(0, 10, (4, 5)))
                      for _ in range(2))
  end, io, s = (jnp.asarray(v) for v in ([4, 3, 4, 2], [1, 2, 3, 4],
                                         [5, 6, 7, 8]))
  per_prompt = run.per_prompt_metric(end, io, s)
  mean = lambda logits: jnp.mean(per_prompt(logits))
  n_edges = eap_graph.graph(model).num_edges
  fractions = [0.1, 0.3, 0.6]
  counts = [int(round(f * n_edges)) for f in fractions]

  @jax.jit  # one program each, not op by op
  def both():
    scores = eap.edge_scores(model, clean, corrupted, mean)
    m = eap.circuit_metric(model, clean, corrupted, per_prompt,
                           eap_graph.top_edges(scores, counts + [0]))
    lib = eap.faithfulness_curve(model, clean, corrupted, mean, scores,
                                 counts=[0] + counts + [n_edges])
    return m, per_prompt(model(clean)), {k: lib[k] for k in (
        "faithfulness", "cpr", "cmd")}

  m, m_clean, lib = both()
  mine = circuits.curve(m[:-1], m[-1], m_clean,
                        np.asarray(counts) / n_edges,
                        bootstrap.draws(4, 20, 0))
  np.testing.assert_allclose(mine["faithfulness"], lib["faithfulness"][1:-1],
                             rtol=1e-4, atol=1e-5)
  assert mine["cpr"] == pytest.approx(float(lib["cpr"]), abs=1e-4)
  assert mine["cmd"] == pytest.approx(float(lib["cmd"]), abs=1e-4)


def test_smoke_run_end_to_end(tmp_path):
  config = entry_points.config("eap_ioi")
  saved = entry_points.load("eap_ioi").run(config, tmp_path)
  e = config.experiment
  assert len(saved["prompts"]["score_idx"]) == e.score_prompts
  assert not set(saved["prompts"]["score_idx"]) & set(
      saved["prompts"]["eval_idx"])
  assert set(saved["timing"]) == {"eap", "eap-ig", "eap-ig_8"}
  for a in ("corrupted", "mean"):
    c = saved["curves"][a]
    assert len(c["random"]) == e.random_draws
    assert len(c["methods"]["eap-ig"]["faithfulness"]) == len(e.fractions)
    # Each size's circuit keeps that many edges: the per-prompt metric of
    # every circuit evaluated, on every held-out prompt.
    assert np.shape(c["per_prompt"]["random"]) == (
        len(e.fractions) * e.random_draws, e.eval_prompts)
  # The empty circuit under corrupted ablation is the ABC run.
  np.testing.assert_allclose(
      saved["curves"]["corrupted"]["m_empty"]["per_prompt"],
      saved["task"]["eval_abc"]["per_prompt"], rtol=1e-4, atol=1e-4)
  assert saved["hand_built"]["heads"] == [[1, 0], [1, 2]]
  text = (tmp_path / "report.md").read_text()
  rows = entry_points.table_by_label(text, "| ablation | circuits")
  assert "EAP-IG" in text and (tmp_path / "faithfulness.png").exists()
  ig = saved["curves"]["corrupted"]["methods"]["eap-ig"]
  assert f"{ig['cpr']:+.3f}" in text and rows
  assert report_lib.regenerate(tmp_path, report.render) == text

