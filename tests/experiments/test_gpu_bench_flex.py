"""Part e of the GPU benchmark (experiments/gpu_bench/flex.py) on the
CPU: the smoke config's tiny case, the Pallas GPU kernel in interpret
mode against the blockwise path, and the rules' pair counts against a
count on the grid. The timings themselves mean nothing on a CPU."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.gpu_bench import devices
from experiments.gpu_bench import flex
from experiments.gpu_bench import report

import entry_points


@pytest.mark.parametrize("rule", flex.RULES)
@pytest.mark.parametrize("n", [24, 40])
def test_allowed_pairs_equal_a_count_on_the_grid(rule, n):
  q, k = np.arange(n)[:, None], np.arange(n)[None, :]
  mod = flex.mask_mod(rule, n) or (lambda b, h, q, k: k <= q)
  assert flex.allowed_pairs(rule, n) == int(np.sum(mod(0, 0, q, k)))


def test_smoke_case_runs_and_its_table_shows_every_row():
  config = entry_points.config("gpu_bench")
  with config.unlocked():
    # FlexAttention (torch.compile on a CUDA device) is left to the whole
    # smoke run, tests/experiments/test_gpu_bench.py.
    config.flex.update(rules="documents", modes="fwdbwd",
                       contestants="pallas_gpu,cudnn,flash")
  part = flex.measure(config, devices.Budget(600, "flex"))
  rows = {r["contestant"]: r for r in part["rows"]}
  assert set(rows) == {"pallas_gpu", "cudnn", "flash"}
  for who in ("pallas_gpu", "flash"):  # run, in interpret mode for ours
    assert rows[who]["ms"] > 0 and 0 < rows[who]["visited"] < 1, rows[who]
  assert rows["cudnn"]["skipped"] == "not run: cuDNN has no user rules"
  table = report.flex_table({"parts": {"flex": part}, "order": ["flex"]})
  assert len(table.splitlines()) == 2 + len(part["rows"])
  assert f"{rows['pallas_gpu']['ms']:.3g}" in table


def test_verdicts_compare_the_kernel_with_each_peer_in_the_same_case():
  row = dict(Dh=64, n=8192, rule="causal", mode="fwd", visited=0.5,
             tflops=1.0)
  rows = [dict(row, contestant="pallas_gpu", ms=3.0),
          dict(row, contestant="cudnn", ms=2.0),
          dict(row, contestant="flex", skipped="not run: no CUDA"),
          dict(row, contestant="flash", ms=30.0),
          dict(row, n=32768, contestant="cudnn", ms=5.0)]
  assert report.flex_verdicts({"rows": rows}) == [
      "- Rules, causal, Dh=64, n=8,192, fwd: pallas_gpu takes 1.50x "
      "cuDNN's, 0.10x the blockwise path's time."]
