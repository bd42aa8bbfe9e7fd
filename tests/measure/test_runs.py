"""Run plumbing: config variants, loss-curve landmarks and report writing.

The pieces whose mistakes would silently skew a report; whole experiments
run end to end in tests/experiments/test_experiments.py.
"""

import json

import numpy as np
import pytest

from configs import two_offsets as two_offsets_config
from mha_jax.measure import report as report_lib
from mha_jax.measure import curves
from mha_jax.measure import runs


def test_variant_overrides_and_validates():
  base = two_offsets_config.get_config()
  c = runs.variant(base, **{"model.num_heads": 8, "train.seed": 3})
  assert (c.model.num_heads, c.train.seed) == (8, 3)
  assert (base.model.num_heads, base.train.seed) == (4, 0)  # a copy
  with pytest.raises(ValueError, match="num_heads"):
    runs.variant(base, **{"model.num_heads": 3})  # 64 % 3 != 0
  with pytest.raises(ValueError, match="'group.field'.*'num_heads'"):
    runs.variant(base, **{"num_heads": 8})


def test_phase_change_finds_the_steepest_drop():
  pc = curves.phase_change([0, 50, 100, 150], [3.0, 2.9, 1.0, 0.9])
  assert (pc["from_step"], pc["to_step"]) == (50, 100)
  np.testing.assert_allclose(pc["drop"], 1.9)
  with pytest.raises(ValueError, match="phase_change: needs >= 2"):
    curves.phase_change([50], [1.0])


def test_first_below_and_read(tmp_path):
  assert curves.first_below([50, 100, 150], [2.0, 0.9, 0.5], 1.0) == 100
  assert curves.first_below([50, 100], [2.0, 1.5], 1.0) is None
  rows = [{"step": 1, "split": "train", "loss": 3.0},
          {"step": 2, "split": "eval", "loss": 2.0, "accuracy": 0.1},
          {"step": 4, "split": "eval", "loss": 1.5, "accuracy": 0.3}]
  (tmp_path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows))
  assert curves.read(tmp_path) == ([2, 4], [2.0, 1.5])
  assert curves.read(tmp_path, "eval", "accuracy") == ([2, 4], [0.1, 0.3])
  assert curves.read(tmp_path, "train") == ([1], [3.0])


def test_md_table_mean_std_and_write_outputs(tmp_path):
  table = report_lib.md_table(["a", "b"], [[1, 2]])
  assert table == "| a | b |\n|---|---|\n| 1 | 2 |"
  m, s = report_lib.mean_std([1.0, 3.0, 5.0])  # the sample std: ddof 1
  assert (m, s) == (3.0, 2.0)
  assert report_lib.fmt(m, s, digits=1) == "3.0 ± 2.0"
  assert report_lib.fmt(*report_lib.mean_std([4.0])) == "4.000"  # no spread
  results = {"runs": [{"loss": np.float32(0.5), "big": np.ones((2, 2)),
                       "heads": np.arange(2)}], "n": np.int64(3)}
  written = report_lib.write_outputs(tmp_path, results, "# Title\n\n",
                                 drop=("big",))
  assert written == {"runs": [{"loss": 0.5, "heads": [0, 1]}], "n": 3}
  assert json.loads((tmp_path / "results.json").read_text()) == written
  assert (tmp_path / "report.md").read_text() == "# Title\n"
