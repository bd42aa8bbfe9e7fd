"""The IOI output-head experiment: the selection / held-out split, the
group rule on planted numbers, a hand-wired model whose heads' direct
effects, logit split and copy suppression are known exactly, the mean
ablation, and the smoke run end to end.

The wired model (`wired_heads`) is one attention-only layer with no
final norm, so a head's direct effect is its output read out as it is.
Its stream holds the token one-hot, an always-on ONE and an is-a-name
NAME dimension. All three heads attend from every query to the name
tokens only, equally (a score of about 54 on names, 0 elsewhere), so at
END each puts 1/3 on IO and 2/3 on S (S1 and S2). Each moves the token
it reads into the readout times its own factor:

  H0  -C   a copy suppressor: at END it writes -C/3 (IO + 2 S), so its
           effect on logit(IO) is -C/3, on logit(S) -2C/3, on the other
           names 0, and its direct effect +C/3; it attends to S and
           lowers S most; through its OV circuit a name's own logit is
           the lowest of the vocabulary
  H1  +C   a copier: every sign flipped, so it lowers no name
  H2   0   writes nothing: every logit tied, no name suppressed
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.ioi_task import detectors
from experiments.ioi_task import forward
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from experiments.ioi_output_heads import ablation
from experiments.ioi_task import groups
from experiments.ioi_task import halves
from experiments.ioi_output_heads import head_effects
from experiments.ioi_output_heads import ov_circuit
from experiments.ioi_output_heads import report
from experiments.ioi_output_heads import run
from mha_jax.measure import report as report_lib
from mha_jax.models.model_config import ModelConfig
from mha_jax.models.transformer import DecoderLM

import entry_points

TOK = models.word_tokenizer()
NAMES = prompts.single_token_names(TOK)
NAME_IDS = sorted(NAMES.values())
V = TOK.get_vocab_size()
ONE, NAME = V, V + 1
D = V + 2
C = 3.0  # each head's output factor
FACTOR = (-C, C, 0.0)


def wired_heads(gain: float = 6.0) -> DecoderLM:
  """The model of the module docstring. The pre-norm's scale sqrt(3 / D)
  gives a name's stream (three ones) back unchanged, so a head's value
  at a name is that name's one-hot."""
  config = ModelConfig(vocab_size=V, d_model=D, num_layers=1, num_heads=3,
                       num_kv_heads=3, head_dim=V, max_len=32,
                       attention_only=True, positions="none", norm="rms",
                       attn_scale=1.0, readout_bias=False, final_ln=False,
                       implementation="einsum")
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: DecoderLM(config, rngs=nnx.Rngs(0))))
  model = nnx.merge(graphdef, jax.tree.map(
      lambda x: jnp.zeros(x.shape, x.dtype), state))
  model.blocks[0].ln_attn.scale[...] = jnp.full((D,), np.sqrt(3 / D))
  w_q, w_k = np.zeros((D, 3, V), np.float32), np.zeros((D, 3, V), np.float32)
  w_v, w_o = np.zeros((D, 3, V), np.float32), np.zeros((3, V, D), np.float32)
  for h, factor in enumerate(FACTOR):
    w_q[ONE, h, 0] = gain
    w_k[NAME, h, 0] = gain
    w_v[np.arange(V), h, np.arange(V)] = 1.0
    w_o[h, np.arange(V), np.arange(V)] = factor
  embed = np.zeros((V, D), np.float32)
  embed[np.arange(V), np.arange(V)] = 1.0
  embed[:, ONE] = 1.0
  embed[NAME_IDS, NAME] = 1.0
  readout = np.zeros((D, V), np.float32)
  readout[np.arange(V), np.arange(V)] = 1.0
  model.embed.embed.embedding[...] = jnp.asarray(embed)
  model.readout.kernel[...] = jnp.asarray(readout)
  attn = model.blocks[0].attn
  for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)):
    getattr(attn, name)[...] = jnp.asarray(w)
  return model


WIRED = wired_heads()
PROMPTS = prompts.build(TOK, NAMES, per_template_order=1, seed=3)


def _meta(p):
  return {k: jnp.asarray(p[k]) for k in run.META}


@pytest.fixture(scope="module")
def wired_ov():
  return jax.tree.map(np.asarray, ov_circuit.all_heads(WIRED, NAME_IDS))


@pytest.fixture(scope="module")
def wired_effects():
  return jax.tree.map(np.asarray, head_effects.measure(
      WIRED, jnp.asarray(PROMPTS["tokens"]), _meta(PROMPTS), NAME_IDS))


# --- the halves --------------------------------------------------------------

def test_split_balances_every_template_and_order():
  p = prompts.build(TOK, NAMES, per_template_order=4, seed=1)
  sel, held = halves.split(p["template"], p["order"], share=0.5, seed=0)
  assert len(sel) == len(held) == 32
  assert set(sel).isdisjoint(held) and len(set(sel) | set(held)) == 64
  for t in range(len(prompts.TEMPLATES)):
    for o in (0, 1):
      cell = (p["template"] == t) & (p["order"] == o)
      assert cell[sel].sum() == cell[held].sum() == 2
  again, _ = halves.split(p["template"], p["order"], share=0.5, seed=0)
  other, _ = halves.split(p["template"], p["order"], share=0.5, seed=1)
  np.testing.assert_array_equal(sel, again)
  assert not np.array_equal(sel, other)


def test_split_refuses_a_share_that_empties_a_half():
  with pytest.raises(ValueError, match=r"halves.split: `share` must lie "
                     r"strictly between 0 and 1, got 1.0"):
    halves.split([0, 0], [0, 0], share=1.0, seed=0)
  with pytest.raises(ValueError, match=r"halves.split: template 0, order 0 "
                     r"has 2 prompts; `share`=0.1 leaves a half without any"):
    halves.split([0, 0], [0, 0], share=0.1, seed=0)


def test_template_interval_is_wider_than_the_prompt_interval():
  # Two templates whose prompts differ only between the templates: the
  # prompts look like many independent draws, the templates are two.
  template = np.repeat([0, 1], 20)
  values = np.where(template == 0, 1.0, 3.0)
  d = halves.Draws(template, resamples=400, seed=0)
  s = d.summary(values)
  assert s["mean"] == pytest.approx(2.0)
  prompt_width = s["ci95"][1] - s["ci95"][0]
  template_width = s["ci95_templates"][1] - s["ci95_templates"][0]
  assert template_width > 1.5 * prompt_width
  assert halves.by_template(values, template) == [1.0, 3.0]


# --- the group rule on planted numbers ---------------------------------------

def _ci(mean, half=0.1):
  mean = np.asarray(mean, float)
  return np.stack([mean - half, mean + half], 1)


def test_grow_admits_similar_heads_and_stops_at_the_floor():
  # Heads 0-5 by effect; head 4 is admitted by its kind but its interval
  # reaches 0; head 5 is too small beside the strongest (0.2 < 0.25 * 1).
  mean = np.array([1.0, 0.6, 0.5, -0.9, 0.05, 0.2, 0.8])
  ci = _ci(mean)
  admitted = np.array([True, True, True, True, True, True, False])
  got = groups.grow(mean, ci, admitted, sign=1, relative_floor=0.25,
                    max_group=5)
  assert got == [0, 1, 2]  # head 6 is larger but not of the kind
  assert groups.grow(mean, ci, admitted, sign=1, relative_floor=0.25,
                     max_group=2) == [0, 1]
  assert groups.grow(mean, ci, admitted, sign=1, relative_floor=0.0,
                     max_group=5) == [0, 1, 2, 5]
  assert groups.grow(mean, ci, admitted, sign=-1, relative_floor=0.25,
                     max_group=5) == [3]
  assert groups.grow(mean, ci, np.zeros(7, bool), sign=1,
                     relative_floor=0.25, max_group=5) == []


def test_candidates_read_attention_copy_and_s_lowering():
  # Head 0 a name mover; 1 an S suppressor; 2 attends to IO by less than
  # the floor; 3 attends to S but raises S; 4 negative.
  means = {"effect": np.array([1.0, 1.0, 1.0, 1.0, -1.0])}
  ci = {"attention": _ci([0.5, -0.5, 0.05, -0.5, 0.5], 0.05),
        "copy": _ci([2.0, -2.0, 2.0, -2.0, -2.0]),
        "s_specific": _ci([0.0, -1.0, 0.0, 1.0, 0.0], 0.2)}
  got = groups.candidates(means, ci, floor=0.1)
  assert got["name_movers"].tolist() == [True, False, False, False, False]
  assert got["s_suppressors"].tolist() == [False, True, False, False, False]
  assert got["negative"].tolist() == [False, False, False, False, True]


def test_random_groups_come_from_the_pool_and_the_test_counts_them():
  pool = np.array([3, 5, 8, 9, 12])
  r = groups.random_groups(pool, 3, 40, seed=0)
  assert r.shape == (40, 3) and set(r.ravel()) <= set(pool)
  assert all(len(set(row)) == 3 for row in r)
  np.testing.assert_array_equal(r, groups.random_groups(pool, 3, 40, 0))
  with pytest.raises(ValueError, match=r"groups.random_groups: `size`=6 "
                     r"heads cannot be drawn from a pool of 5"):
    groups.random_groups(pool, 6, 1, 0)
  assert groups.as_far(1.0, [0.0, 2.0, 1.0, -3.0], 1) == {"as_far": 2,
                                                           "p": 0.6}
  assert groups.as_far(-1.0, [0.0, 2.0, 1.0, -3.0], -1) == {"as_far": 1,
                                                            "p": 0.4}
  with pytest.raises(ValueError, match=r"groups.grow: `sign` must be 1 or "
                     r"-1, got 0"):
    groups.grow([1.0], _ci([1.0]), [True], sign=0, relative_floor=0.5,
                max_group=1)


def _config(**kw):
  import ml_collections
  return ml_collections.ConfigDict(dict(
      random_groups=50, max_p=0.05, cs_context_floor=0.5, cs_ov_share=0.5,
      cs_top_k=2, resamples=200, seed=0) | kw)


def test_a_planted_group_is_confirmed_and_a_random_one_is_not():
  # 20 heads, 40 prompts: heads 0 and 1 add +1 each on every prompt, the
  # others noise around 0.
  rng = np.random.default_rng(0)
  effect = rng.normal(0, 0.3, size=(40, 20))
  effect[:, :2] += 1.0
  m = {"effect": effect, "io": effect / 2, "s": -effect / 2,
       "other": np.zeros_like(effect)}
  rows, template = np.arange(40), np.repeat(np.arange(8), 5)
  draws = halves.Draws(template, resamples=200, seed=0)
  pool = np.arange(2, 20)
  e = _config()
  g = run.confirm_group([0, 1], m, rows, draws, pool, template, sign=1, e=e,
                        seed=1)
  assert g["confirmed"] and g["test"] == {"as_far": 0, "p": 1 / 51}
  assert g["joint"]["effect"]["mean"] == pytest.approx(
      effect[:, :2].sum(1).mean())
  assert g["joint"]["io"]["mean"] == pytest.approx(
      g["joint"]["effect"]["mean"] / 2)
  assert np.all(np.isin(g["random_heads"], pool))
  noise = run.confirm_group([5, 6], m, rows, draws, pool, template, sign=1,
                            e=e, seed=1)
  assert not noise["confirmed"] and noise["test"]["p"] > 0.05
  # Ablation: each group's ablated loss is what `ablate` returns for it.
  ab = run.confirm_group([0, 1], m, rows, draws, pool, template, sign=1,
                         e=e, seed=1,
                         ablate=lambda heads: effect[:, heads].sum(1))
  assert ab["ablation"]["joint"]["mean"] == pytest.approx(
      g["joint"]["effect"]["mean"])
  assert ab["ablation"]["test"]["as_far"] == 0


# --- the wired model: known direct effects and copy suppression --------------

def test_attention_is_a_third_on_io_and_two_thirds_on_s(wired_effects):
  m = wired_effects
  np.testing.assert_allclose(m["end_io"], 1 / 3, atol=1e-5)
  np.testing.assert_allclose(m["end_s"], 2 / 3, atol=1e-5)


def test_logit_split_is_known_exactly(wired_effects):
  m = wired_effects
  n = len(PROMPTS["end"])
  # (to 1e-4: the pre-norm's epsilon scales every value by 1 - 2e-5)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                  atol=1e-6)
  for h, factor in enumerate(FACTOR):
    close(m["io"][:, 0, h], factor / 3)
    close(m["s"][:, 0, h], 2 * factor / 3)
    close(m["other"][:, 0, h], 0.0)
    close(m["effect"][:, 0, h], -factor / 3)
    close(m["copy"][:, 0, h], factor)
  assert m["effect"].shape == (n, 1, 3)
  # The same numbers as the IOI experiment's `dla`, and the heads' terms
  # add up to the model's own logit difference (no final norm, no MLP).
  det = detectors.measure(WIRED, jnp.asarray(PROMPTS["tokens"]),
                          _meta(PROMPTS), jnp.asarray(NAME_IDS))
  np.testing.assert_allclose(m["effect"], det["dla"], atol=1e-6)
  logits, _ = forward.end_logits(WIRED, jnp.asarray(PROMPTS["tokens"]),
                                 jnp.asarray(PROMPTS["end"]))
  ld = forward.logit_diff(logits, jnp.asarray(PROMPTS["io"]),
                          jnp.asarray(PROMPTS["s"]))
  np.testing.assert_allclose(m["effect"].sum((1, 2)), ld, atol=1e-5)


def test_other_names_are_the_baseline_a_uniform_write_cancels():
  # A head that adds the same amount to every name moves "other" by as
  # much as IO and S: its specific effects stay 0, so it lowers no name.
  m = {"io": np.full((4, 1, 1), -1.0), "s": np.full((4, 1, 1), -1.0),
       "other": np.full((4, 1, 1), -1.0), "end_io": np.full((4, 1, 1), 0.1),
       "end_s": np.full((4, 1, 1), 0.9)}
  assert np.all(np.asarray(head_effects.agreement(m)) == 0)
  m["s"] = np.full((4, 1, 1), -1.5)  # now S is lowered more than others
  assert np.all(np.asarray(head_effects.agreement(m)) == 1)
  m["end_io"] = np.full((4, 1, 1), 0.95)  # but the head attends to IO
  assert np.all(np.asarray(head_effects.agreement(m)) == 0)


def test_copy_suppression_in_context(wired_effects):
  agree = wired_effects["agree"][:, 0]  # [N, H]
  np.testing.assert_array_equal(agree[:, 0], 1.0)  # attends S, lowers S
  np.testing.assert_array_equal(agree[:, 1], 0.0)  # raises both names
  np.testing.assert_array_equal(agree[:, 2], 0.0)  # writes nothing


def test_ov_circuit_ranks_a_suppressed_name_first(wired_ov):
  ranks = {k: v[0] for k, v in wired_ov.items()}  # the one layer
  m = len(NAME_IDS)
  # H0: each name's own logit is the only negative one.
  np.testing.assert_array_equal(ranks["vocab"][0], 0)
  np.testing.assert_array_equal(ranks["names"][0], 0)
  # H1: the highest; H2: tied with every token, so suppressed by nothing.
  np.testing.assert_array_equal(ranks["vocab"][1], V - 1)
  np.testing.assert_array_equal(ranks["names"][1], m - 1)
  np.testing.assert_array_equal(ranks["vocab"][2], V - 1)


def test_copy_suppression_passes_h0_alone(wired_effects, wired_ov):
  m = {k: v.reshape(v.shape[0], -1) for k, v in wired_effects.items()}
  m["num_heads"] = 3
  ov = {k: v.reshape(-1, v.shape[-1]) for k, v in wired_ov.items()}
  ov["vocab_size"] = V
  rows = np.arange(len(PROMPTS["end"]))
  draws = halves.Draws(PROMPTS["template"], resamples=100, seed=0)
  cs = run.copy_suppression([0, 1], m, rows, draws, np.array([2]), ov,
                            PROMPTS["template"], _config())
  h0, h1 = cs["heads"]
  assert h0["head"] == [0, 0] and h0["passes"]
  assert h0["context"]["mean"] == 1.0 and h0["ov_top_k_share"][0] == 1.0
  assert h0["ov_median_rank"] == 0 and h0["ov_median_name_rank"] == 0
  assert not h1["passes"] and not h1["context_pass"] and not h1["ov_pass"]
  assert cs["baseline"]["agree_median"] == 0.0
  assert cs["baseline"]["ov_share_max"] == 0.0


def test_a_readout_bias_is_refused():
  # Refused before any computation, so the model's shapes are enough.
  biased = nnx.eval_shape(lambda: DecoderLM(ModelConfig(
      vocab_size=V, d_model=8, num_layers=1, num_heads=2, max_len=8,
      readout_bias=True, tie_embeddings=False), rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match=r"ov_circuit.own_ranks: a readout "
                     r"bias would add a per-token constant that is no part "
                     r"of the OV circuit; the model has readout_bias=True"):
    ov_circuit.own_ranks(biased, 0, NAME_IDS)


# --- mean ablation -----------------------------------------------------------

def test_template_means_average_within_a_template():
  z = np.arange(6, dtype=np.float32).reshape(3, 1, 1, 2)
  got = ablation.template_means(z, [0, 1, 0])
  np.testing.assert_allclose(got[0], [[[2.0, 3.0]]])
  np.testing.assert_allclose(got[2], got[0])
  np.testing.assert_allclose(got[1], z[1])


def test_ablating_a_head_to_zero_removes_its_direct_effect(wired_effects):
  # One layer, no norm after it: zeroing a head's output moves the logit
  # difference by exactly its direct effect; its own clean output as the
  # "mean" changes nothing.
  tokens, meta = jnp.asarray(PROMPTS["tokens"]), _meta(PROMPTS)
  _, acts = forward.end_logits(WIRED, tokens, meta["end"],
                               capture=("blocks.0.attn.z",))
  z = acts["blocks.0.attn.z"]
  base = ablation.ablated_logit_diff(WIRED, tokens, meta, [z],
                                     jnp.ones((1, 3), bool))
  mask = jnp.asarray([[True, False, False]])
  zero = ablation.ablated_logit_diff(WIRED, tokens, meta, [jnp.zeros_like(z)],
                                     mask)
  np.testing.assert_allclose(base - zero, wired_effects["effect"][:, 0, 0],
                             atol=1e-5)
  means = ablation.abc_means(WIRED, PROMPTS["corrupted"],
                             PROMPTS["template"], chunk=8)
  assert len(means) == 1 and means[0].shape == z.shape


# --- the smoke run -----------------------------------------------------------

def test_smoke_run_end_to_end(tmp_path):
  config = entry_points.config("ioi_output_heads")
  with config.unlocked():
    config.experiment.models = ("tiny_llama",)
  saved = entry_points.load("ioi_output_heads").run(config, tmp_path)
  r = saved["models"]["tiny_llama"]
  assert r["num_prompts"] == 32
  assert len(r["selection"]) == len(r["held_out"]) == 16
  assert set(r["groups"]) == set(groups.KINDS)
  text = (tmp_path / "report.md").read_text()
  assert "Smoke run" in text
  assert report_lib.regenerate(tmp_path, report.render) == text
  rows = entry_points.table(text, "| model | prompts |")
  assert rows[0][:3] == ["tiny random Llama", "32", str(r["num_names"])]
