"""The IOI experiment: its prompts, its END-only forward pass, its
statistics, a hand-wired IOI circuit that every detector and patching
method must find, and the smoke run end to end.

The wired circuit (`wired_ioi`) is the positive control: three layers of
two heads, weights set by hand so that

  L0H0  duplicate-token head: each name attends to an earlier copy of
        itself (else to position 0) and writes "I repeat name i" (DUP)
  L1H0  S-inhibition head: attends to a position holding DUP (S2, else
        position 0) and moves its name into INH at the query
  L2H0  name mover: attends to names, minus the names in INH, and copies
        the name it finds into the readout

and every other head does nothing (L2H1 attends to names too but writes
nothing). So on a clean prompt END copies IO; on an ABC prompt nothing
is repeated, L2H0 spreads over three names that are neither IO nor S,
and the logit difference is exactly 0.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.ioi import head_patching
from experiments.ioi import report
from experiments.ioi import run
from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_task import stats
from mha_jax.measure import bootstrap
from mha_jax.measure import report as report_lib
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM

import entry_points

TOK = models.word_tokenizer()
NAMES = prompts.single_token_names(TOK)
V, T = TOK.get_vocab_size(), 24
# Residual blocks: token one-hot, position one-hot, DUP, INH, then the
# always-on ONE and the is-a-name NAME dimensions.
TOK0, POS0, DUP0, INH0 = 0, V, V + T, 2 * V + T
ONE, NAME = 3 * V + T, 3 * V + T + 1
D = 3 * V + T + 2
DH = V + T + 2


def _name_ids():
  return np.asarray(sorted(NAMES.values()))


def wired_ioi(gain: float = 5.0, out_scale: float = 10.0) -> DecoderLM:
  """The hand-wired circuit of the module docstring. Every stream holds
  3 to 6 ones; the pre-norms' scale sqrt(4 / D) brings those back to
  about 1, and `gain` squared sizes the scores that matter."""
  config = ModelConfig(vocab_size=V, d_model=D, num_layers=3, num_heads=2,
                       num_kv_heads=2, head_dim=DH, max_len=T,
                       attention_only=True, positions="learned", norm="rms",
                       attn_scale=1.0, readout_bias=False,
                       implementation="einsum")
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config, rngs=nnx.Rngs(0))))
  model = nnx.merge(graphdef, jax.tree.map(
      lambda x: jnp.zeros(x.shape, x.dtype), state))
  for b in model.blocks:
    b.ln_attn.scale[...] = jnp.full((D,), np.sqrt(4 / D))
  model.final_ln.scale[...] = jnp.ones((D,))
  w = {(l, n): np.zeros((D, 2, DH) if n != "w_o" else (2, DH, D),
                        np.float32)
       for l in range(3) for n in ("w_q", "w_k", "w_v", "w_o")}
  g = gain
  names = _name_ids()
  # L0H0: same name earlier (+g^2), itself (-g^2), else position 0.
  for i in names:
    w[0, "w_q"][TOK0 + i, 0, i] = g
    w[0, "w_k"][TOK0 + i, 0, i] = g
    w[0, "w_v"][TOK0 + i, 0, i] = 1.0
    w[0, "w_o"][0, i, DUP0 + i] = 1.0
  for p in range(T):
    w[0, "w_q"][POS0 + p, 0, V + p] = g
    w[0, "w_k"][POS0 + p, 0, V + p] = -2 * g
  w[0, "w_q"][ONE, 0, V + T] = g
  w[0, "w_k"][POS0, 0, V + T] = g / 2
  # L1H0: a key holding DUP (+g^2), else position 0 (+g^2 / 2).
  w[1, "w_q"][ONE, 0, 0] = g
  w[1, "w_k"][DUP0:DUP0 + V, 0, 0] = g
  w[1, "w_k"][POS0, 0, 0] = g / 2
  for i in names:
    w[1, "w_v"][DUP0 + i, 0, i] = 1.0
    w[1, "w_o"][0, i, INH0 + i] = 1.0
  # L2H0: names (+g^2), minus twice that for the name held in INH.
  w[2, "w_q"][ONE, 0, 0] = g
  w[2, "w_k"][NAME, 0, 0] = g
  for i in names:
    w[2, "w_q"][INH0 + i, 0, 1 + i] = 2 * g
    w[2, "w_k"][TOK0 + i, 0, 1 + i] = -g
    w[2, "w_v"][TOK0 + i, 0, i] = 1.0
    w[2, "w_o"][0, i, TOK0 + i] = out_scale
  # L2H1: attends to names as L2H0 does, writes nothing.
  w[2, "w_q"][ONE, 1, 0] = g
  w[2, "w_k"][NAME, 1, 0] = g
  embed = np.zeros((V, D), np.float32)
  embed[np.arange(V), TOK0 + np.arange(V)] = 1.0
  embed[:, ONE] = 1.0
  embed[names, NAME] = 1.0
  pos = np.zeros((T, D), np.float32)
  pos[np.arange(T), POS0 + np.arange(T)] = 1.0
  readout = np.zeros((D, V), np.float32)
  readout[TOK0 + np.arange(V), np.arange(V)] = 1.0
  model.embed.embed.embedding[...] = jnp.asarray(embed)
  model.embed.pos_embed.embedding[...] = jnp.asarray(pos)
  model.readout.kernel[...] = jnp.asarray(readout)
  for l in range(3):
    for n in ("w_q", "w_k", "w_v", "w_o"):
      getattr(model.blocks[l].attn, n)[...] = jnp.asarray(w[l, n])
  return model


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
    head_patching.path_patching(WIRED, tokens, tokens, meta, ((2, 0, "z"),),
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
  wang = head_patching.path_patching(*args, through_mlps=True)
  direct = head_patching.path_patching(*args, through_mlps=False)
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
  wang = head_patching.path_patching(*args, through_mlps=True)
  direct = head_patching.path_patching(*args, through_mlps=False)
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
