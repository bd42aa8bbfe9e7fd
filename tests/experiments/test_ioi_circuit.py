"""Wang et al.'s criteria and the backup heads (experiments/ioi_circuit).

Known answers: the knockout against the library's own patch through the
model's own call; the criteria on an additive stand-in model, where
F(S) is a sum of the kept heads' weights and every criterion has a value
written down by hand; the backup search on a planted takeover; the
classes the committed ioi run names. Then the smoke run end to end.
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.ioi_circuit import report
from experiments.ioi_circuit import run
from experiments.ioi_task import circuit as circuit_lib
from experiments.ioi_task import forward
from experiments.ioi_task import knockout
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from mha_jax import hooks
from mha_jax.measure import bootstrap
from mha_jax.measure import report as report_lib

import entry_points

TOK = models.word_tokenizer()
PROMPTS = prompts.build(TOK, prompts.single_token_names(TOK),
                        per_template_order=1, seed=5)


def test_template_means_are_each_templates_own():
  # z = the template's value + an offset summing to 0 within the template.
  template = np.array([0, 0, 1, 1, 1, 2, 2])
  offsets = np.array([1.0, -1.0, 2.0, -0.5, -1.5, 3.0, -3.0])
  value = np.array([10.0, 20.0, 30.0])[template] + offsets
  z = np.broadcast_to(value[None, :, None, None, None], (2, 7, 3, 2, 1))
  means = knockout.template_means(z, template)
  np.testing.assert_allclose(means[1, :, 2, 1, 0],
                             [10, 10, 20, 20, 20, 30, 30], atol=1e-6)


def test_resample_partners_are_other_prompts_of_the_same_template():
  template = np.repeat(np.arange(4), [2, 3, 5, 8])
  for seed in range(5):
    partner = knockout.resample_partners(template, seed)
    assert sorted(partner) == list(range(len(template)))  # a permutation
    assert np.all(partner != np.arange(len(template)))
    np.testing.assert_array_equal(template[partner], template)
  with pytest.raises(ValueError, match="template 1 has 1 prompt"):
    knockout.resample_partners(np.array([0, 0, 1]), 0)


def test_knockout_is_the_librarys_patch_through_the_models_own_call():
  model, _, _ = models.load("tiny_llama")
  c = model.config
  tokens = jnp.asarray(PROMPTS["tokens"][:6])
  end, io, s = (jnp.asarray(PROMPTS[k][:6]) for k in ("end", "io", "s"))
  rng = np.random.default_rng(0)
  z = knockout.captured_z(model, tokens, end)
  replacement = jnp.asarray(rng.normal(size=z.shape), jnp.float32)
  knocked = [(0, 1), (1, 0), (1, 3)]
  keep = knockout.keep_mask((c.num_layers, c.num_heads), knocked)
  got = knockout.knocked_logit_diff(model, tokens, end, io, s, replacement,
                                    jnp.asarray(keep))
  patch = {}
  for l in range(c.num_layers):
    heads = [h for ll, h in knocked if ll == l]
    patch |= hooks.replace(f"blocks.{l}.attn.z", replacement[l],
                           heads=heads)
  logits = model(tokens, patch=patch)[jnp.arange(6), end]
  np.testing.assert_allclose(got, forward.logit_diff(logits, io, s),
                             rtol=1e-5, atol=1e-5)
  # Keeping every head is the unpatched model.
  full = knockout.knocked_logit_diff(
      model, tokens, end, io, s, replacement,
      jnp.ones((c.num_layers, c.num_heads), bool))
  np.testing.assert_allclose(
      full, forward.logit_diff(model(tokens)[jnp.arange(6), end], io, s),
      rtol=1e-5, atol=1e-5)


# An additive stand-in: F(S) per prompt is a_n times the kept heads'
# weights w plus, under resampling, the knocked heads' weights u.
SHAPE = (3, 4)
W = np.arange(1.0, 13.0).reshape(SHAPE)
U = np.full(SHAPE, 0.5)
A = np.array([1.0, 2.0, 3.0, 2.0])
CLASSES = {"output heads": [[2, 1], [2, 3]], "S-inhibition": [[1, 0]]}


def _additive(replacement, keep):
  return A * ((keep * W).sum() + replacement * ((~keep) * U).sum())


def _experiment(**kw):
  return ml_collections.ConfigDict(dict(
      random_circuits=6, random_subsets=3, seed=0, backup_top=2) | kw)


def test_criteria_on_an_additive_model_have_their_known_values():
  idx = bootstrap.draws(4, 20, 0)
  weights, _ = bootstrap.group_weights([0, 0, 1, 1], resamples=20, seed=0)
  got = run.criteria(_additive, {"mean": 0.0, "resample": 1.0}, CLASSES,
                     SHAPE, _experiment(), idx, weights)
  circuit = [(1, 0), (2, 1), (2, 3)]
  w_c = sum(W[x] for x in circuit)
  assert got["circuit"] == [list(x) for x in circuit] and got["size"] == 3
  assert got["full"]["mean"] == pytest.approx(2.0 * W.sum())
  assert got["empty"]["mean"] == pytest.approx(0.0)
  assert got["mean"]["fraction"]["value"] == pytest.approx(w_c / W.sum())
  # Resampling adds the 9 knocked heads' u = 0.5 each.
  assert got["resample"]["circuit"]["mean"] == pytest.approx(
      2.0 * (w_c + 4.5))
  for draw in got["random"]["draws"]:
    assert not set(map(tuple, draw["heads"])) & set(circuit)
    assert draw["fraction"] == pytest.approx(
        sum(W[tuple(x)] for x in draw["heads"]) / W.sum())
  # Completeness: F(C \ K) - F(M \ K) = -(weights outside C), every K.
  assert len(got["completeness"]) == 2 + 3
  for c in got["completeness"]:
    assert 0 < len(c["heads"]) < 3
    assert c["difference"]["mean"] == pytest.approx(
        -2.0 * (W.sum() - w_c))
  subsets = [frozenset(map(tuple, c["heads"])) for c in got["completeness"]]
  assert len(set(subsets)) == len(subsets)  # each K tried once
  assert got["completeness_worst"]["fraction"] == pytest.approx(
      (W.sum() - w_c) / W.sum())
  # Minimality: removing v changes F by its own weight, whatever K.
  for row in got["minimality"]:
    for k in row["k"]:
      assert k["change"]["mean"] == pytest.approx(2.0 * W[tuple(row["head"])])
  # Of a 3-head circuit's 6 proper subsets, 2 are classes: 4 are left.
  more = run.criteria(_additive, {"mean": 0.0, "resample": 1.0}, CLASSES,
                      SHAPE, _experiment(random_subsets=10), idx, weights)
  assert len(more["completeness"]) == 6
  movers = next(r for r in got["minimality"] if r["head"] == [2, 1])
  assert [k["heads"] for k in movers["k"]] == [[], [[2, 3]]]


def test_backup_finds_the_planted_takeover_on_held_out_prompts():
  rng = np.random.default_rng(1)
  base = rng.normal(size=(10,) + SHAPE)
  knocked = [(2, 1)]

  def dla(keep):
    out = base.copy()
    if not keep[2, 1]:
      out[:, 1, 2] += 2.0  # L1H2 takes over
      out[:, 0, 0] += 0.5
    return out

  got = run.backup(dla, knocked, SHAPE, _experiment(),
                   bootstrap.draws(5, 20, 0))
  assert [r["head"] for r in got["heads"]] == [[1, 2], [0, 0]]
  assert got["heads"][0]["change"]["mean"] == pytest.approx(2.0)
  assert got["heads"][0]["change"]["ci95"] == pytest.approx([2.0, 2.0])
  np.testing.assert_allclose(got["heads"][0]["before"]["per_prompt"],
                             base[1::2, 1, 2])
  np.testing.assert_allclose(got["knocked_direct_before"]["per_prompt"],
                             base[1::2, 2, 1])
  assert got["others_change"]["mean"] == pytest.approx(2.5)


def test_classes_are_read_from_the_committed_ioi_run():
  e = ml_collections.ConfigDict(dict(
      models=("smollm2", "gemma3"), circuit_source="ioi",
      circuit_results="docs/results/ioi/results.json",
      circuits=ml_collections.ConfigDict()))
  got = run.circuits_of(e)
  # docs/results/ioi/report.md names these.
  assert got["smollm2"]["output heads"] == [[23, 3], [29, 1]]
  assert got["smollm2"]["previous-token"] == [[16, 0]]
  assert "S-inhibition" not in got["gemma3"]  # that round found none
  assert len(circuit_lib.union(got["smollm2"])) == 9
  # The name movers ioi_output_heads confirmed are knocked out too.
  e.name_mover_results = "docs/results/ioi_output_heads/results.json"
  assert run.backup_groups(e, "smollm2", got["smollm2"]) == [
      ("output heads", [[23, 3], [29, 1]]),
      ("name movers (ioi_output_heads)", [[23, 0], [23, 2], [23, 7]])]
  assert run.backup_groups(e, "gemma3", got["gemma3"]) == [
      ("output heads", [[11, 3]])]
  e.circuits.smollm2 = {"name_mover": [[1, 1]]}
  with pytest.raises(ValueError, match="`circuits.smollm2` may name"):
    run.circuits_of(e)
  e.circuit_source = "16 prompts"
  with pytest.raises(ValueError, match="`circuit_source` must be one of"):
    run.circuits_of(e)


def test_held_out_classes_are_the_confirmed_groups_of_both_runs():
  e = ml_collections.ConfigDict(dict(
      models=("smollm2", "gemma3"), circuit_source="held_out",
      name_mover_results="docs/results/ioi_output_heads/results.json",
      classes_results="docs/results/ioi_classes/results.json",
      circuits=ml_collections.ConfigDict()))
  got = run.circuits_of(e)
  # docs/results/ioi_output_heads/report.md and ioi_classes/report.md
  # name these; Gemma's name-mover group is empty, so its output heads
  # are its S suppressor alone.
  assert got["smollm2"] == {
      "output heads": [[23, 0], [23, 2], [23, 7], [23, 3]],
      "negative output heads": [[29, 0], [24, 4], [24, 5]],
      "S-inhibition": [[20, 0], [19, 2]],
      "induction / duplicate-token": [[17, 4]],
      "previous-token": [[16, 0]]}
  assert got["gemma3"]["output heads"] == [[11, 3]]
  assert got["gemma3"]["S-inhibition"] == [[9, 3], [10, 0], [9, 2],
                                           [10, 1], [10, 2]]
  assert len(circuit_lib.union(got["gemma3"])) == 12


def test_a_group_not_confirmed_is_left_out_of_the_held_out_circuit():
  output = {"models": {"m": {"groups": {
      "name_movers": {"heads": [[3, 1]], "confirmed": False},
      "s_suppressors": {"heads": [[3, 2]], "confirmed": True},
      "negative": {"heads": [], "confirmed": None}}}}}
  upstream = {"models": {"m": {"rounds": {
      "s_inhibition": {"heads": [[2, 0]], "confirmed": True},
      "induction_duplicate": {"heads": [[1, 1]], "confirmed": False}}}}}
  assert circuit_lib.held_out_classes(output, upstream, "m") == {
      "output heads": [[3, 2]], "S-inhibition": [[2, 0]]}
  with pytest.raises(ValueError, match=r"classes results hold \[\], not 'm'"):
    circuit_lib.held_out_classes(output, {"models": {}}, "m")


def test_smoke_run_end_to_end(tmp_path):
  config = entry_points.config("ioi_circuit")
  saved = entry_points.load("ioi_circuit").run(config, tmp_path)
  m = saved["models"]["tiny_llama"]
  assert m["num_prompts"] == 32 and m["size"] == 3
  assert len(m["random"]["draws"]) == 3
  assert [b["group"] for b in m["backup"]] == ["output heads"]
  text = (tmp_path / "report.md").read_text()
  assert "Smoke run" in text
  assert report_lib.regenerate(tmp_path, report.render) == text


def test_the_committed_run_on_the_16_prompt_circuit_regenerates():
  """docs/results/ioi_circuit/ioi16 (the ioi run's classes, beside the
  main run's held-out classes) renders again from its results.json, with
  the command it names."""
  folder = pathlib.Path(__file__).resolve().parents[2] / (
      "docs/results/ioi_circuit/ioi16")
  saved = json.loads((folder / "results.json").read_text())
  assert saved["config"]["experiment"]["circuit_source"] == "ioi"
  command = report_lib.command_line(
      ["", "--workdir=runs/ioi_circuit_ioi16",
       "--config.experiment.circuit_source=ioi"], "experiments.ioi_circuit")
  assert report_lib.regenerate(
      folder, functools.partial(report.render, command=command)) == (
          folder / "report.md").read_text()
