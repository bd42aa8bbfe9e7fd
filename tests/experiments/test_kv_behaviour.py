"""The behaviour study's bookkeeping: names, summaries, comparisons, answer.

Synthetic per-seed results with hand-computed means, sample stds and
intervals; no model is trained here (tests/experiments/test_experiments.py runs
experiments.kv_behaviour).
"""

import numpy as np
import pytest

from configs import kv_behaviour
from experiments.kv_behaviour import variants
from experiments.kv_cache import report as kv_cache_report
from mha_jax.measure import curves
from mha_jax.measure import runs

STEPS = [100, 200, 300]


def _seed(loss, first, k, params):
  return {"eval_loss": loss, "eval_accuracy": 1 - loss,
          "first_step_below": first, "generation_token_accuracy": 1 - loss,
          "generation_sequence_accuracy": 0.5, "teacher_forced_accuracy": 0.9,
          "params": params,
          "attention_params_per_layer": 64 * 8 * (8 + 2 * k) + 8 * 8 * 64,
          "cache_bytes_per_token": 2 * 2 * k * 8 * 4,
          "curve": {"steps": STEPS, "loss": [3.0, 2.0, loss]}}


SPECS = [{"key": "K8", "name": "MHA", "num_kv_heads": 8, "head_dim": 8,
          "matched": False},
         {"key": "K1", "name": "MQA", "num_kv_heads": 1, "head_dim": 8,
          "matched": False}]


def _variants():
  per_seed = {
      "K8_seed0": _seed(0.2, 100, 8, 1000),
      "K8_seed1": _seed(0.4, 200, 8, 1000),
      "K8_seed2": _seed(0.3, 100, 8, 1000),
      "K1_seed0": _seed(1.0, None, 1, 800), "K1_seed1": _seed(1.2, 300, 1, 800),
      "K1_seed2": _seed(1.1, 300, 1, 800)}
  return variants.summarise(SPECS, (0, 1, 2), per_seed, num_steps=300)


def test_variant_names():
  assert [variants.variant_name(8, k) for k in (8, 4, 2, 1)] == [
      "MHA", "GQA (H/2)", "GQA (H/4)", "MQA"]


def test_summary_keeps_every_seed_with_sample_std_and_interval():
  mha, mqa = _variants()
  loss = mha["eval_loss"]
  assert loss["values"] == [0.2, 0.4, 0.3]
  np.testing.assert_allclose([loss["mean"], loss["std"]], [0.3, 0.1])
  # t(0.975, 2) = 4.3027: 0.3 ± 4.3027 * 0.1 / sqrt(3).
  np.testing.assert_allclose(loss["ci95"], [0.3 - 0.248414, 0.3 + 0.248414],
                             atol=1e-5)
  t = mqa["time_to_drop"]
  assert t["per_seed"] == [None, 300, 300] and t["reached"] == 2
  assert t["median"] == 300 and t["censored_at"] == 300
  assert t["survival"] == {"steps": STEPS,
                           "fraction_above": [1.0, 1.0, 1 / 3]}
  rows = variants.table_rows([mha, mqa], loss_threshold=1.0)
  assert rows[0]["eval loss"] == "0.300 ± 0.100 [0.052, 0.548]"
  assert rows[1]["first eval step with loss < 1"] == "median 300 (2/3 seeds)"
  assert rows[0]["first eval step with loss < 1"] == "median 100 (3/3 seeds)"


def test_compare_uses_welch_and_skips_means_over_censored_runs():
  mha, mqa = _variants()
  c = variants.compare(mha, mqa)
  d = c["eval_loss"]
  np.testing.assert_allclose(d["diff"], 0.8)
  assert d["excludes_0"] and d["ci95"][0] > 0
  # Equal sample stds (0.1): the pooled std is 0.1.
  from mha_jax.measure import stats  # pylint: disable=g-import-not-at-top
  np.testing.assert_allclose(d["detectable"],
                             stats.detectable_difference(0.1, 3))
  # An MQA seed never dropped: no mean difference, but a log-rank p.
  assert c["time_to_drop"]["mean_difference"] is None
  assert 0 < c["time_to_drop"]["logrank_p"] < 1


def test_behaviour_answer_quotes_the_interval():
  mha, mqa = _variants()
  behaviour = {"variants": [mha, mqa],
               "comparisons": [variants.compare(mha, mqa)]}
  answer = kv_cache_report._behaviour_answer  # pylint: disable=protected-access
  text = answer(behaviour)
  lo, hi = behaviour["comparisons"][0]["eval_loss"]["ci95"]
  assert (f"its mean loss is +0.800 from MHA's (95% interval [{lo:+.3f}, "
          f"{hi:+.3f}], which excludes 0)") in text
  assert "a cache of 0.125 of MHA's" in text
  assert "800 instead of 1000 parameters" in text
  assert answer(None) is None


def test_survival_helpers():
  assert curves.survival_curve([100, None, 300, 200], [100, 200, 300]) == [
      0.75, 0.5, 0.25]
  assert curves.median_step([100, None, 300, 200]) == 200
  assert curves.median_step([None, None, 300]) is None
  assert curves.logrank_p([None], [None], 300) is None
  with pytest.raises(ValueError, match="empty"):
    curves.survival_curve([], [1])


def test_matched_head_dim_is_closest_even_width():
  config = kv_behaviour.get_config()
  dh, params, ref = variants.matched_head_dim(config, 1)
  assert dh % 2 == 0
  # MQA at Dh = 8 is far smaller; the matched width is within a few %.
  small = variants.config_param_count(
      runs.variant(config, **{"model.num_kv_heads": 1}))
  assert small < 0.7 * ref and abs(params - ref) < 0.03 * ref
  for other in (dh - 2, dh + 2):
    n = variants.config_param_count(runs.variant(
        config, **{"model.num_kv_heads": 1, "model.head_dim": other}))
    assert abs(n - ref) >= abs(params - ref)
