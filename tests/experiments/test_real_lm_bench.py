"""The real-LM benchmark: its op classes on known programs, and the smoke
run end to end (a tiny random Llama written by transformers and read back
by mha_jax), whose report shows results.json's numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.real_lm_bench import profile
from experiments.real_lm_bench import report
from mha_jax.measure import report as report_lib

import entry_points


@pytest.mark.cpu_only("the CPU backend's compiled HLO (a `dot` per "
                      "matmul) and its trace events named by HLO "
                      "instruction; a GPU's trace names kernels and its "
                      "HLO may hold cuBLAS custom-calls")
def test_xla_ops_classes_a_matmul_and_a_reduction():
  f = jax.jit(lambda a, b: (jnp.tanh(a @ b).sum(1), jnp.exp(a).max(0)))
  a = jnp.ones((64, 64))
  out = profile.xla_ops(f, (a, a), calls=2)
  assert out["kinds"]["matmul"] > 0
  assert out["kinds"]["softmax, norms, reductions"] > 0
  assert out["kinds"]["attention kernel"] == 0  # XLA has no such kernel
  assert sum(out["kinds"].values()) == pytest.approx(out["total"])


def test_torch_ops_counts_each_op_once_by_self_time():
  import torch  # pylint: disable=import-outside-toplevel
  a = torch.ones(64, 64)
  out = profile.torch_ops(lambda: torch.tanh(a @ a).sum(), calls=2)
  assert out["kinds"]["matmul"] > 0 and out["kinds"]["elementwise"] > 0
  assert sum(out["kinds"].values()) == pytest.approx(out["total"])


def test_profile_tables_show_each_kind_and_the_difference():
  kinds = dict.fromkeys(profile.KINDS, 0.0)
  j = {"kinds": {**kinds, "matmul": 30.0}, "total": 30.0,
       "top": [["ynn_fusion.3", "matmul", 30.0]]}
  t = {"kinds": {**kinds, "matmul": 20.0, "elementwise": 5.0},
       "total": 25.0, "top": [["aten::mm", "matmul", 20.0]]}
  text = report.profile_tables({"profile": {"forward": {
      "mha_jax einsum": j, "torch 2 threads": t}}})
  rows = entry_points.table_by_label(text, "| kind |")
  assert rows["matmul"] == ["30.0", "20.0", "+10.0"]
  assert rows["elementwise"] == ["0.0", "5.0", "-5.0"]
  assert rows["all ops"] == ["30.0", "25.0", "+5.0"]


@pytest.mark.parametrize("ops,kind", [
    ({"dot", "add"}, "matmul"), ({"reduce", "exponential"},
                                 "softmax, norms, reductions"),
    ({"scatter", "add"}, "gather, scatter, slices"),
    ({"transpose", "copy"}, "copies and layout"),
    ({"multiply", "tanh"}, "elementwise")])
def test_classify_by_the_ops_a_fusion_runs(ops, kind):
  assert profile.classify(ops) == kind


@pytest.mark.parametrize("name,kind", [
    ("aten::mm", "matmul"), ("aten::tanh", "elementwise"),
    ("aten::t", "copies and layout"), ("aten::_log_softmax",
                                       "softmax, norms, reductions"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu",
     "attention kernel"), ("MmBackward0", "other"),
    ("aten::index_select", "gather, scatter, slices")])
def test_torch_kind_by_exact_name(name, kind):
  assert profile.torch_kind(name) == kind


def test_smoke_run_agrees_with_transformers_and_reports(tmp_path):
  config = entry_points.config("real_lm_bench")
  # The profiles' parts are tested above; here they would compile every
  # program a second time.
  config.experiment.profile = False
  results = entry_points.load("real_lm_bench").run(config, tmp_path)
  saved_report = (tmp_path / "report.md").read_text()
  assert report_lib.regenerate(tmp_path, report.render) == saved_report
  e = config.experiment
  names = results["contestants"]
  assert names == ["mha_jax einsum", "torch 2 threads", "torch 1 thread"]
  # Same weights, same work: mha_jax's logits, loss and greedy tokens are
  # transformers' within float32 rounding.
  a = results["agree"]["mha_jax einsum"]
  assert a["forward_rel"] < 1e-5
  assert a["loss"] == pytest.approx(results["agree"]["torch 1 thread"]
                                    ["loss"], rel=1e-5)
  assert a["tokens"] == e.new_tokens
  # A prompt of the same bucket decodes without compiling.
  assert results["second_prompt_call"]["mha_jax einsum"]["compiles"] == 0
  # Ratios are per round, to the reference's time in that round.
  t = results["times"]["forward"]
  np.testing.assert_allclose(
      results["ratios"]["torch 2 threads"]["forward"]["mha_jax einsum"],
      np.asarray(t["mha_jax einsum"]) / np.asarray(t["torch 2 threads"]))
  rows = entry_points.table(saved_report, "| task | contestant |")
  assert len(rows) == 3 * len(names)
  second = entry_points.table_by_label(saved_report, "| contestant | seconds")
  assert second["mha_jax einsum"][1] == "0"
  # The roofline's numerators, by the closed form of the tiny Llama: per
  # layer q, k, v, o and the gated MLP's three products, the [T, T]
  # scores and their mix per query head; then the readout. The gradient
  # is three forwards (each product's input and weight gradients); decode
  # reads every float32 parameter once per new token.
  t = e.tiny
  d, f, h, kv = (t.hidden_size, t.intermediate_size, t.num_attention_heads,
                 t.num_key_value_heads)
  dh, n = d // h, e.tokens
  layer = (2 * n * d * (2 * h * dh + 2 * kv * dh) + 3 * 2 * n * d * f
           + 2 * 2 * h * n * n * dh)
  forward = t.num_hidden_layers * layer + 2 * n * d * t.vocab_size
  params = (t.vocab_size * d + d + t.num_hidden_layers
            * (2 * d + d * (2 * h * dh + 2 * kv * dh) + 3 * d * f))
  roof = results["roofline"]
  assert roof["work"] == {"forward": forward, "loss_grad": 3 * forward,
                          "decode": e.new_tokens * 4 * params}
  # Each share is the round's rate over the same round's yardstick rate.
  rate = roof["rates"]["plain matmul"]  # FLOP/s per round
  seconds = results["times"]["forward"]["mha_jax einsum"]
  assert len(seconds) == len(rate) == e.rounds
  share = [forward / x / y for x, y in zip(seconds, rate)]
  assert roof["share"]["forward"]["mha_jax einsum"]["max"] == (
      pytest.approx(max(share)))
  shares = entry_points.table_by_label(saved_report, "| task | work per")
  assert shares["decode"][0] == f"{e.new_tokens * 4 * params / 1e9:.3g} GB "\
      "of weights"
  m = roof["share"]["forward"]["mha_jax einsum"]
  assert shares["forward"][2] == (f"{100 * m['median']:.0f}% "
                                  f"[{100 * m['min']:.0f}, {100 * m['max']:.0f}]")
  # The smoke run, inside the suite's process, leaves glibc as it is, and
  # its report says so.
  assert results["keep_freed_memory"]["applied"] is False
  assert "freed host memory: glibc's default (off in the config)" in (
      saved_report)


def test_the_report_says_how_freed_memory_was_treated():
  assert report_lib.freed_memory({
      "applied": True, "reason": "glibc mallopt"}) == "kept for reuse"
  assert report_lib.freed_memory({
      "applied": False, "reason": "tcmalloc preloaded"}) == (
          "glibc's default (tcmalloc preloaded)")
  assert "predates" in report_lib.freed_memory(None)


def test_the_full_run_keeps_freed_memory_and_warms_up_first():
  # The einsum gradient faulted ~1.5 GB of pages a call without it
  # (docs/performance_real.md); the smoke run, in the suite's processes,
  # does not change their allocator.
  full = entry_points.config("real_lm_bench", None)
  assert full.keep_freed_memory and full.experiment.warm_rounds >= 1
  assert not entry_points.config("real_lm_bench").keep_freed_memory


def test_loop_state_bytes_counts_a_loops_carried_arrays_by_dtype():
  from experiments.real_lm_bench import weight_dtype  # pylint: disable=import-outside-toplevel

  def body(_, c):
    x, y = c
    return jnp.tanh(x) * 2.0, y * y
  f = jax.jit(lambda n, x, y: jax.lax.fori_loop(0, n, body, (x, y)))
  x, y = jnp.ones((8, 8), jnp.float32), jnp.ones((4, 4), jnp.bfloat16)
  hlo = f.lower(3, x, y).compile().as_text()
  sizes = weight_dtype.loop_state_bytes(hlo)
  assert sizes["f32"] == 8 * 8 * 4 and sizes["bf16"] == 4 * 4 * 2
  assert weight_dtype.loop_state_bytes("ENTRY %m () -> f32[] {}") == {}
