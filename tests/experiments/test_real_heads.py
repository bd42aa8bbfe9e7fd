"""The real-heads experiment's pieces, each against a known answer.

The detectors and the ablation run on the hand-wired induction circuit
of tests/wired_circuit.py (layer 0 head 0 attends to the previous token,
layer 1 head 1 is the induction head, layer 0 head 1 writes where nothing
reads, layer 1 head 0 writes nothing), so what they must find is known.
The measures are checked against loops written here in NumPy; the MHA
twin's logits against the GQA model's, on tiny random models of both
families. One shared model per family; a few seconds in all.
"""

from __future__ import annotations

import json

import ml_collections
import numpy as np
import pytest

from experiments.real_heads import causal
from experiments.real_heads import distance
from experiments.real_heads import inputs
from experiments.real_heads import kv_twin
from experiments.real_heads import models
from experiments.real_heads import report
from experiments.real_heads import scores
from experiments.real_heads import survey
from experiments.real_heads import tables
from mha_jax.measure import bootstrap
from mha_jax.measure import report as report_lib
from mha_jax.sae import buffer

import entry_points
import wired_circuit as wc

WIRED = wc.build()
# [BOS, x, x]: 3 distinct tokens of 2..11 repeated, 7 of the model's 8.
REP = buffer.repeated_tokens(4, 3, (2, wc.V), seed=0, bos=wc.BOS)


def _reference(w, tokens, local):
  """The seven measures of `scores.MEASURES` by loops, `[7, B, H]`."""
  b, h, t, _ = w.shape
  out = np.zeros((7, b, h))
  for i in range(b):
    for j in range(h):
      acc = {k: [] for k in range(7)}
      for q in range(1, t):
        row = w[i, j, q]
        acc[0].append(row[q - 1])
        tgt = [k + 1 for k in range(q - 1) if tokens[i, k] == tokens[i, q]
               and k + 1 != q]
        if tgt:
          acc[1].append(row[tgt].sum())
        dup = [k for k in range(q) if tokens[i, k] == tokens[i, q]]
        if dup:
          acc[2].append(row[dup].sum())
        if q > local + 1:
          acc[3].append(row[0])
          acc[4].append(sum(row[k] for k in range(max(1, q - local), q + 1)))
          acc[5].append(sum(row[k] for k in range(1, q - local)))
        nz = row[row > 0]
        acc[6].append(-(nz * np.log(nz)).sum())
      for k in range(7):
        out[k, i, j] = np.mean(acc[k]) if acc[k] else 0.0
  return out


def test_layer_measures_equal_loops():
  rng = np.random.default_rng(0)
  b, h, t = 2, 3, 9
  logits = rng.normal(size=(b, h, t, t)) * 2
  logits = np.where(np.tril(np.ones((t, t)))[None, None] > 0, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
  tokens = rng.integers(0, 4, size=(b, t))  # small vocabulary: repeats
  got = scores.layer_measures_jit(w, tokens, np.arange(t) >= 1, local=2)
  np.testing.assert_allclose(np.asarray(got), _reference(w, tokens, 2),
                             atol=1e-5)


def test_uniform_floor_equals_loops():
  t = 7
  w = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
  want = _reference(w[None, None], REP[:1], 1)[:, 0, 0]
  got = scores.uniform(REP[:1], np.arange(t) >= 1, local=1)
  np.testing.assert_allclose([got[m][0] for m in scores.MEASURES], want,
                             atol=1e-6)


# The wired circuit through the experiment's own code: one survey pass.
SURVEY = scores.measure(WIRED, REP, np.arange(7) >= 1, chunk=2, local=1)


def test_detectors_find_the_wired_heads():
  s = SURVEY["scores"]
  ind = s["induction"].mean(0)
  prev = s["previous"].mean(0)
  assert survey.ranked(ind, "high")[0].tolist() == [1, 1]
  assert survey.ranked(prev, "high")[0].tolist() == [0, 0]
  assert ind[1, 1] > 0.99 and prev[0, 0] > 0.99
  # The current-token head puts nothing on the previous token.
  assert prev[0, 1] < 0.01


def _positions():
  return np.flatnonzero(inputs.second_copy(3))


def test_ablation_breaks_only_the_induction_head():
  zeros = scores.no_patch(WIRED, 7)[1]
  loss = lambda heads: causal.loss(WIRED, REP, _positions(), heads, zeros,
                                   chunk=2)
  clean = loss([])
  # L1H0 writes nothing (W_O = 0): removing it changes nothing. L0H1
  # writes where nothing reads, but its removal changes the stream's norm
  # under the final LayerNorm, so the logits' scale moves a little.
  np.testing.assert_allclose(loss([(1, 0)]), clean, atol=1e-6)
  assert (np.abs(loss([(0, 1)]) - clean) < 0.1).all()
  assert (loss([(1, 1)]) - clean > 1.0).all()
  assert (loss([(0, 0)]) - clean > 1.0).all()  # its keys' source


def test_attribution_is_zero_where_nothing_is_written():
  zeros = scores.no_patch(WIRED, 7)[1]
  est = causal.attribution(WIRED, REP, _positions(), zeros, chunk=2)
  assert est[1, 0] == 0
  # L1H1 writes straight into the logits it predicts: removing it lowers
  # the right logit, to first order too. (L0H0's estimate has no known
  # sign: its effect runs through L1H1's saturated softmax, where the
  # first order is poor, as Nanda's attribution-patching notes warn.)
  assert est[1, 1] > 0


def test_mean_z_is_the_mean_over_inputs_and_mean_ablation_uses_it():
  _, acts = WIRED(REP, capture=("blocks.1.attn.z",))
  np.testing.assert_allclose(SURVEY["mean_z"][1],
                             np.asarray(acts["blocks.1.attn.z"]).mean(0),
                             atol=1e-6)
  loss = lambda heads: causal.loss(WIRED, REP, _positions(), heads,
                                   SURVEY["mean_z"], chunk=2)
  clean = loss([])
  np.testing.assert_allclose(loss([(1, 0)]), clean, atol=1e-6)  # W_O = 0
  # The mean over 4 inputs keeps a quarter of each input's own copy in
  # L1H1's output: the loss rises, but less than with zeros.
  zero = causal.loss(WIRED, REP, _positions(), [(1, 1)],
                     scores.no_patch(WIRED, 7)[1], chunk=2)
  assert (loss([(1, 1)]) > clean + 0.3).all()
  assert (loss([(1, 1)]) < zero).all()


def test_random_sets_never_hold_an_excluded_head():
  named = [(0, 1), (2, 3), (1, 0)]
  sets = causal.random_sets(3, 4, 3, 200, seed=0, exclude=named)
  seen = {lh for s in sets for lh in s}
  assert not seen & set(named)
  assert seen == {(l, h) for l in range(3) for h in range(4)} - set(named)
  with pytest.raises(ValueError, match=r"random_sets: `k`=3 heads must be "
                     r"drawn from the 4 heads less the 2 of `exclude`, "
                     r"leaving 2"):
    causal.random_sets(1, 4, 3, 1, seed=0, exclude=[(0, 0), (0, 1)])


def test_random_sets_are_distinct_heads():
  sets = causal.random_sets(3, 4, 3, 50, seed=0)
  assert all(len(set(s)) == 3 for s in sets)
  assert {lh for s in sets for lh in s} == {(l, h) for l in range(3)
                                            for h in range(4)}


def test_selection_refuses_a_head_outside_the_model():
  with pytest.raises(ValueError, match=r"selection: head \(2, 0\) is outside "
                     r"the model's 2 layers x 2 heads"):
    causal.selection([(2, 0)], 2, 2)


def test_measure_refuses_uneven_chunks():
  with pytest.raises(ValueError, match=r"measure: the 4 inputs must split "
                     r"into chunks of `chunk`=3"):
    scores.measure(WIRED, REP, np.ones(7, bool), chunk=3, local=1)


def test_repeated_and_masks():
  x = buffer.repeated_tokens(3, 4, (10, 20), seed=0, bos=1)
  assert x.shape == (3, 9) and (x[:, 0] == 1).all()
  np.testing.assert_array_equal(x[:, 1:5], x[:, 5:])
  assert all(len(set(r[1:5])) == 4 for r in x)
  # Targets (token t + 1) of a length-3 copy: 6 of them.
  np.testing.assert_array_equal(inputs.second_copy(3),
                                [0, 0, 0, 0, 1, 1])
  np.testing.assert_array_equal(inputs.first_copy(3), [0, 1, 1, 0, 0, 0])


def test_at_distance_puts_the_copy_exactly_that_far_back():
  x = inputs.at_distance(2, 7, 3, (10, 40), 1, seed=0)
  assert x.shape == (2, 11)
  np.testing.assert_array_equal(x[:, 8:], x[:, 1:4])
  assert all(len(set(r[1:8])) == 7 for r in x)
  with pytest.raises(ValueError, match=r"at_distance: `distance`=2 must be "
                     r"at least `segment`=3 \(the copies would overlap\)"):
    inputs.at_distance(1, 2, 3, (10, 40), 1, seed=0)


def test_too_few_ids_for_distinct_tokens():
  with pytest.raises(ValueError, match=r"token_range: \[3, 5\) holds 2 ids, "
                     r"fewer than the 3 distinct ones a row needs"):
    buffer.repeated_tokens(1, 3, (3, 5), seed=0, bos=1)


def _bytes(texts):
  return [np.frombuffer(t.encode(), np.uint8).astype(np.int32)
          for t in texts]


DOCS = ("alpha beta gamma", "short", "delta epsilon zeta", "eta theta iota",
        "kappa lambda mu")


def test_prose_windows_start_documents_and_skip_is_disjoint(monkeypatch):
  monkeypatch.setattr(inputs, "prose_documents", lambda: DOCS)
  a = inputs.prose(_bytes, 2, 10, seed=0)
  b = inputs.prose(_bytes, 2, 10, seed=0, skip=2)
  got = {bytes(r.astype(np.uint8)).decode() for r in np.concatenate([a, b])}
  # The four documents of 10 bytes or more, cut to their first 10.
  assert got == {d[:10] for d in DOCS if len(d) >= 10}
  with pytest.raises(ValueError, match=r"prose: only 4 documents have 10 "
                     r"tokens; 5 were asked for"):
    inputs.prose(_bytes, 1, 10, seed=0, skip=4)


def test_intervals_sink_share_ranks_and_standout():
  v = np.zeros((4, 2, 3))
  v[:, 0, 1] = [0.5, 0.6, 0.7, 0.8]  # the one marked head
  v[:, 1, 2] = 0.4
  idx = bootstrap.draws(4, 200, 0)
  iv = survey.head_intervals(v, idx)
  assert iv["lo"][1, 2] == iv["hi"][1, 2] == 0.4
  assert 0.5 <= iv["lo"][0, 1] < 0.65 < iv["hi"][0, 1] <= 0.8
  sink = survey.sink_share(v, idx, 0.3)
  assert sink["share"] == pytest.approx(2 / 6)
  np.testing.assert_array_equal(survey.ranks(v.mean(0), "high"),
                                [[3, 1, 4], [5, 6, 2]])
  assert survey.ranks(v.mean(0), "low")[0, 1] == 6
  out = survey.standout(iv, 0.3, "high", 1)
  assert out == {"above_floor": 2, "top": [(0, 1)], "separated": True}
  assert not survey.standout(iv, 0.3, "high", 3)["separated"]
  assert survey.floor_of([0.1, 0.3, 0.2], "low") == 0.1


def test_verdict_words():
  assert tables.verdict((0.1, 0.2)) == "raises"
  assert tables.verdict((-0.2, -0.1)) == "lowers"
  assert tables.verdict((-0.1, 0.2)) == "not resolved"
  assert tables.change(0.5, (-0.1, 1.0)) == (
      "+0.50 [-0.10, 1.00] (not resolved)")


def test_head_sets_by_layer_kind():
  windows = [4, 4, None]
  ind = np.array([[0.1, 0.9], [0.5, 0.2], [1.0, 1.0]])
  sets = distance.head_sets(windows, 2, ind, 2, seed=0)
  assert sets["global_induction"] == [(2, 0), (2, 1)]
  assert sets["local_induction"] == [(0, 1), (1, 0)]
  # Two heads are in neither named set: the only draw of two is them.
  assert set(sets["random_0"]) == {(0, 0), (1, 1)}
  many = distance.head_sets(windows, 2, ind, 2, seed=0, draws=3)
  assert [k for k in many if k.startswith("random_")] == [
      "random_0", "random_1", "random_2"]
  assert distance.global_layer_heads(windows, 2) == [(2, 0), (2, 1)]
  with pytest.raises(ValueError, match=r"head_sets: the model needs both "
                     r"sliding and global layers, got windows \[None, "
                     r"None\]"):
    distance.head_sets([None, None], 2, ind[:2], 1, seed=0)


def _tiny(name):
  c = ml_collections.ConfigDict({"experiment": {"tiny_seed": 0}})
  return models.load(name, c)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gemma3"])
def test_mha_twin_has_equal_logits_and_h_over_k_the_cache(name):
  model, _, info = _tiny(name)
  twin = kv_twin.mha_twin(model)
  assert twin.config.num_kv_heads == info["heads"]
  ids = np.arange(3, 15)[None]  # 12 tokens: past the 4-token window
  np.testing.assert_allclose(np.asarray(twin(ids)), np.asarray(model(ids)),
                             atol=1e-5)
  # Keys and values, float32, every layer: 2 * L * K * Dh * 4 bytes.
  per = 2 * info["layers"] * info["head_dim"] * 4
  assert kv_twin.cache_bytes_per_token(model) == per * info["kv_heads"]
  assert kv_twin.cache_bytes_per_token(twin) == per * info["heads"]


def test_tiny_configs_and_floors():
  model, encode, info = _tiny("tiny_gemma3")
  assert info["windows"] == [4, None] and info["kv_heads"] == 1
  assert encode(["A"])[0].tolist() == [2, ord("A") + models.BYTE_OFFSET]
  shuffled = models.shuffled(model, 0)
  w, ws = (np.asarray(m.blocks[0].attn.w_q[...]) for m in (model, shuffled))
  assert not np.array_equal(w, ws)
  np.testing.assert_array_equal(np.sort(w.ravel()), np.sort(ws.ravel()))
  with pytest.raises(ValueError, match=r"tiny_config: `name` must be "
                     r"'tiny_llama' or 'tiny_gemma3', got 'tiny'"):
    models.tiny_config("tiny")
  with pytest.raises(ValueError, match=r"config.experiment.models: expected "
                     r"names of \('smollm2', 'gemma3', 'tiny_llama', "
                     r"'tiny_gemma3'\), got 'gpt2'"):
    models.load("gpt2", None)


def test_smoke_run_end_to_end(tmp_path):
  """Both tiny families through `python -m experiments.real_heads`'s own
  `run`: the files, the report regenerated from results.json, and the
  numbers with a known answer."""
  config = entry_points.config("real_heads")
  results = entry_points.load("real_heads").run(config, tmp_path)
  for name in ("tiny_llama_heads", "tiny_gemma3_heads",
               "tiny_gemma3_distance"):
    assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
  assert json.loads((tmp_path / "results.json").read_text()) == results
  assert report_lib.regenerate(tmp_path, report.render) == (
      tmp_path / "report.md").read_text()
  for name, r in results["models"].items():
    s = r["survey"]["scores"]
    total = sum(np.asarray(s[k]["per_input"]) for k in ("first", "local",
                                                        "long"))
    np.testing.assert_allclose(total, 1.0, atol=2e-4)  # saved to 4 places
    kv = r["kv"]
    assert kv["logit_max_abs_diff"] < 1e-5 and kv["same_tokens"]
    assert kv["mha"]["bytes_per_token"] == kv["gqa"]["bytes_per_token"] * (
        r["info"]["heads"] // r["info"]["kv_heads"])
  # The sliding layer's window is 4 tokens: at distance 4 it can see the
  # token after the earlier copy, at 12 it cannot (exactly 0).
  d = results["models"]["tiny_gemma3"]["distance"]
  assert d["distances"] == [4, 12]
  ind = np.asarray(d["induction"]).mean(1)  # [G, L, H]
  assert ind[0, 0].max() > 0 and ind[1, 0].max() == 0
