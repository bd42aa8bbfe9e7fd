"""Attention-sink measures, the induction task's BOS option, and the sinks
experiment end to end on its smoke config."""

from __future__ import annotations

import functools
import importlib
import json
import math

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import default
from mha_jax.interp import head_metrics
from mha_jax.core import attention
from mha_jax.training import config as config_lib
from mha_jax.models import model_config
from mha_jax.core import score_rules
from experiments.sinks import run as sinks_run
from experiments.sinks import survey
from mha_jax.measure import stats
from mha_jax.training import tasks
from mha_jax.models import transformer

import entry_points

B, H, T = 2, 3, 6


def _uniform(b=B, h=H, t=T):
  return jnp.broadcast_to(head_metrics.uniform_causal_weights(b, t), (b, h, t, t))


# ------------------------------------------------------------ known answers


def test_all_weight_on_key0_scores_1_and_a_self_attending_head_0():
  on_first = jnp.zeros((B, H, T, T)).at[..., 0].set(1.0)
  np.testing.assert_allclose(survey.key_share(on_first), np.ones(H))
  on_self = jnp.broadcast_to(jnp.eye(T), (B, H, T, T))
  # Query 0 (which can only see key 0) is not counted, so this is 0.
  np.testing.assert_allclose(survey.key_share(on_self), np.zeros(H))
  np.testing.assert_allclose(survey.key_share(on_self, 3), np.full(H, 1 / 5))
  np.testing.assert_allclose(survey.sink_share(on_first), np.zeros(H))


def test_uniform_causal_share_has_the_closed_form():
  assert survey.uniform_key0_share(2) == pytest.approx(1 / 2)
  assert survey.uniform_key0_share(3) == pytest.approx((1 / 2 + 1 / 3) / 2)
  by_sum = np.mean([1 / (i + 1) for i in range(1, 32)])
  assert survey.uniform_key0_share(32) == pytest.approx(by_sum)
  np.testing.assert_allclose(survey.key_share(_uniform()),
                             np.full(H, survey.uniform_key0_share(T)),
                             rtol=1e-6)


def test_rows_select_the_queries_averaged():
  w = _uniform()
  rows = jnp.zeros((B, T), bool).at[0, 3].set(True).at[1, 0].set(True)
  # Query 0 is never counted; query 3 sees 4 keys.
  np.testing.assert_allclose(survey.key_share(w, rows=rows), np.full(H, 0.25))
  none = jnp.zeros((B, T), bool)
  np.testing.assert_allclose(survey.key_share(w, rows=none), np.zeros(H))


def test_sink_share_is_what_the_sink_takes_from_a_real_pattern():
  """q = 0: each of the n keys a row sees scores 0, so with sink logit s
  the sink takes e^s / (n + e^s) of query i's row (n = i + 1)."""
  logits = jnp.asarray([-1.0, 0.0, 2.0])
  q = k = v = jnp.zeros((B, T, H, 4))
  _, pattern = attention.attend(
      q, k, v, is_causal=True, implementation="einsum",
      rules=score_rules.ScoreRules(sinks=logits))
  want = [np.mean([math.exp(s) / (i + 1 + math.exp(s)) for i in range(1, T)])
          for s in logits.tolist()]
  np.testing.assert_allclose(survey.sink_share(pattern), want, rtol=1e-5)
  want_key0 = [np.mean([1 / (i + 1 + math.exp(s)) for i in range(1, T)])
               for s in logits.tolist()]
  np.testing.assert_allclose(survey.key_share(pattern), want_key0, rtol=1e-5)


def test_induction_rows_mark_queries_with_an_earlier_copy():
  tokens = jnp.asarray([[5, 6, 7, 5, 6, 9]])
  # Query 3 (5) has key 1 after the earlier 5; query 4 (6) has key 2.
  np.testing.assert_array_equal(survey.induction_rows(tokens),
                                [[0, 0, 0, 1, 1, 0]])


def test_logit_range_known_values():
  s = np.zeros((1, 1, 1, 3, 3))
  s[..., 1, 0], s[..., 2, 1], s[..., 0, 2] = 6.0, -8.0, 100.0  # [0, 2]: masked
  r = survey.logit_range(s, cap=5.0)
  assert r["abs_max"][0] == 8.0
  assert r["abs_median"][0] == 0.0
  assert r["frac_above_cap"][0] == pytest.approx(2 / 6)
  assert r["row_max_median"][0] == 0.0  # row maxima 0, 6, 0


def test_bad_arguments_name_the_argument():
  with pytest.raises(ValueError, match=r"key_share: `pattern` must be"):
    survey.key_share(jnp.zeros((H, T, T)))
  with pytest.raises(ValueError, match=r"sink_share: `rows` must be \[B, T\]"):
    survey.sink_share(_uniform(), rows=jnp.ones((B, T + 1), bool))
  with pytest.raises(ValueError, match=r"key_share: `key`=6"):
    survey.key_share(_uniform(), 6)
  with pytest.raises(ValueError, match="uniform_key0_share: `length`"):
    survey.uniform_key0_share(1)


# ------------------------------------------------------- on a real decoder


def _model(**kw):
  config = model_config.ModelConfig(vocab_size=12, d_model=16, num_layers=2,
                                    num_heads=2, max_len=T,
                                    positions="rotary", **kw)
  return transformer.DecoderLM(config, rngs=nnx.Rngs(0))


TOKENS = jnp.asarray([[1, 4, 5, 6, 4, 5], [1, 7, 8, 9, 10, 11]])


def test_logits_are_the_scores_before_the_cap_and_the_pattern_the_hook():
  for cap in (None, 0.5):
    model = _model(logit_soft_cap=cap)
    logits, pattern = survey.attention_arrays(model, TOKENS)
    _, got = model(TOKENS, capture=("blocks.1.attn.scores",
                                    "blocks.1.attn.pattern"))
    seen = np.tril(np.ones((T, T), bool))
    scores = np.asarray(got["blocks.1.attn.scores"])
    want = logits[1] if cap is None else cap * np.tanh(logits[1] / cap)
    np.testing.assert_allclose(scores[..., seen], want[..., seen], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(pattern[1], got["blocks.1.attn.pattern"],
                               rtol=1e-5, atol=1e-6)  # jitted vs not


def test_sink_logits_and_shares_of_a_model_with_sinks():
  assert survey.sink_logits(_model()) is None
  model = _model(attention_sinks=True)
  np.testing.assert_array_equal(survey.sink_logits(model), np.zeros((2, 2)))
  _, pattern = survey.attention_arrays(model, TOKENS)
  sh = survey.head_shares(pattern, TOKENS)
  # Sink logit 0 is one more softmax column: a row keeps under 1.
  assert (sh["sink"] > 0.05).all() and (sh["sink"] < 0.5).all()
  np.testing.assert_allclose(sh["parked"], sh["key0"] + sh["sink"])
  plain = survey.head_shares(survey.attention_arrays(_model(), TOKENS)[1],
                            TOKENS)
  # Without sinks a row sums to 1 up to float32 rounding.
  np.testing.assert_allclose(plain["sink"], np.zeros((2, 2)), atol=1e-6)


def test_uniform_floor_of_the_shares():
  floor = survey.uniform_floor(TOKENS)
  assert floor["key0"] == pytest.approx(survey.uniform_key0_share(T))
  # Queries with a target: 4 (sees 5 keys) and 5 (6 keys), example 0 only.
  assert floor["key0_task"] == pytest.approx((1 / 5 + 1 / 6) / 2)
  assert floor["sink"] == 0.0


# ---------------------------------------------------------------- BOS option


@functools.lru_cache(maxsize=None)
def _make(cfg):
  return jax.jit(functools.partial(tasks.induction_batch, cfg=cfg))


def _induction(**overrides):
  cfg = default.get_config().task
  cfg.update(dict(batch_size=16, min_segment=2, max_segment=6), **overrides)
  cfg = ml_collections.FrozenConfigDict(cfg)
  return {k: np.asarray(v) for k, v in _make(cfg)(jax.random.key(3)).items()}


def test_bos_starts_every_sequence_and_shifts_the_rest_by_one():
  t = 16
  with_bos = _induction(seq_len=t, bos=True)
  # Without BOS and one token shorter, the same key draws the same pattern.
  plain = _induction(seq_len=t - 1)
  assert (with_bos["inputs"][:, 0] == tasks.BOS).all()
  assert (with_bos["inputs"][:, 1:] != tasks.BOS).all()
  np.testing.assert_array_equal(with_bos["inputs"][:, 1:], plain["inputs"])
  np.testing.assert_array_equal(with_bos["targets"][:, 1:], plain["targets"])
  np.testing.assert_array_equal(with_bos["targets"][:, 0],
                                plain["inputs"][:, 0])
  np.testing.assert_array_equal(with_bos["loss_mask"][:, 1:],
                                plain["loss_mask"])
  assert (with_bos["loss_mask"][:, 0] == 0).all()
  assert with_bos["loss_mask"].sum() > 0


def test_bos_off_is_the_batch_of_a_config_without_the_field():
  on = default.get_config().task
  off = ml_collections.ConfigDict({k: v for k, v in on.items() if k != "bos"})
  assert not on.bos
  a = _make(ml_collections.FrozenConfigDict(on))(jax.random.key(0))
  b = _make(ml_collections.FrozenConfigDict(off))(jax.random.key(0))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])


def test_bos_with_segments_that_no_longer_fit_names_the_field():
  # Two copies of 7 fit in seq_len + 1 = 14 tokens, not in the 13 after BOS.
  assert _induction(seq_len=13, max_segment=7)["loss_mask"].sum() > 0
  with pytest.raises(ValueError, match="config.task.max_segment: with bos"):
    _induction(seq_len=13, max_segment=7, bos=True)
  # Config validation says so too, before anything is built.
  config = default.get_config()
  config.task.update(seq_len=13, max_segment=7, bos=True)
  with pytest.raises(ValueError, match="config.task.max_segment: with bos"):
    config_lib.validate_config(config)


# -------------------------------------------------- the experiment, smoke


def test_smoke_run_writes_what_it_measured(tmp_path):
  exp = entry_points.load("sinks")
  config = importlib.import_module("configs.sinks").get_config("smoke")
  results = exp.run(config, tmp_path)
  assert json.loads((tmp_path / "results.json").read_text()) == results
  report = (tmp_path / "report.md").read_text()
  for fig in ("key0_share.png", "sink_share.png", "loss.png",
              "share_vs_ablation.png"):
    assert (tmp_path / fig).read_bytes()[:4] == b"\x89PNG"
    assert f"![{fig}]({fig})" in report
  assert "[explorer.html](explorer.html)" in report
  page = (tmp_path / "explorer.html").read_text()
  assert "sink logits" in page and "sinks+BOS" in page

  names = [s["name"] for s in sinks_run.settings(config)]
  assert set(results["runs"]) == set(names) and len(names) == 6
  seeds = [str(s) for s in config.experiment.seeds]
  summary = results["summary"]
  for name in names:
    runs = results["runs"][name]
    assert sorted(runs) == seeds
    loss = summary[name]["loss"]
    assert loss["values"] == [runs[s]["scalars"]["loss"] for s in seeds]
    assert loss["std"] == pytest.approx(np.std(loss["values"], ddof=1))
    for s in seeds:
      sh = runs[s]["shares"]
      has_sink = "sink_logits" in runs[s]
      assert has_sink == name.startswith("sinks")
      assert (np.asarray(sh["sink"]) > 1e-3).all() == has_sink
      assert has_sink or np.abs(sh["sink"]).max() < 1e-6  # rounding only
      assert runs[s]["scalars"]["key0_max"] == pytest.approx(
          np.max(sh["key0"]))
      assert np.shape(runs[s]["ablation"]) == (config.model.num_layers,
                                               config.model.num_heads)

  # The tables show the numbers results.json holds.
  shares = entry_points.table_by_label(report, "| setting | position 0, largest head |")
  x = summary["sinks+BOS"]["key0_max"]
  assert shares["sinks+BOS"][0] == (
      f"{x['mean']:.3f} ± {x['std']:.3f} "
      f"[{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]")
  uni = results["floors"]["uniform_key0_closed_form"]
  assert uni == pytest.approx(survey.uniform_key0_share(config.task.seq_len))
  assert shares["uniform causal"][0] == f"{uni:.3f}"
  late = summary["plain"]["key0_late_max"]
  assert shares["plain"][2].startswith(f"{late['mean']:.3f} ± ")
  assert shares["plain"][3] == "-"  # no sink without sinks
  sink = summary["sinks"]["sink_max"]
  assert shares["sinks"][3] == f"{sink['mean']:.3f} ± {sink['std']:.3f}"
  losses = entry_points.table_by_label(report, "| setting | loss |")
  assert losses["soft_cap"][1] == ", ".join(
      f"{v:.3f}" for v in summary["soft_cap"]["loss"]["values"])
  # Welch intervals are recomputed from the per-seed values.
  diff = results["comparisons"]["sinks+BOS - plain+BOS"]["loss"]
  want = stats.difference(summary["sinks+BOS"]["loss"]["values"],
                          summary["plain+BOS"]["loss"]["values"])
  assert diff["ci95"] == pytest.approx(want["ci95"])
  comp = entry_points.table_by_label(report, "| difference |")
  col = list(sinks_run.COMPARED).index("loss")
  assert comp["sinks+BOS - plain+BOS"][col] == (
      f"{want['diff']:+.3f} [{want['ci95'][0]:.3f}, {want['ci95'][1]:.3f}]")
  pooled = results["pooled_rank_correlation"]["plain"]["key0"]
  nl, nh = config.model.num_layers, config.model.num_heads
  assert pooled["all"]["n_heads"] == len(seeds) * nl * nh
  assert pooled["layer0"]["n_heads"] == len(seeds) * nh
  # The critical |rho| is the t approximation's: r = t / sqrt(n - 2 + t^2).
  assert sinks_run.rho_critical(12) == pytest.approx(0.576, abs=1e-3)
  tm = results["timing"]
  assert tm["wall_s"] > tm["train_s"] > 0
  assert tm["runs"] == tm["runs_trained_now"] == 6 * len(seeds)
  assert tm["train_s_all_runs"] == pytest.approx(tm["train_s"], rel=0.05)
  assert (f"Time: {tm['wall_s'] / 60:.1f} min wall for the whole command: "
          f"training the {tm['runs']} runs took") in report
  # Each run keeps the time its training took, for a later --reuse_runs.
  files = sorted(tmp_path.glob(f"*_seed*/{sinks_run.TIMING_FILE}"))
  assert len(files) == tm["runs"]
  assert sum(json.loads(f.read_text())["train_s"] for f in files) == (
      pytest.approx(tm["train_s_all_runs"]))
