"""The IOI experiment: its prompts, its END-only forward pass, its
statistics, a hand-wired IOI circuit that every detector and patching
method must find, and the smoke run end to end.

The wired circuit (`wired_ioi`, tests/wired_ioi.py) is the positive
control: a duplicate-token, an S-inhibition and a name-mover head wired
by hand.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.ioi import head_patching
from experiments.ioi import report
from experiments.ioi import run
from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import paths
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_task import stats
from mha_jax.measure import bootstrap
from mha_jax.measure import report as report_lib
from mha_jax.models.transformer import DecoderLM

import entry_points
from wired_ioi import D, NAMES, TOK, _name_ids, wired_ioi  # shared

WIRED = wired_ioi()
PROMPTS = prompts.build(TOK, NAMES, per_template_order=1, seed=3)


def _config(**overrides):
  e = ml_collections.ConfigDict(dict(
      roles=("all", "S1", "IO", "S2", "END", "rest"), denoise=True,
      path_rounds=3, path_through_mlps=True, output_kv_round=True,
      k_max=1, resamples=200, chunk=16, batch=None, seed=0, num_kv_heads=2,
      layer_chunks=2))
  e.update(overrides)
  return e


# --- prompts ---------------------------------------------------------------

def test_names_are_one_token_after_a_space():
  assert len(NAMES) == len(prompts.CANDIDATE_NAMES)
  assert TOK.encode("Then Mary").ids[-1] == NAMES["Mary"]
  # A name the tokenizer splits, or does not know, is left out.
  assert prompts.single_token_names(TOK, ("Mary", "Zorblax")) == {
      "Mary": NAMES["Mary"]}


def test_prompts_put_each_role_where_it_says():
  p = PROMPTS
  rows = np.arange(len(p["end"]))
  tokens, abc = p["tokens"], p["corrupted"]
  assert np.all(tokens[rows, p["io_pos"]] == p["io"])
  assert np.all(tokens[rows, p["s1_pos"]] == p["s"])
  assert np.all(tokens[rows, p["s2_pos"]] == p["s"])
  assert np.all(tokens[rows, p["end"]] == TOK.token_to_id("to"))
  # ABBA: IO first; BABA: S first; S2 after both; half of each order.
  abba = p["order"] == 0
  assert np.all(p["io_pos"][abba] < p["s1_pos"][abba])
  assert np.all(p["s1_pos"][~abba] < p["io_pos"][~abba])
  assert np.all(p["s2_pos"] > np.maximum(p["io_pos"], p["s1_pos"]))
  assert abba.sum() == (~abba).sum() == len(prompts.TEMPLATES)
  # ABC: the same template, three distinct names, neither IO nor S.
  for r in rows:
    slots = [p["io_pos"][r], p["s1_pos"][r], p["s2_pos"][r]]
    x = set(abc[r, slots].tolist())
    assert len(x) == 3 and not x & {p["io"][r], p["s"][r]}
    other = np.ones(tokens.shape[1], bool)
    other[slots] = False
    np.testing.assert_array_equal(abc[r, other], tokens[r, other])


def test_too_few_names_is_refused():
  with pytest.raises(ValueError, match=r"prompts.build: `names` must hold "
                     r"at least 5 single-token names \(IO, S and three ABC "
                     r"names\), got 4"):
    prompts.build(TOK, dict(list(NAMES.items())[:4]), per_template_order=1,
                  seed=0)


# --- the forward pass and the statistics -----------------------------------

@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gemma3"])
def test_end_logits_are_the_models_own(name):
  model, _, _ = models.load(name)
  tokens, end = jnp.asarray(PROMPTS["tokens"][:4]), PROMPTS["end"][:4]
  logits, _ = forward.end_logits(model, tokens, jnp.asarray(end))
  np.testing.assert_allclose(logits, model(tokens)[np.arange(4), end],
                             rtol=1e-5, atol=1e-5)


def test_patched_fraction_and_separation_on_known_numbers():
  clean, corrupt = np.array([2.0, 4.0]), np.array([0.0, 0.0])
  patched = np.array([[0.0, 3.0], [0.0, 3.0]])  # [N, M]
  f = stats.patched_fraction(patched, clean, corrupt,
                             bootstrap.draws(2, 10, 0))
  np.testing.assert_allclose(f["fraction"], [1.0, 0.0])
  # Head 2 is 1 above head 0 on every prompt, head 0 1 above head 1.
  rng = np.random.default_rng(0)
  base = rng.normal(size=(40, 1))
  values = np.concatenate([base, base - 1, base + 1], 1)
  samples = bootstrap.resampled_means(values, bootstrap.draws(40, 200, 0))
  sep = stats.separated(values.mean(0), samples, k_max=2, floor=-10.0)
  assert sep["members"] == [2, 0] and sep["gap_ci95"][0] > 0.99


def test_role_masks_refuse_an_unknown_role():
  with pytest.raises(ValueError, match=r"role_masks: `roles` must be "
                     r"drawn from \('all', 'S1', 'IO', 'S2', 'END', "
                     r"'rest'\), got 'S3'"):
    head_patching.role_masks(PROMPTS, 4, ("S3",))


def test_a_template_with_a_fourth_name_is_refused():
  with pytest.raises(ValueError, match=r"prompts: expected 3 name tokens in "
                     r"a prompt, found 4 \(ids .*\): a name is not one "
                     r"token in this context"):
    prompts.build(TOK, {"Mary": NAMES["Mary"]} | {
        n: NAMES[n] for n in ("John", "Tom", "Anna", "Kate", "Paul")},
                  per_template_order=1, seed=0,
                  templates=("When {A} and {B} met Mary, {C} said to",))


def test_bad_calls_name_the_argument():
  with pytest.raises(ValueError, match=r"models.load: `name` must be one of "
                     r"\('smollm2', 'gemma3', 'tiny_llama', 'tiny_gemma3'\),"
                     r" got 'gpt2'"):
    models.load("gpt2")
  tokens, end = jnp.asarray(PROMPTS["tokens"][:2]), PROMPTS["end"][:2]
  with pytest.raises(ValueError, match=r"end_logits: `start`=1 needs the "
                     r"`stream` entering that block, got None"):
    forward.end_logits(WIRED, tokens, end, start=1)
  meta = run._meta(prompts.subset(PROMPTS, np.arange(2)))
  with pytest.raises(ValueError, match=r"path_patching: a receiver must be "
                     r"\(layer, head, 'q' \| 'k' \| 'v'\), got \(2, 0, "
                     r"'z'\)"):
    paths.path_patching(WIRED, tokens, tokens, meta, ((2, 0, "z"),),
                                np.asarray([[0, 0]]))


def test_models_the_head_terms_do_not_fit_are_refused():
  post = DecoderLM(dataclasses.replace(WIRED.config, norm_placement="post"),
                   rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"direct_path: a head's change is a "
                     r"term added to the stream only in pre-norm or sandwich "
                     r"sequential blocks; the model has norm_placement="
                     r"'post', parallel_block=False"):
    head_patching.direct_path(post, None, None, None)
  capped = DecoderLM(dataclasses.replace(WIRED.config, final_soft_cap=30.0),
                     rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"direct_path: the logit difference "
                     r"is read as a dot product with the readout, which a "
                     r"final soft cap would bend; the model has "
                     r"final_soft_cap=30.0"):
    head_patching.direct_path(capped, None, None, None)
  layer_norm = DecoderLM(dataclasses.replace(WIRED.config, norm="layer"),
                         rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"final_scale: the direct effect is "
                     r"written for RMSNorm models, got norm='layer'"):
    forward.final_scale(layer_norm, jnp.zeros((1, D)))


# --- the positive control --------------------------------------------------

@pytest.fixture(scope="module")
def wired_circuit():
  return run.circuit(WIRED, PROMPTS, _config(), _name_ids().tolist())


def test_wired_model_does_the_task_and_abc_removes_it(wired_circuit):
  c = wired_circuit
  assert min(c["clean"]["per_prompt"]) > 1.0
  np.testing.assert_allclose(c["abc"]["per_prompt"], 0.0, atol=1e-6)


def test_activation_patching_finds_each_head_where_it_acts(wired_circuit):
  a = wired_circuit["activation"]
  roles = a["roles"]
  f = a["fraction"]  # [L, H, R]
  # The name mover at END does the whole job; no head 1 does anything.
  assert f[2, 0, roles.index("END")] == pytest.approx(1.0, abs=0.05)
  np.testing.assert_allclose(f[:, 1], 0.0, atol=1e-6)
  # S-inhibition at END and duplicate-token at S2: without them L2H0
  # attends to S as much as to IO, so the difference falls below ABC's 0.
  assert f[1, 0, roles.index("END")] > 1.0
  assert f[0, 0, roles.index("S2")] > 1.0
  # Nothing at positions where the head's output is never read.
  assert abs(f[0, 0, roles.index("S1")]) < 0.05
  assert abs(f[1, 0, roles.index("S2")]) < 0.05
  np.testing.assert_allclose(f[:, :, roles.index("rest")], 0.0, atol=0.05)
  # Denoising: the name mover's clean output alone restores nearly all.
  assert wired_circuit["denoise"]["fraction"][2, 0, 0] > 0.9


def test_detectors_see_the_wired_attention_and_copying(wired_circuit):
  d = wired_circuit["detectors"]
  assert d["end_io"]["mean"][2, 0] > 0.95 and d["end_s"]["mean"][2, 0] < 0.05
  assert d["s2_s1"]["mean"][0, 0] > 0.95
  assert d["copy_top1"]["mean"][2, 0] == 1.0 and d["copy"]["mean"][2, 0] > 1
  assert d["dla"]["mean"][2, 0] > 1.0
  assert wired_circuit["dup_attention"]["heads"] == [[0, 0]]


def test_path_patching_separates_the_three_classes(wired_circuit):
  c = wired_circuit
  assert c["name_movers"]["heads"] == [[2, 0]]
  assert c["name_movers"]["confirmed"] == [[2, 0]]
  assert c["name_movers"]["checks"][0]["kind"] == "name mover"
  si = c["paths"]["s_inhibition"]
  assert si["receivers"] == [[2, 0, "q"]] and si["heads"] == [[1, 0]]
  dup = c["paths"]["duplicate_induction"]
  assert dup["receivers"] == [[1, 0, "k"], [1, 0, "v"]]
  assert dup["heads"] == [[0, 0]]
  assert dup["kinds"][0]["kind"] == "duplicate-token"
  # L2H0's keys read only token identity from the embedding: no head
  # sends anything there.
  okv = c["paths"]["output_kv"]
  assert okv["receivers"] == [[2, 0, "k"], [2, 0, "v"]]
  assert okv["heads"] == [] and np.allclose(okv["fraction"], 0, atol=1e-6)
  # Nothing sits before layer 0 to send to its keys and values.
  assert c["paths"]["previous_token"] == {
      "skipped": "the receivers are in layer 0"}


def test_path_patching_direct_form_equals_wangs_without_mlps():
  # An attention-only model has no MLP to carry a change, so both forms
  # move the same sum of terms into the receivers.
  p = prompts.subset(PROMPTS, np.arange(4))
  args = (WIRED, jnp.asarray(p["tokens"]), jnp.asarray(p["corrupted"]),
          run._meta(p), ((2, 0, "q"),), np.asarray([[1, 0], [0, 0]]))
  wang = paths.path_patching(*args, through_mlps=True)
  direct = paths.path_patching(*args, through_mlps=False)
  np.testing.assert_allclose(wang, direct, atol=1e-4)
  assert np.all(np.asarray(wang)[0] < 0) and np.allclose(wang[1],
                                                         wang[1][0])


# --- sandwich norms (Gemma): a head's change through the post-norm --------

GEMMA, _, _ = models.load("tiny_gemma3")
SUB = prompts.subset(prompts.build(TOK, NAMES, per_template_order=1,
                                   seed=5), np.arange(4))


def _frozen_downstream(model, target, source, meta, layer, head):
  """The target run with head (layer, head)'s `z` from the source run and
  everything added to the stream after that head (its block's MLP, every
  later block) frozen at the target run's: its direct path, by hooks."""
  c = model.config
  end = meta["end"]
  z = f"blocks.{layer}.attn.z"
  frozen = [f"blocks.{layer}.mlp_out"] + [
      f"blocks.{j}.{x}" for j in range(layer + 1, c.num_layers)
      for x in ("attn_out", "mlp_out")]
  _, tgt = forward.end_logits(model, target, end, capture=tuple(frozen))
  _, src = forward.end_logits(model, source, end, capture=(z,))
  on = (jnp.arange(c.num_heads) == head)[None, None, :, None]
  patch = {z: lambda x: jnp.where(on, src[z], x)}
  patch |= {site: (lambda x, v=tgt[site]: v) for site in frozen}
  logits, _ = forward.end_logits(model, target, end, patch=patch)
  return forward.logit_diff(logits, meta["io"], meta["s"])


def test_sandwich_direct_path_is_the_run_with_everything_after_frozen():
  meta = run._meta(SUB)
  clean, abc = jnp.asarray(SUB["tokens"]), jnp.asarray(SUB["corrupted"])
  direct = head_patching.direct_path(GEMMA, clean, abc, meta)  # [L, H, N]
  base, _ = forward.end_logits(GEMMA, clean, meta["end"])
  base = forward.logit_diff(base, meta["io"], meta["s"])
  for layer, head in ((0, 1), (3, 2), (5, 0)):
    want = _frozen_downstream(GEMMA, clean, abc, meta, layer, head)
    assert not np.allclose(want, base, atol=1e-4)  # the head does move it
    np.testing.assert_allclose(direct[layer, head], want, atol=2e-5)


def test_sandwich_head_shares_sum_to_the_blocks_attention_term():
  meta = run._meta(SUB)
  clean = jnp.asarray(SUB["tokens"])
  det = detectors.measure(GEMMA, clean, meta, jnp.asarray(_name_ids()))
  c = GEMMA.config
  last = f"blocks.{c.num_layers - 1}.resid_post"
  sites = (last,) + tuple(f"blocks.{l}.attn_out" for l in range(6))
  _, acts = forward.end_logits(GEMMA, clean, meta["end"], capture=sites)
  rows = jnp.arange(clean.shape[0])
  scale = forward.final_scale(GEMMA, acts[last][rows, meta["end"]])
  u = (forward.unembed(GEMMA, meta["io"])
       - forward.unembed(GEMMA, meta["s"]))
  for l in range(c.num_layers):
    out = acts[f"blocks.{l}.attn_out"][rows, meta["end"]]  # post-normed
    want = jnp.sum(out * scale * u, -1)
    np.testing.assert_allclose(det["dla"][:, l].sum(-1), want, rtol=1e-4,
                               atol=1e-5)


def test_sandwich_path_patching_forms_agree_without_mlps():
  # Attention only: both forms move the sender's block term, the
  # post-norm recomputed with the other heads frozen, into the receivers.
  model = DecoderLM(dataclasses.replace(GEMMA.config, attention_only=True,
                                        mlp_gated=False), rngs=nnx.Rngs(1))
  meta = run._meta(SUB)
  args = (model, jnp.asarray(SUB["tokens"]), jnp.asarray(SUB["corrupted"]),
          meta, ((4, 1, "q"), (4, 0, "k")), np.asarray([[0, 2], [3, 1]]))
  wang = paths.path_patching(*args, through_mlps=True)
  direct = paths.path_patching(*args, through_mlps=False)
  np.testing.assert_allclose(wang, direct, atol=2e-5)


# --- the smoke run ---------------------------------------------------------

def test_smoke_run_end_to_end(tmp_path):
  config = entry_points.config("ioi")
  saved = entry_points.load("ioi").run(config, tmp_path)
  assert set(saved["models"]) == {"tiny_llama", "tiny_gemma3"}
  for m in saved["models"].values():
    assert m["num_prompts"] == 32 and len(
        m["task"]["clean"]["per_prompt"]) == 32
  assert list(saved["circuits"]) == ["tiny_llama"]
  c = saved["circuits"]["tiny_llama"]
  # Per prompt: [L, H, R, N] for the tiny Llama's 2 layers x 4 heads.
  assert np.asarray(c["activation"]["per_prompt"]).shape == (
      2, 4, len(config.experiment.roles), 16)
  text = (tmp_path / "report.md").read_text()
  assert "Smoke run" in text and (
      tmp_path / "patching_tiny_llama.png").exists()
  assert report_lib.regenerate(tmp_path, report.render) == text
