"""The behaviour study's bookkeeping: names, spreads, thresholds, the answer.

Synthetic per-seed results with hand-computed means and spreads; no model
is trained here (tests/test_experiments.py runs experiments.kv_behaviour).
"""

import numpy as np

from experiments import kv_cache_report
from mha_jax import kv_variants


def _seed(loss, first, k):
  return {"eval_loss": loss, "eval_accuracy": 1 - loss,
          "first_step_below": first, "generation_token_accuracy": 1 - loss,
          "generation_sequence_accuracy": 0.5, "teacher_forced_accuracy": 0.9,
          "attention_params_per_layer": 64 * 8 * (8 + 2 * k) + 8 * 8 * 64,
          "cache_bytes_per_token": 2 * 2 * k * 8 * 4}


def test_variant_names():
  assert [kv_variants.variant_name(8, k) for k in (8, 4, 2, 1)] == [
      "MHA", "GQA (H/2)", "GQA (H/4)", "MQA"]


def test_summary_means_spreads_and_answer():
  per_seed = {"K8_seed0": _seed(0.2, 100, 8), "K8_seed1": _seed(0.4, 150, 8),
              "K1_seed0": _seed(1.0, None, 1), "K1_seed1": _seed(1.2, 300, 1)}
  mha, mqa = kv_variants.summarise(8, (8, 1), (0, 1), per_seed)
  assert (mha["name"], mqa["name"]) == ("MHA", "MQA")
  np.testing.assert_allclose([mha["eval_loss"]["mean"],
                              mha["eval_loss"]["std"]], [0.3, 0.1])
  assert mqa["eval_loss"]["min"] == 1.0 and mqa["eval_loss"]["max"] == 1.2
  assert mqa["first_step_below"]["reached"] == 1
  assert mqa["first_step_below"]["per_seed"] == [None, 300]
  rows = kv_variants.table_rows([mha, mqa], loss_threshold=1.0)
  assert rows[0]["eval loss"] == "0.300 ± 0.100 [0.200, 0.400]"
  assert rows[1]["first step loss < 1"] == "300 (1/2 seeds)"
  answer = kv_cache_report._behaviour_answer  # pylint: disable=protected-access
  text = answer({"variants": [mha, mqa]})
  # MQA - MHA = +0.800, beyond 2 * max(std) = 0.200; cache 1/8 of MHA's.
  assert "+0.800 from MHA's, beyond twice the larger seed std (0.200)" in text
  assert "a cache of 0.125 of MHA's" in text
  assert answer(None) is None
