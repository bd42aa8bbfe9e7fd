"""The induction criterion and its controls on planted layers and
dictionaries: a layer whose head 0 is an exact induction head (it attends
to the token after the earlier copy on the second copy, to BOS on the
first) and a null layer with no induction (a previous-token head and a
uniform one), each an exact `z = pattern v`; dictionaries written by
hand, and a random one."""

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.sae import induction
from experiments.sae import report_controls
from experiments.sae import summaries
from mha_jax.sae import buffer

N, NREP, H, DV, V = 16, 6, 2, 4, 12
E = type("E", (), {"second_rate": 0.05, "second_ratio": 5.0,
                   "head_share": 0.5, "source_share": 0.5})()
CLAIM = induction.thresholds(E)


def _values():
  """Per head, each token's value: head 0's is u + 0.3 g_t (g orthogonal
  to u and u'), BOS's 0.8 u'; head 1's random."""
  rng = np.random.default_rng(0)
  v0 = np.zeros((V, DV))
  v0[:, 0] = 1.0
  v0[:, 2:] = 0.3 * rng.normal(size=(V, 2))
  v0[0] = [0.0, 0.8, 0.0, 0.0]
  return np.stack([v0, rng.normal(size=(V, DV))], 1)  # [V, H, Dv]


def _layer(tokens, induction_head: bool) -> dict:
  """The captured z, pattern, v of the planted layer on `tokens`."""
  n, t = tokens.shape
  first, second, source = induction.layout(t, NREP)
  pattern = np.zeros((n, H, t, t))
  for q in range(t):
    prev = max(q - 1, 0)
    if induction_head:
      pattern[:, 0, q, source[q] if second[q] else 0] = 1.0
      pattern[:, 1, q, prev] = 1.0
    else:
      pattern[:, 0, q, prev] = 1.0
      pattern[:, 1, q, :q + 1] = 1.0 / (q + 1)
  v = _values()[tokens]  # [N, T, H, Dv]
  z = np.einsum("nhts,nshd->nthd", pattern, v)
  return {f"blocks.1.attn.{s}": jnp.asarray(a, jnp.float32)
          for s, a in (("z", z), ("pattern", pattern), ("v", v))}


def _dictionary(columns, b_enc) -> dict:
  """An SAE whose encoder columns are `columns [F, D]` (decoder: the same
  rows), with `b_enc [F]` and b_dec 0."""
  w = np.asarray(columns, np.float32)
  w_dec = w / np.linalg.norm(w, axis=1, keepdims=True)
  return {"w_enc": jnp.asarray(w.T), "b_enc": jnp.asarray(b_enc, jnp.float32),
          "w_dec": jnp.asarray(w_dec), "b_dec": jnp.zeros(H * DV)}


def _planted() -> dict:
  """A: induction (reads u in head 0: off on BOS's value), B: copying
  (reads u and u', so it fires on both copies alike), C: reads head 1,
  D: induction, firing on about half the second copy (where g_t's first
  component is positive)."""
  a, b, c, d = np.zeros((4, H * DV))
  a[0] = 1.0
  b[0], b[1] = 1.0, 1.25
  c[DV:] = np.random.default_rng(1).normal(size=DV)
  d[0], d[2] = 1.0, 3.0
  return _dictionary([a, b, c, d], [-0.5, -0.5, 0.0, -1.0])


@pytest.fixture(scope="module")
def tokens():
  return buffer.repeated_tokens(N, NREP, (1, V), seed=0, bos=0)


def _detect(params, captured):
  return induction.detect(params, captured, 1, NREP, [0], E, kind="relu",
                          k=None, scale=1.0)


def test_planted_induction_feature_is_found_and_only_it(tokens):
  det = _detect(_planted(), _layer(tokens, induction_head=True))
  assert det["features"] == [0, 3]  # A and D
  assert det["copying"] == [0, 1, 3]  # B reads the same source, both copies
  # All of A, B and D's DFA comes from the induction source, summed where
  # they fire (D, firing on part of the copy, is where that matters).
  assert det["source_share"][[0, 1, 3]] == pytest.approx([1.0] * 3,
                                                         abs=1e-5)
  assert 0.2 < det["second_rate"][3] < 0.8
  assert det["head_share"][2] == pytest.approx(0.0, abs=1e-6)
  assert det["mean_first"][0] == 0.0 and det["mean_second"][0] > 0.4
  assert det["mean_second"][1] / det["mean_first"][1] == pytest.approx(
      1.0, abs=0.05)


def test_no_induction_layer_gives_nothing_to_the_same_dictionary(tokens):
  # A reads head 0, here a previous-token head: no DFA at the induction
  # source, so neither induction nor copying.
  det = _detect(_planted(), _layer(tokens, induction_head=False))
  assert det["features"] == [] and det["copying"] == []


def test_null_dictionary_gives_no_induction_features(tokens):
  # The controls' null: a random encoder and decoder (256 features, no
  # bias) on the layer without induction, at the claim's thresholds.
  rng = np.random.default_rng(2)
  params = _dictionary(rng.normal(size=(256, H * DV)), np.zeros(256))
  det = _detect(params, _layer(tokens, induction_head=False))
  assert det["features"] == [] and det["copying"] == []
  assert (det["second_rate"] > 0.05).sum() > 100  # they do fire
  rows = induction.sweep(det, CLAIM, {"second_ratio": (1.0, 5.0)})
  assert [r["induction"] for r in rows] == [0, 0]


def test_sweep_counts_known_answers():
  # Four features: rate, ratio (mean_first 1), head share, source share.
  stats = {"second_rate": np.array([0.5, 0.03, 0.5, 0.5]),
           "mean_second": np.array([6.0, 6.0, 2.0, 6.0]),
           "mean_first": np.ones(4),
           "head_share": np.array([0.9, 0.9, 0.9, 0.3]),
           "source_share": np.array([0.9, 0.9, 0.9, 0.9])}
  found, reads = induction.classify(stats, **CLAIM)
  assert found.tolist() == [True, False, False, False]
  assert reads.tolist() == [True, False, True, False]
  rows = induction.sweep(stats, CLAIM, {
      "second_rate": (0.01, 0.6), "second_ratio": (1.0, 7.0),
      "dfa_share": (0.2, 0.95)})
  got = [(r["threshold"], r["value"], r["induction"], r["copying"])
         for r in rows]
  assert got == [("second_rate", 0.01, 2, 3), ("second_rate", 0.6, 0, 0),
                 ("second_ratio", 1.0, 2, 2), ("second_ratio", 7.0, 0, 2),
                 ("dfa_share", 0.2, 2, 3), ("dfa_share", 0.95, 0, 0)]
  with pytest.raises(ValueError, match="grid"):
    induction.sweep(stats, CLAIM, {"l1": (1.0,)})



def test_sweep_summary_and_separation():
  runs = [{"kind": "topk", "induction": {"sweep": [
      {"threshold": "second_ratio", "value": 5.0, "induction": i,
       "copying": 10 * i}]}} for i in (1, 2, 3)]
  summ = summaries.sweep_per_kind(runs)["topk"][0]
  assert summ["induction"]["mean"] == 2.0
  assert summ["induction"]["std"] == pytest.approx(1.0)  # ddof 1
  assert summ["copying"]["values"] == [10.0, 20.0, 30.0]
  # The claim separates from a control only when every claim seed counts
  # more than every control seed: 10 against a control's 10 does not.
  control = [{"kind": "topk", "induction": {"sweep": [
      {"threshold": "second_ratio", "value": 5.0, "induction": 0,
       "copying": c}]}} for c in (0, 10, 3)]
  saved = {"model": {"layer": 1}, "sweep": summaries.sweep_per_kind(runs),
           "runs": runs, "controls": {"reinit": {
               "sweep": summaries.sweep_per_kind(control), "runs": control}}}
  assert report_controls.separated(saved) == []
  control[1]["induction"]["sweep"][0]["copying"] = 9
  saved["controls"]["reinit"]["sweep"] = summaries.sweep_per_kind(control)
  assert report_controls.separated(saved) == [("second_ratio", 5.0, "topk")]
  # The induction count on its own: claim 1, 2, 3 against a control's
  # 0, 0, 0 separates; a control seed at 1 ties the claim's lowest.
  assert report_controls.separated(saved, "induction") == [
      ("second_ratio", 5.0, "topk")]
  control[2]["induction"]["sweep"][0]["induction"] = 1
  saved["controls"]["reinit"]["sweep"] = summaries.sweep_per_kind(control)
  assert report_controls.separated(saved, "induction") == []


def test_controls_with_fewer_kinds_than_the_claim():
  # Trained controls of TopK only (SmolLM2's): a ReLU claim is compared
  # with the untrained control alone, the sweep table has no column for
  # a kind a control lacks, and the findings name only the runs there are.
  def runs(kind, counts):
    return [{"kind": kind, "seed": s, "induction": {
        "count": c, "copying_count": c, "sweep": [
            {"threshold": "dfa_share", "value": 0.9, "induction": c,
             "copying": c}]}} for s, c in enumerate(counts)]
  claim = runs("relu", (5, 6)) + runs("topk", (20, 25))
  untrained = runs("relu", (1, 2)) + runs("topk", (1, 3))
  layer0 = runs("topk", (30,))
  ctrl = lambda rs: {"sweep": summaries.sweep_per_kind(rs), "runs": rs}
  saved = {"model": {"layer": 17}, "runs": claim,
           "summary": {"relu": {}, "topk": {}},
           "sweep": summaries.sweep_per_kind(claim),
           "controls": {"layer0": ctrl(layer0), "untrained": ctrl(untrained)}}
  # ReLU: 5, 6 against the untrained 1, 2; TopK: 20, 25 against layer 0's 30.
  assert report_controls.separated(saved, "induction") == [
      ("dfa_share", 0.9, "relu")]
  table = report_controls.sweep_tables(saved)
  head = table.splitlines()[2]
  assert head.count("ReLU") == 2 and head.count("TopK") == 3
  lines = report_controls.controls_findings(saved)
  relu = next(x for x in lines if x.startswith("- Controls, ReLU"))
  assert "layer 0" not in relu and "SAEs before training 2, 1" not in relu
  assert "SAEs before training 1, 2 copying" in relu
  sep = next(x for x in lines if x.startswith("- The induction count"))
  assert "(ReLU + L1: against SAEs before training only)" in sep
  assert "DFA shares (heads, source) >= 0.9 (ReLU + L1)" in sep
  # What the controls share with the claim names each trained control
  # with fewer kinds or seeds, with its own.
  for c, rs in ((saved["controls"]["layer0"], layer0),
                (saved["controls"]["untrained"], untrained)):
    c["summary"] = {k: {} for k in ("relu", "topk") if any(
        r["kind"] == k for r in rs)}
  assert report_controls.same_settings(saved) == (
      "kinds, seeds, size, steps; layer 0 of the trained model: TopK with "
      "seed(s) 0 only")
  saved["controls"]["layer0"] = {**ctrl(claim), "summary": {
      "relu": {}, "topk": {}}}
  assert report_controls.same_settings(saved) == "kinds, seeds, size, steps"
  # Fewer kinds alone, then fewer seeds alone.
  saved["controls"]["layer0"] = {**ctrl(runs("topk", (1, 2))), "summary": {
      "topk": {}}}
  assert report_controls.same_settings(saved) == (
      "kinds, seeds, size, steps; layer 0 of the trained model: TopK only")
  saved["controls"]["layer0"] = {**ctrl(runs("relu", (1,)) + runs(
      "topk", (2,))), "summary": {"relu": {}, "topk": {}}}
  assert report_controls.same_settings(saved) == (
      "kinds, seeds, size, steps; layer 0 of the trained model: seed(s) 0 "
      "only")


def test_committed_reports_render_from_their_results():
  # Both committed reports (the induction model's and SmolLM2's)
  # regenerate from their results.json, each with its controls section.
  import pathlib

  from experiments.sae import report
  from mha_jax.measure import report as report_lib
  root = pathlib.Path(__file__).resolve().parents[2] / "docs/results/sae"
  # The command line is not in results.json, so it is left out here.
  drop = lambda t: [x for x in t.splitlines() if not x.startswith("Command:")]
  for folder in (root, root / "smollm2"):
    text = (folder / "report.md").read_text()
    assert drop(report_lib.regenerate(folder, report.render)) == drop(text)
    assert "| control |" in text
  # A run without controls says so instead of a table.
  import json
  saved = json.loads((root / "smollm2/results.json").read_text())
  saved.pop("controls")
  text = report.render(saved)
  assert "No controls were run for this model" in text
  assert "| control |" not in text


def test_reinitialised_loaded_model_keeps_config_and_redraws_weights():
  """The SmolLM2 control: the loaded model's class and config with its
  own initialiser's weights (not the loaded ones, not shared between
  seeds); an unknown source is refused by name."""
  import jax
  from flax import nnx
  from experiments.sae import sources
  from tests import random_decoder
  loaded = random_decoder.model(0)
  src = sources.Source(loaded, "loaded", [], [], None, 1.0)
  cfg = type("C", (), {"source": "smollm2"})()
  made = [sources.reinitialised(cfg, src, s).model for s in (7, 7, 8)]
  assert all(type(m) is type(loaded) and m.config == loaded.config
             for m in made)
  leaves = [jax.tree.leaves(nnx.state(m, nnx.Param)) for m in
            (loaded, *made)]
  differs = lambda a, b: any(not np.array_equal(x, y) for x, y in zip(a, b))
  assert differs(leaves[0], leaves[1]) and differs(leaves[1], leaves[3])
  assert not differs(leaves[1], leaves[2])  # one seed, one draw
  tokens = jnp.asarray([[1, 2, 3, 4]])
  assert made[0](tokens).shape == loaded(tokens).shape
  with pytest.raises(ValueError, match="config.source.*'tiny'"):
    sources.reinitialised(type("C", (), {"source": "tiny"})(), src, 1)


def test_dead_note_gives_the_average_features_firings_on_held_out():
  # 4,096 held-out tokens x L0 32 / 8,192 features = 16 firings of a
  # feature at the average rate; L0 48 gives 24.
  from experiments.sae import report
  saved = {"config": {"sae": {"d_sae": 8192, "dead_steps": 300,
                              "batch_size": 1024}},
           "data": {"eval_tokens": 4096},
           "runs": [{"l0": 48.0}, {"l0": 32.0}]}
  note = report._dead_note(saved)
  assert "L0 (32-48 of 8,192 features)" in note
  assert "fires on about 16-24 of the 4,096 held-out tokens" in note
  assert "silent for 300 steps of 1024 tokens" in note


def test_matched_directions_keep_each_heads_norm():
  rng = np.random.default_rng(3)
  w_enc = rng.normal(size=(H * DV, 10))
  w_enc[DV:, 4] = 0.0  # feature 4 reads head 0 only
  dirs = induction.matched_directions(w_enc, [4, 7], H, 50, seed=0)
  assert dirs.shape == (2, 50, H * DV)
  for i, f in enumerate((4, 7)):
    for h in range(H):
      block = slice(h * DV, (h + 1) * DV)
      np.testing.assert_allclose(np.linalg.norm(dirs[i, :, block], axis=-1),
                                 np.linalg.norm(w_enc[block, f]), atol=1e-12)
  assert np.all(dirs[0, :, DV:] == 0)
  # Different draws point different ways; one seed, one draw.
  assert np.abs(dirs[1, 0] - dirs[1, 1]).max() > 0.1
  np.testing.assert_array_equal(
      dirs, induction.matched_directions(w_enc, [4, 7], H, 50, seed=0))


def test_second_copy_excess_matches_numpy(tokens):
  cap = _layer(tokens, induction_head=True)
  z = np.asarray(cap["blocks.1.attn.z"], np.float64)
  params = _planted()
  params["b_dec"] = jnp.asarray(np.linspace(-0.2, 0.3, H * DV), jnp.float32)
  cols = np.random.default_rng(4).normal(size=(H * DV, 5))
  bias = np.array([0.0, -0.3, 0.2, -1.0, 0.5])
  first, second, _ = induction.layout(z.shape[1], NREP)
  x = z.reshape(*z.shape[:2], -1) * 2.0
  got = induction.second_copy_excess(params, jnp.asarray(x, jnp.float32),
                                     first, second,
                                     jnp.asarray(cols, jnp.float32),
                                     jnp.asarray(bias, jnp.float32))
  act = np.maximum((x - np.asarray(params["b_dec"], np.float64)) @ cols
                   + bias, 0)
  want = act[:, second].mean((0, 1)) - act[:, first].mean((0, 1))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_matched_null_on_planted_features(tokens):
  # A reads u, all the induction head writes on the second copy beyond
  # g_t: no direction of its norm on head 0 reads more, p = 1 / 100. B
  # also reads u' (BOS's value, the first copy) and D reads mostly g_t,
  # the token-dependent part: many directions of their norms on head 0
  # read more of u than they do, so neither is selective.
  z = _layer(tokens, induction_head=True)["blocks.1.attn.z"]
  got = induction.matched_null(_planted(), z, NREP, [0, 1, 3], draws=99,
                               seed=0, scale=1.0, alpha=0.05)
  assert got["p"][0] == pytest.approx(0.01)
  assert got["p"][1] > 0.5 and got["p"][2] > 0.2
  assert got["selective"] == 1
  assert got["excess"][0] == pytest.approx(0.5, abs=1e-6)  # 1 - 0.5 bias
  assert induction.matched_null(_planted(), z, NREP, [], draws=9, seed=0,
                                scale=1.0, alpha=0.05)["selective"] == 0


def test_matched_null_of_a_random_dictionary_is_calibrated(tokens):
  # A random dictionary's columns are themselves draws of the null, so
  # p is uniform on {1/20, ..., 1}: 5% get p <= 0.05 in expectation (256
  # features: 12.8, sd 3.5), on the induction layer as on the null one.
  rng = np.random.default_rng(5)
  params = _dictionary(rng.normal(size=(256, H * DV)), np.zeros(256))
  for induction_head in (True, False):
    z = _layer(tokens, induction_head)["blocks.1.attn.z"]
    got = induction.matched_null(params, z, NREP, list(range(256)),
                                 draws=19, seed=1, scale=1.0, alpha=0.05)
    assert 3 <= got["selective"] <= 26, got["selective"]
    assert 0.35 < np.mean(got["p"]) < 0.65


def test_null_section_and_findings_from_results():
  def run(kind, seed, cop, sel, ind, sel_ind):
    return {"kind": kind, "seed": seed, "induction": {
        "count": ind, "copying_count": cop, "sweep": [],
        "null": {"draws": 99, "alpha": 0.05, "selective": sel,
                 "selective_induction": sel_ind}}}
  claim = [run("topk", 0, 80, 40, 70, 35), run("topk", 1, 90, 45, 75, 38)]
  untrained = [run("topk", 0, 120, 7, 100, 5), run("topk", 1, 110, 4, 95, 3)]
  saved = {"model": {"layer": 17}, "runs": claim,
           "sweep": summaries.sweep_per_kind(claim),
           "controls": {"untrained": {
               "sweep": summaries.sweep_per_kind(untrained),
               "runs": untrained}}}
  text = report_controls.null_section(saved)
  assert "against 99 random directions" in text
  assert "| claim (layer 17) | TopK | 1 | 90 | 45 | 75 | 38 |" in text
  assert "| SAEs before training | TopK | 0 | 120 | 7 | 100 | 5 |" in text
  assert report_controls.null_findings(saved) == [
      "- Matched-direction null, TopK: selective features per seed: "
      "claim (layer 17) 35, 38 induction and 40, 45 copying; SAEs before "
      "training 5, 3 induction and 7, 4 copying."]
  # Results written before the null: the section says so, no finding.
  del untrained[1]["induction"]["null"]
  assert "Not measured" in report_controls.null_section(saved)
  assert report_controls.null_findings(saved) == []


def test_control_kinds_outside_the_claims_are_refused():
  from configs import sae as sae_config
  from experiments.sae import controls
  config = sae_config.get_config("smoke")
  config.experiment.kinds = ("topk",)
  config.experiment.control_kinds = ("relu",)
  with pytest.raises(ValueError, match=r"control_kinds: expected kinds the "
                     r"claim trains \('topk',\), got \('relu',\)"):
    controls.measure(config, None, None, {}, None)


def test_reinit_kinds_outside_the_claims_are_refused():
  from configs import sae as sae_config
  from experiments.sae import controls
  config = sae_config.get_config("smoke")
  config.experiment.reinit_kinds = ("jumprelu",)
  with pytest.raises(ValueError, match=r"reinit_kinds: expected kinds the "
                     r"claim trains \('relu', 'topk', 'batchtopk'\), got "
                     r"\('jumprelu',\)"):
    controls.measure(config, None, None, {}, None)


def test_saved_measures_are_keyed_by_what_they_depend_on():
  """The key of one SAE's saved measures: the fields that only choose
  which SAEs run leave it alone; a measure setting, the parameters, the
  activations or the training seconds change it."""
  import numpy as np
  from configs import sae as sae_config
  from experiments.sae import per_sae
  config = sae_config.get_config("smoke")
  cfg = per_sae.sae_config(config, "topk", 0)
  rng = np.random.default_rng(0)
  params = {"w_enc": rng.normal(size=(4, 6)), "b_enc": np.zeros(6),
            "w_dec": rng.normal(size=(6, 4)), "b_dec": np.zeros(4)}
  def data(acts):
    return {"acts": acts, "evals": acts[:2], "site": "blocks.1.attn.z",
            "layer": 1, "prefix": "", "induction_heads": [0, 1]}
  acts = rng.normal(size=(8, 4))
  key = lambda c=config, p=params, d=None, t=1.5: per_sae.measure_key(
      c, d or data(acts), p, cfg, t, "z")
  base = key()
  for field, value in (("seeds", (5, 6)), ("kinds", ("relu",)),
                       ("control_seeds", (0, 1, 2)), ("reinit_seeds", (3,)),
                       ("top_contexts", 1), ("cache_measures", False)):
    changed = sae_config.get_config("smoke")
    changed.experiment[field] = value
    assert key(c=changed) == base, field
  changed = sae_config.get_config("smoke")
  changed.experiment.null_draws = 7
  assert key(c=changed) != base
  assert key(p={**params, "b_enc": np.ones(6)}) != base
  assert key(d=data(acts + 1e-6)) != base
  assert key(t=None) != base  # the untrained SAE of the same seed
