"""The IOI upstream-class experiment: on the hand-wired IOI circuit
(tests/wired_ioi.py: L0H0 duplicate-token, L1H0 S-inhibition, L2H0 name
mover) each round must find its one head, confirm it on the held-out
half against random sets that hold no class head, and stop where the
circuit ends; path patching of a set of heads; the receivers under GQA;
the output heads read from the ioi_output_heads run; the smoke run end to
end."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from configs import ioi_classes as ioi_classes_config
from experiments.ioi_classes import report
from experiments.ioi_classes import run
from experiments.ioi_task import forward
from experiments.ioi_task import halves
from experiments.ioi_task import paths
from experiments.ioi_task import prompts
from mha_jax.measure import report as report_lib

import entry_points
from wired_ioi import NAMES, TOK, wired_ioi

WIRED = wired_ioi()
# 48 prompts; three per template and order split 2 / 1, so that the two
# halves differ in size (the wired circuit gives every prompt of a
# template and order the same numbers, so equal halves would look alike).
P = prompts.build(TOK, NAMES, per_template_order=3, seed=3)
SPLIT = halves.split(P["template"], P["order"], share=0.5, seed=0)
NAME_IDS = [NAMES[n] for n in P["names"]]


def _config(**overrides):
  e = ioi_classes_config.get_config("smoke").experiment
  e.random_groups = 20  # p can reach 1 / 21 < 0.05
  e.update(overrides)
  return e


@pytest.fixture(scope="module")
def wired():
  return run.study(WIRED, P, NAME_IDS, SPLIT, [[2, 0]], _config())


def _clean_ld(rows):
  meta = {k: jnp.asarray(P[k][rows]) for k in run.META}
  logits, _ = forward.end_logits(WIRED, jnp.asarray(P["tokens"][rows]),
                                 meta["end"])
  return np.asarray(forward.logit_diff(logits, meta["io"], meta["s"]),
                    np.float64)


def test_each_round_finds_the_wired_head_and_confirms_it(wired):
  r = wired["rounds"]
  inh, dup = r["s_inhibition"], r["induction_duplicate"]
  assert inh["receivers"] == [[2, 0, "q"]] and inh["senders"] == 4
  assert inh["heads"] == [[1, 0]] and inh["confirmed"]
  # L1H0's keys and values (two kv heads: its own) receive round two.
  assert dup["receivers"] == [[1, 0, "k"], [1, 0, "v"]]
  assert dup["heads"] == [[0, 0]] and dup["confirmed"]
  # No other head sends anything: every random set's effect is 0, so none
  # is as far, and the permutation share is its floor.
  for rd in (inh, dup):
    h = rd["held_out"]
    assert h["test"] == {"as_far": 0, "p": 1 / 21}
    np.testing.assert_allclose(h["random"]["per_group"], 0, atol=1e-5)
    assert h["joint"]["ci95"][1] < -1
  # L0H0 attends from S2 to S1 (duplicate token) on both halves; so no
  # induction head receives a third round.
  assert [k["selection"]["kind"] for k in dup["kinds"]] == [
      "duplicate-token"]
  assert dup["kinds"][0]["held_out"]["kind"] == "duplicate-token"
  assert r["previous_token"] == {"skipped": "no induction heads to receive"}


def test_held_out_effects_are_the_path_patched_held_out_prompts(wired):
  # Recomputed here from paths.path_patching on the held-out prompts: the
  # class's joint effect and its member's own.
  held = SPLIT[1]
  meta = {k: jnp.asarray(P[k][held]) for k in run.META}
  got = paths.path_patching(
      WIRED, jnp.asarray(P["tokens"][held]), jnp.asarray(P["corrupted"][held]),
      meta, ((2, 0, "q"),), np.asarray([[1, 0]]))
  want = np.asarray(got[0], np.float64) - _clean_ld(held)
  h = wired["rounds"]["s_inhibition"]["held_out"]
  np.testing.assert_allclose(h["joint"]["per_prompt"], want, atol=1e-5)
  np.testing.assert_allclose(h["members"][0]["per_prompt"], want, atol=1e-5)
  assert len(h["by_template"]) == len(prompts.TEMPLATES)
  for t, v in zip(np.unique(P["template"][held]), h["by_template"]):
    assert v == pytest.approx(want[P["template"][held] == t].mean())


def test_random_sets_hold_no_class_head(wired):
  r = wired["rounds"]
  inh = r["s_inhibition"]["held_out"]["random_heads"]
  assert all(h in ([0, 0], [0, 1], [1, 1]) for s in inh for h in s)
  # Round two's pool: layer 0 without L0H0 (the class) is L0H1 alone.
  dup = r["induction_duplicate"]["held_out"]["random_heads"]
  assert {tuple(h) for s in dup for h in s} == {(0, 1)}


def test_an_unconfirmed_class_sends_no_round_after_it():
  # Eight random sets: the smallest share, 1 / 9, is above 0.05, so even
  # the wired S-inhibition head is not confirmed and round two waits.
  r = run.study(WIRED, P, NAME_IDS, SPLIT, [[2, 0]],
                _config(random_groups=8))["rounds"]
  assert r["s_inhibition"]["heads"] == [[1, 0]]
  assert not r["s_inhibition"]["confirmed"]
  assert r["induction_duplicate"] == {
      "skipped": "no s_inhibition heads to receive"}


def test_a_set_of_senders_sends_every_layers_heads():
  # Into L2H0's queries L0H0 sends nothing (its DUP is read by L1H0's
  # keys, and L1H0's output is frozen or patched), so the set {L0H0, L1H0}
  # sends exactly what L1H0 sends; L1H1 writes nothing, so {L1H0, L1H1}
  # does too; and a one-head mask is the (layer, head) pair.
  rows = np.arange(6)
  meta = {k: jnp.asarray(P[k][rows]) for k in run.META}
  args = (WIRED, jnp.asarray(P["tokens"][rows]),
          jnp.asarray(P["corrupted"][rows]), meta, ((2, 0, "q"),))
  pairs = paths.path_patching(*args, np.asarray([[1, 0], [0, 0]]))
  sets = paths.path_patching(*args, run.masks([[2], [0], [0, 2], [2, 3]],
                                              3, 2))
  np.testing.assert_array_equal(sets[:2], pairs)
  np.testing.assert_allclose(sets[2], pairs[0], atol=1e-6)
  np.testing.assert_allclose(sets[3], pairs[0], atol=1e-6)
  assert np.all(pairs[0] < _clean_ld(rows) - 1)  # L1H0 does send
  with pytest.raises(ValueError, match=r"`senders` must be \[S, 2\]"):
    paths.path_patching(*args, np.zeros((2, 3)))


def test_receivers_under_gqa_are_the_kv_heads_of_the_group():
  # Nine query heads on three kv heads (SmolLM2): heads 0-2 share kv head
  # 0, 3-5 kv head 1, 6-8 kv head 2.
  got = run.receivers_of([[5, 8], [5, 6], [3, 4]], "kv", 9, 3)
  assert got == ((3, 1, "k"), (3, 1, "v"), (5, 2, "k"), (5, 2, "v"))
  assert run.receivers_of([[5, 8], [3, 4]], "q", 9, 3) == (
      (3, 4, "q"), (5, 8, "q"))
  assert run.senders_of(got, 9).tolist() == list(range(45))


def test_output_heads_are_the_confirmed_positive_groups(tmp_path):
  saved = {"models": {"m": {"selection": [0, 2], "groups": {
      "name_movers": {"heads": [[3, 1], [3, 2]], "confirmed": True},
      "s_suppressors": {"heads": [[4, 0]], "confirmed": False},
      "negative": {"heads": [[5, 5]], "confirmed": True}}}}}
  path = tmp_path / "results.json"
  path.write_text(json.dumps(saved))
  e = _config(output_heads_results=str(path))
  assert run.output_heads(e, "m", np.asarray([0, 2])) == [[3, 1], [3, 2]]
  with pytest.raises(ValueError, match="selection half of 'm' differs"):
    run.output_heads(e, "m", np.asarray([0, 1]))
  with pytest.raises(ValueError, match="holds no model 'x'"):
    run.output_heads(e, "x", np.asarray([0, 2]))


def test_smoke_run_end_to_end(tmp_path):
  config = entry_points.config("ioi_classes")
  with config.unlocked():
    config.experiment.models = ("tiny_gemma3",)
  saved = entry_points.load("ioi_classes").run(config, tmp_path)
  r = saved["models"]["tiny_gemma3"]
  assert r["num_prompts"] == 32 and len(r["held_out"]) == 16
  assert r["output_heads"] == [[5, 1]]
  text = (tmp_path / "report.md").read_text()
  assert "Smoke run" in text
  assert report_lib.regenerate(tmp_path, report.render) == text
  rows = entry_points.table(text, "| model | prompts |")
  assert rows[0][:3] == ["tiny random Gemma 3", "32", "L5H1"]
