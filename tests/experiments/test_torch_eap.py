"""The torch peer of edge attribution patching
(experiments/eap_ioi/torch_eap.py) gives mha_jax's scores.

One tiny random Llama (tests/hf_models.py: 2 layers, 4 query heads on 2
kv heads, d_model 32, Llama 3 rotary bands, every weight redrawn), saved
by transformers and loaded by mha_jax, so both read the same weights. The
metric is a logit difference at a per-prompt position, on 3 random
prompts with random corrupted ones.

Bounds. The reference is the peer in float64 (its own RMSNorm and rotary
angles, so float64 throughout; transformers' RMSNorm would compute in
float32). The peer's float32 scores sit 0.9e-6 (EAP) and 1.3e-6 (EAP-IG,
3 steps) from it, relative in norm over the edges: its own float32 noise
floor. mha_jax's float32 scores measured 0.81 and 0.96 times that floor,
so they must be within twice the peer's own float32 error, as in
tests/pretrained/test_pretrained_agreement.py.
"""

from __future__ import annotations

import copy
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mha_jax  # pylint: disable=g-import-not-at-top
from configs import eap_ioi_bench as configs_bench  # pylint: disable=g-import-not-at-top
from experiments.eap_ioi import bench  # pylint: disable=g-import-not-at-top
from experiments.eap_ioi import bench_report  # pylint: disable=g-import-not-at-top
from experiments.eap_ioi import torch_eap  # pylint: disable=g-import-not-at-top
from mha_jax.interp import eap  # pylint: disable=g-import-not-at-top
from mha_jax.interp import eap_graph  # pylint: disable=g-import-not-at-top
from mha_jax.measure import report as report_lib  # pylint: disable=g-import-not-at-top

import hf_models  # pylint: disable=g-import-not-at-top

U32 = 2.0 ** -24  # float32's unit roundoff
STEPS = 3  # EAP-IG's points: more than one, so the path's ends matter
B, T = 3, 8


def rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """`(transformers float32, its float64 copy, mha_jax model, batch)`;
  batch: clean and corrupted `[B, T]`, and per prompt the position read
  and the two tokens whose logit difference is the metric."""
  torch.set_num_threads(1)
  transformers.utils.logging.disable_progress_bar()
  directory = tmp_path_factory.mktemp("llama")
  hf = hf_models.build("llama", directory)
  rng = np.random.default_rng(0)
  batch = dict(clean=rng.integers(3, hf_models.VOCAB, (B, T)),
               corrupted=rng.integers(3, hf_models.VOCAB, (B, T)),
               end=np.array([T - 1, 5, 6]),
               io=rng.integers(3, hf_models.VOCAB, B),
               s=rng.integers(3, hf_models.VOCAB, B))
  return (hf, copy.deepcopy(hf).double(), mha_jax.load_pretrained(directory),
          batch)


def _metric(xp, batch):
  """logits `[B, T, V]` -> mean of logit(io) - logit(s) at `end`, in
  either library (`xp`: torch or jax.numpy)."""
  end, io, s = batch["end"], batch["io"], batch["s"]

  def metric(logits):
    rows = xp.arange(len(end))
    return (logits[rows, end, io] - logits[rows, end, s]).mean()
  return metric


def _torch_scores(hf, batch, method):
  return torch_eap.edge_scores(
      hf, torch.as_tensor(batch["clean"]), torch.as_tensor(batch["corrupted"]),
      _metric(torch, batch), method=method, steps=STEPS).detach().numpy()


def test_labels_and_edges_are_eap_graphs(tiny):
  hf, _, model, _ = tiny
  g = eap_graph.graph(model)
  assert torch_eap.labels(hf.config) == (list(g.senders), list(g.receivers))
  np.testing.assert_array_equal(torch_eap.exists(hf.config).numpy(), g.exists)


def test_its_forward_is_transformers_and_its_senders_sum_to_the_stream(tiny):
  """The peer's own forward (per-receiver copies of the stream, eps = 0)
  in float64 against transformers' float32 run: 5.2e-7 relative (9
  float32 roundings, transformers' own error); a wrong rotary band, kv
  head or norm errs by O(1)."""
  hf, hf64, _, batch = tiny
  tokens = torch.as_tensor(batch["clean"])
  with torch.no_grad():
    want = hf(tokens).logits
    logits, senders = torch_eap._forward(hf64, tokens)  # pylint: disable=protected-access
    # Llama has no biases: the stream the logits read is the senders' sum.
    again = hf64.lm_head(torch_eap._rms(hf64.model.norm, senders.sum(2)))  # pylint: disable=protected-access
  assert rel(logits, want) < 32 * U32, rel(logits, want) / U32
  assert rel(again, logits) < 1e-12


@pytest.mark.parametrize("method", eap.METHODS)
def test_scores_equal_mha_jax_within_twice_the_peers_own_error(tiny, method):
  hf, hf64, model, batch = tiny
  scores = jax.jit(lambda c, x: eap.edge_scores(
      model, c, x, _metric(jnp, batch), method=method, steps=STEPS).scores)(
          jnp.asarray(batch["clean"]), jnp.asarray(batch["corrupted"]))
  ours, t32, t64 = (np.asarray(scores), _torch_scores(hf, batch, method),
                    _torch_scores(hf64, batch, method))
  edges = eap_graph.graph(model).exists
  floor = rel(t32[edges], t64[edges])
  assert 0 < floor < 50 * U32, floor / U32  # a real float32 run
  err = rel(ours[edges], t64[edges])
  assert err <= 2 * floor, (err, floor)
  assert (ours[~edges] == 0).all() and (t32[~edges] == 0).all()


def test_the_benchmarks_chunks_of_prompts_give_the_whole_sets_scores(tiny):
  """The benchmark scores torch's prompts in chunks where their autograd
  graph would not fit: chunks of 2 and 1 (of 3 prompts, so one chunk is
  short), weighted by their share, against one call, in float64."""
  _, hf64, _, batch = tiny
  p = dict(tokens=batch["clean"], corrupted=batch["corrupted"],
           end=batch["end"], io=batch["io"], s=batch["s"])
  for method in eap.METHODS:
    whole = _torch_scores(hf64, batch, method)
    for size in (2, 1):
      e = ml_collections.ConfigDict(dict(peer_chunk=size, ig_steps=STEPS))
      got = bench.torch_scores(hf64, p, method, e).numpy()
      assert rel(got, whole) < 1e-13, (method, size, rel(got, whole))
  for bad in (-1, 1.5, True):
    e = ml_collections.ConfigDict(dict(peer_chunk=bad, ig_steps=STEPS))
    with pytest.raises(ValueError, match="peer_chunk: expected an int >= 0"):
      bench.torch_scores(hf64, p, "eap", e)


def test_the_benchmarks_smoke_run_runs_end_to_end(tmp_path):
  """configs/eap_ioi_bench.py:smoke: a tiny random Llama written by
  transformers, 8 IOI prompts, 2 rounds. Its report regenerates from
  results.json; the two libraries' float32 scores there differ by
  1.8e-6 and 1.2e-6 in norm (a bug errs by O(1))."""
  config = configs_bench.get_config("smoke")
  config.experiment.threads = 1  # the suite's workers: a core each
  results = bench.run(config, tmp_path)
  assert json.loads((tmp_path / "results.json").read_text()) == results
  assert report_lib.regenerate(tmp_path, bench_report.render) == (
      tmp_path / "report.md").read_text()
  assert results["edges"] == 82 and results["prompts"] == 8
  # The run records how glibc treated freed memory, and says so.
  assert results["keep_freed_memory"]["applied"] is False
  assert "freed host memory:\nglibc's default (off in the config)" in (
      tmp_path / "report.md").read_text()
  # The roofline: both libraries' share of the same rounds' matmul rate,
  # over mha_jax's compiled products (fewer than its jaxpr asks for).
  roof = results["roofline"]
  assert len(roof["rates"]) == config.experiment.rounds
  assert "## Against the machine's own rate" in (tmp_path /
                                                 "report.md").read_text()
  for method in eap.METHODS:
    assert set(roof["share"][method]) == {"mha_jax", "torch"}
    r = results["methods"][method]
    assert len(r["ratio"]["rounds"]) == config.experiment.rounds
    assert r["agree"]["rel_norm"] < 1e-5, r["agree"]
    assert r["agree"]["top_k_shared"] == r["agree"]["top_k"]


@pytest.mark.parametrize("folder,flags", [
    ("bench", ()),
    ("bench_128", ("--config.experiment.prompts=128",
                   "--config.experiment.peer_chunk=16"))])
def test_the_committed_benchmark_reports_regenerate(folder, flags):
  """docs/results/eap_ioi/bench (against torch, 64 prompts) and bench_128
  (128 prompts, torch's in chunks of 16): each report renders again from its results.json, with
  the command it names."""
  path = pathlib.Path(__file__).resolve().parents[2] / (
      f"docs/results/eap_ioi/{folder}")
  workdir = "runs/eap_ioi_bench" + ("_128" if folder == "bench_128" else "")
  command = report_lib.command_line(["", f"--workdir={workdir}", *flags],
                                    "experiments.eap_ioi.bench")
  assert report_lib.regenerate(
      path, functools.partial(bench_report.render, command=command)) == (
          path / "report.md").read_text()


@pytest.mark.parametrize("field,value,needle", [
    ("matmul_n", 0, "matmul_n: expected an int >= 1, got 0"),
    ("yardstick_repeat", 2.5, "yardstick_repeat: expected an int >= 1"),
    ("yardstick_pause_s", -1, r"yardstick_pause_s: expected seconds in "
                              r"\[0, 60\), got -1"),
    ("yardstick_pause_s", True, "yardstick_pause_s: expected seconds"),
])
def test_the_benchmarks_yardstick_settings_are_checked_by_name(field, value,
                                                                needle):
  e = ml_collections.ConfigDict(dict(
      configs_bench.get_config("smoke").experiment.to_dict(), **{field: value}))
  with pytest.raises(ValueError, match=needle):
    bench.yardstick_settings(e)
