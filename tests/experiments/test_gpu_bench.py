"""The GPU benchmark (experiments/gpu_bench) end to end on the CPU.

The smoke config, trimmed so that every part runs once in seconds: the
random-weight SmolLM2 and Gemma 3 (toy sizes) agree with transformers on
the same weights within transformers' own float32 error (a check of the
conversion that does not go through the GGUF reader), every case holds
positive times, and the report's cells are results.json's numbers.
`make gpu-check` runs the whole smoke config (scripts/gpu_check.sh).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from experiments.gpu_bench import devices
from experiments.gpu_bench import long_context
from experiments.gpu_bench import report
from experiments.gpu_bench import train_steps
from mha_jax.measure import report as report_lib

import entry_points


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """`(config, results, workdir)` of one trimmed smoke run."""
  config = entry_points.config("gpu_bench")
  with config.unlocked():
    # One precision per part where the smoke run has three: the others
    # differ only in the context a program is traced in, which make
    # gpu-check's smoke run covers.
    config.train_step.precisions = "bf16"
    config.policy.precisions = "exact"
    config.lms.update(models="smollm2_135m,gemma3_270m", dtypes="float32")
    config.long_context.update(paths="auto,cudnn", subprocess=False)
  workdir = tmp_path_factory.mktemp("gpu_bench")
  results = entry_points.load("gpu_bench").run(config, workdir)
  print("part seconds:", results["part_s"])
  return config, results, workdir


def test_no_part_failed_and_every_case_has_positive_times(smoke):
  config, r, _ = smoke
  parts = r["parts"]
  assert [n for n, p in parts.items() if "error" in p] == []
  rows = parts["train_step"]["rows"]
  assert [x["precision"] for x in rows] == ["bf16"]
  for row in rows:
    c = row["contestants"]
    assert set(c) == {"mha_jax auto", "torch eager"}
    for who in c.values():
      assert len(who["step_s"]) == config.train_step.rounds
      assert min(who["step_s"]) > 0 and who["first_loss"] > 0
    assert "torch.compile" in row["skipped"]  # not in the smoke run
  for name in ("smollm2_135m", "gemma3_270m"):
    tasks = parts["lms"]["models"][name]["dtypes"]["float32"]["tasks"]
    assert set(tasks) == {"forward", "loss_grad", "decode"}
    for t in tasks.values():
      assert min(min(v) for v in t["times"].values()) > 0
  paths = parts["long_context"]["paths"]
  assert paths["auto"]["longest_n"] == config.long_context.n_max
  assert [a["n"] for a in paths["auto"]["attempts"]] == [16, 32]
  if r["facts"]["jax_backend"] != "gpu":
    assert paths["cudnn"]["status"].startswith("not run: needs a GPU")
  else:  # tried (cuDNN may refuse lengths this short; said so)
    assert paths["cudnn"]["status"] and paths["cudnn"]["attempts"]
  for row in parts["policy"]["rows"]:
    assert row["fwd_ms"] > 0 and row["fwdbwd_ms"] > 0


def test_random_weight_models_agree_with_transformers(smoke):
  _, r, _ = smoke
  for name in ("smollm2_135m", "gemma3_270m"):
    d = r["parts"]["lms"]["models"][name]["dtypes"]["float32"]
    lg = d["logits"]
    ours, theirs = lg["mha_jax_vs_float64"], lg["transformers_vs_float64"]
    # A real float32 run on both sides: not bit-equal to float64, and
    # mha_jax within twice transformers' own float32 error (the bound of
    # tests/real_models). A wrong layout or norm would be O(1).
    assert 0 < theirs["rel"] < 1e-5, name
    assert ours["rel"] <= 2 * theirs["rel"], (name, ours, theirs)
    assert ours["max_abs"] <= 4 * theirs["max_abs"], (name, ours, theirs)
    assert d["loss"]["mha_jax"] == pytest.approx(d["loss"]["transformers"],
                                                 rel=1e-5)
    assert d["decode_agreement"] == 4  # every greedy token


def test_float32_at_the_policy_is_within_rounding_of_float64(smoke):
  _, r, _ = smoke
  (row,) = r["parts"]["policy"]["rows"]
  assert row["precision"] == "exact" and 0 < row["error"]["rel"] < 1e-6


def test_report_shows_results_json(smoke):
  _, r, workdir = smoke
  text = (workdir / "report.md").read_text()
  assert report_lib.regenerate(workdir, report.render) == text
  (row,) = r["parts"]["train_step"]["rows"]
  train = entry_points.table(text, "| shape | precision |")
  assert train[0][3] == report.ms(np.median(
      row["contestants"]["mha_jax auto"]["step_s"]))
  assert train[0][6] == report.ratio_cell(
      row["ratios"]["mha_jax auto"]["torch eager"])
  speed = entry_points.table(text, "| model | dtype | task |")
  assert len(speed) == 2 * 3
  lms = r["parts"]["lms"]["models"]
  want = [f"{lms[m]['dtypes']['float32']['tasks'][t]['ratio']:.2f}"
          for m in ("smollm2_135m", "gemma3_270m")
          for t in ("forward", "loss_grad", "decode")]
  assert [row[5] for row in speed] == want
  agree = entry_points.table(text, "| model | dtype | max abs")
  lg = lms["gemma3_270m"]["dtypes"]["float32"]["logits"]
  assert agree[1][3:5] == [report.sci(lg["mha_jax_vs_float64"]["max_abs"]),
                           report.sci(lg["transformers_vs_float64"]
                                      ["max_abs"])]
  long_rows = entry_points.table_by_label(text, "| path | longest n")
  assert long_rows["`auto`"][0] == "32"
  policy = entry_points.table(text, "| path | precision | forward ms")
  exact = r["parts"]["policy"]["rows"][0]
  assert policy[0][2:4] == [f"{exact['fwd_ms']:.3g}",
                            f"{exact['fwdbwd_ms']:.3g}"]


def test_a_failed_or_unfinished_part_is_reported_not_hidden(smoke):
  _, r, _ = smoke
  saved = copy.deepcopy(r)
  saved["parts"]["lms"] = {"error": "RuntimeError: boom", "traceback": ""}
  del saved["parts"]["policy"]
  text = report.render(saved)
  assert "Parts that failed: lms (`RuntimeError: boom`)" in text
  assert "failed: `RuntimeError: boom`" in text
  assert "not run: the run stopped before it." in text


def test_a_spent_budget_skips_cases_saying_so():
  config = entry_points.config("gpu_bench")
  spent = devices.Budget(0.0, "train_step")
  out = train_steps.measure(config, spent)
  assert out["rows"] and all(
      x["skipped_all"].startswith("skipped: train_step's share of the time "
                                  "budget") for x in out["rows"])


@pytest.mark.parametrize("text,oom", [
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 34.0GiB",
     True),
    ("XlaRuntimeError: INTERNAL: CUDA error: out of memory", True),
    ("ValueError: attend: q and k head widths differ", False)])
def test_out_of_memory_is_told_from_other_errors(text, oom):
  assert long_context.is_oom(text) is oom


def test_the_librarys_refusal_of_dense_scores_is_recognised():
  """A dense path asked for scores larger than the device is refused by
  mha_jax while tracing; the search records that, not a failure."""
  import jax  # pylint: disable=import-outside-toplevel
  from mha_jax.core import device_memory  # pylint: disable=import-outside-toplevel
  have, _ = device_memory.capacity()
  n = 1 << ((have // (4 * 8)).bit_length() // 2 + 1)  # n*n*8*4 > have
  q = jax.ShapeDtypeStruct((1, n, 8, 64), "bfloat16")
  with pytest.raises(ValueError) as e:
    jax.eval_shape(lambda q: long_context.attention.attend(
        q, q, q, is_causal=True, implementation="einsum"), q)
  assert long_context.is_refused(e.value) and not long_context.is_oom(
      e.value)


def test_lengths_double_up_to_the_cap():
  assert long_context.lengths(8192, 65536) == [8192, 16384, 32768, 65536]
  assert long_context.lengths(16, 8) == []
