"""The score-rules benchmark's smoke run end to end: results.json equals
what `run` returned, the report regenerates from it and shows its
numbers, and the blockwise kernel's answers agree."""

import json

import ml_collections
import numpy as np
import pytest

from experiments.score_rules_bench import report
from experiments.score_rules_bench import run as run_lib
from mha_jax.measure import report as report_lib

import entry_points


@pytest.mark.cpu_only("the window is walked as spans on the CPU backend "
                      "only (results' `spans` is None elsewhere)")
def test_smoke_run_reports_its_numbers(tmp_path):
  config = entry_points.config("score_rules_bench")
  results = entry_points.load("score_rules_bench").run(config, tmp_path)
  text = (tmp_path / "report.md").read_text()
  assert json.loads((tmp_path / "results.json").read_text()) == results
  assert report_lib.regenerate(tmp_path, report.render) == text
  rows = entry_points.table(text, "| n | rule | flash_skip |")
  for row, case in zip(rows, results["cases"]):
    assert row[:2] == [str(case["n"]), case["rule"]]
    skip = case["paths"]["flash_skip"]
    assert row[2].startswith(f"{skip['median_s']:.3g} s")
    for res in case["paths"].values():
      assert res["max_abs_diff"] < 1e-5  # every path gives one answer
  # The roofline: the rule's work (4 B H Dh per allowed pair: 8
  # documents of 128, causal; the 128-key window) beside each path.
  work = {c["rule"]: c["work_flops"] for c in results["cases"]}
  per_pair = 4 * config.batch * config.heads * config.head_dim
  assert work == {"documents": per_pair * 8 * 128 * 129 // 2,
                  "window": per_pair * (128 * 129 // 2 + 896 * 128)}
  roof = entry_points.table(text, "| n | rule | rule's work, GFLOP |")
  assert [r[2] for r in roof] == [f"{c['work_flops'] / 1e9:.3g}"
                                  for c in results["cases"]]
  blocks = {c["rule"]: c["blocks"] for c in results["cases"]}
  # n = 1024 on blocks of 128: 8 documents of one block each (causal:
  # 8 partial diagonal blocks), and a 128-key window (8 diagonal and 7
  # sub-diagonal blocks, all crossed by the window's edge).
  assert blocks["documents"]["computed"] == 8
  assert blocks["window"]["computed"] == 15
  # The window's mask on blocks of 64 is banded: each query block sees
  # key blocks i-2..i, spans of 3 (16 x 3 = 48 computed, 1 + 2 + 14 x 3 =
  # 45 listed); the documents' is not (their runs reach back to the start).
  spans = {c["rule"]: c["spans"] for c in results["cases"]}
  assert spans["window"] == {"block": 64, "length": 3, "computed": 48,
                             "listed": 45, "blocks": 256}
  assert spans["documents"] is None


@pytest.mark.parametrize("name,n,documents,window", [
    ("documents", 1000, 8, 512),  # 8 documents of 125
    ("documents", 1001, 8, 512),  # 7 of 126 and a last one of 119
    ("window", 1000, 8, 128),
    ("window", 100, 8, 128),  # a window longer than the sequence
])
def test_the_rules_work_counts_the_pairs_its_mask_allows(name, n, documents,
                                                          window):
  """The roofline's numerator in closed form against the rule's own
  mask_mod evaluated on every (query, key) pair."""
  config = ml_collections.ConfigDict(dict(documents=documents, window=window))
  mask_mod, _ = run_lib.rule_of(name, n, config)
  idx = np.arange(n)
  allowed = np.asarray(mask_mod(0, 0, idx[:, None], idx[None, :]))
  assert run_lib.allowed_pairs(name, n, config) == int(allowed.sum())
