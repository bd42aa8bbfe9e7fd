r"""EAP and EAP-IG over every edge: mha_jax against torch, in one run.

  python -m experiments.eap_ioi.bench --workdir=runs/eap_ioi_bench

Shape letters: N prompts, T tokens, V vocabulary, S senders, R receivers.

Both libraries read one file (SmolLM2's GGUF; the smoke run's tiny Llama
written by transformers) in float32 and score every edge of the same
prompts, clean against ABC-corrupted, for the metric eap_ioi scores (the
mean over prompts of logit(IO) - logit(S) at each prompt's END):

- mha_jax: `eap.edge_scores` through eap_ioi's own jitted call
  (`run._scores`), compiled first (its seconds kept apart);
- torch: `torch_eap.edge_scores` on transformers' `LlamaForCausalLM`, at
  `threads` intra-op threads (an independent implementation of the same
  definition, shown equal in tests/experiments/test_torch_eap.py).

Each contestant's first call is untimed (it gives the scores compared);
then `rounds` rounds time one call of each (`timing.interleaved_times`,
the order rotated each round so a change in the shared machine's load
falls on all alike); a ratio is mha_jax's seconds over torch's in the
same round. Agreement on the real model: the relative difference in norm
over the edges, the largest difference relative to the largest |score|,
Spearman's rank correlation of |score| (the ranking EAP's circuits are
cut from) and the overlap of the `top_k` edges. With `peer` False only
mha_jax runs (torch's model is still read, to check the edges agree).

The roofline: a plain float32 `[matmul_n, matmul_n]` product
(`roofline.matmul_yardstick`) is timed in the same rounds, as a block of
`yardstick_repeat` calls after an untimed pause of `yardstick_pause_s`
(torch's worker threads go on spinning for a while after its calls, and a
product timed at once shared the cores with them). Each method's work is
the matrix-multiply FLOPs of mha_jax's compiled call
(`flops.compiled_matmul_flops`: the products XLA runs, not those the
jaxpr asks for and XLA drops), the same numerator for both libraries;
each contestant's share is that work per second over the yardstick's
rate in the same round.

`config.keep_freed_memory` (off by default: its comment says why) has
the process keep freed host memory for reuse first
(`training/host_memory.py`); the report says which.
"""

from __future__ import annotations

import os
import pathlib
import resource
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as sp_stats

import mha_jax
from experiments import cli
from experiments.eap_ioi import bench_report
from experiments.eap_ioi import run as eap_run
from experiments.eap_ioi import torch_eap
from experiments.ioi_task import models
from experiments.ioi_task import prompts
from mha_jax.core import flops
from mha_jax.interp import eap
from mha_jax.interp import eap_graph
from mha_jax.measure import machine
from mha_jax.measure import roofline
from mha_jax.measure import timing

YARDSTICK = "plain matmul"  # the roofline's timed calls


def load(e, workdir):
  """`(mha_jax model, transformers model, tokenizer, prefix, label)`,
  the same float32 weights in both."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  if e.model == "smollm2":
    model, tok, prefix = models.load("smollm2")
    path = models.REAL["smollm2"]()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model, hf.eval(), tok, prefix, "SmolLM2-135M-Instruct (GGUF)"
  if e.model != "tiny_llama":
    raise ValueError(f"config.experiment.model: expected 'smollm2' or "
                     f"'tiny_llama', got {e.model!r}")
  tok = models.word_tokenizer()
  fields = dict(models.TINY["tiny_llama"], vocab_size=tok.get_vocab_size(),
                initializer_range=e.tiny_init)
  del fields["model_type"]
  torch.manual_seed(e.seed)
  hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
  path = pathlib.Path(workdir) / "tiny_llama"
  hf.save_pretrained(path)
  return (mha_jax.load_pretrained(path), hf.eval(), tok, "",
          f"tiny random Llama (seed {e.seed})")


def chosen_prompts(tok, prefix, e) -> dict:
  """The first `e.prompts` of the seeded order eap_ioi splits its prompts
  by (64 of them are eap_ioi's scoring prompts), in index order."""
  p = prompts.build(tok, prompts.single_token_names(tok),
                    per_template_order=e.per_template_order, seed=e.seed,
                    prefix=prefix)
  total = len(p["end"])
  if not 2 <= e.prompts <= total:
    raise ValueError(f"config.experiment.prompts: expected 2 to {total} "
                     f"(the prompts built), got {e.prompts}")
  order = np.random.default_rng(e.seed).permutation(total)
  return prompts.subset(p, np.sort(order[:e.prompts]))


def torch_metric(end, io, s):
  """logits `[N, T, V]` -> the mean of logit(IO) - logit(S) at END: the
  torch form of `eap_run.per_prompt_metric`, averaged as eap_ioi does."""
  import torch  # pylint: disable=import-outside-toplevel
  end, io, s = (torch.as_tensor(np.asarray(x), dtype=torch.long)
                for x in (end, io, s))

  def metric(logits):
    rows = torch.arange(len(end))
    return (logits[rows, end, io] - logits[rows, end, s]).mean()
  return metric


def chunk_size(e, n: int) -> int:
  """Prompts per torch call: `e.peer_chunk`, or all `n` where it is 0."""
  if (isinstance(e.peer_chunk, bool) or not isinstance(e.peer_chunk, int)
      or e.peer_chunk < 0):
    raise ValueError(f"config.experiment.peer_chunk: expected an int >= 0 "
                     f"(prompts per torch call; 0: all), got {e.peer_chunk!r}")
  return e.peer_chunk or n


def torch_scores(hf, p, method: str, e):
  """torch's `[S, R]` scores of every prompt of `p`, in calls of
  `e.peer_chunk` prompts (0: one call). The metric is the mean over the
  prompts and no prompt reads another, so the whole set's scores are the
  chunks' scores weighted by their share of the prompts: a chunk bounds
  the memory of torch's autograd graph (about 0.26 GB per SmolLM2
  prompt), not what is computed."""
  import torch  # pylint: disable=import-outside-toplevel
  n = len(p["end"])
  size = chunk_size(e, n)
  total = 0.0
  for start in range(0, n, size):
    rows = np.arange(start, min(start + size, n))
    clean, corrupt = (torch.as_tensor(np.asarray(p[k])[rows],
                                      dtype=torch.long)
                      for k in ("tokens", "corrupted"))
    metric = torch_metric(*(np.asarray(p[k])[rows] for k in ("end", "io",
                                                              "s")))
    scores = torch_eap.edge_scores(hf, clean, corrupt, metric,
                                   method=method, steps=e.ig_steps)
    total = total + scores.detach() * (len(rows) / n)
  return total


def contestants(model, hf, p, e) -> tuple[dict, dict, dict]:
  """`({name: zero-argument call}, {method: compile seconds}, {method:
  matmul FLOPs of the compiled call})`: mha_jax's compiled scores of each
  method and, unless `hf` is None, torch's."""
  graphdef, state = nnx.split(model)
  args = tuple(jnp.asarray(p[k]) for k in ("tokens", "corrupted", "end",
                                            "io", "s"))
  calls, compile_s, work = {}, {}, {}
  for method in eap.METHODS:
    start = time.perf_counter()
    compiled = eap_run._scores.lower(  # pylint: disable=protected-access
        graphdef, state, *args, method, e.ig_steps).compile()
    compile_s[method] = time.perf_counter() - start
    work[method] = flops.compiled_matmul_flops(compiled)
    calls[f"mha_jax {method}"] = (
        lambda c=compiled: c(state, *args).scores)
    if hf is not None:
      calls[f"torch {method}"] = lambda m=method: torch_scores(hf, p, m, e)
  return calls, compile_s, work


def yardstick_settings(e) -> tuple[int, int, float]:
  """`(matmul_n, yardstick_repeat, yardstick_pause_s)`, checked by name."""
  for name, low in (("matmul_n", 1), ("yardstick_repeat", 1)):
    v = e[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
      raise ValueError(f"config.experiment.{name}: expected an int >= "
                       f"{low}, got {v!r}")
  pause = e.yardstick_pause_s
  if isinstance(pause, bool) or not isinstance(pause, (int, float)) or not (
      0 <= pause < 60):
    raise ValueError(f"config.experiment.yardstick_pause_s: expected seconds "
                     f"in [0, 60), got {pause!r}")
  return e.matmul_n, e.yardstick_repeat, float(pause)


def roofline_shares(work, times, yard, yard_flops, peer: bool) -> dict:
  """Per method, each contestant's share of the plain matmul's rate,
  round by round (`roofline.share`), the work being mha_jax's compiled
  products for both."""
  names = ("mha_jax", "torch") if peer else ("mha_jax",)
  return {m: {c: roofline.share(w, times[f"{c} {m}"], yard_flops, yard)
              for c in names} for m, w in work.items()}


def agreement(ours, theirs, edges, top_k: int) -> dict:
  """How far mha_jax's scores `[S, R]` are from torch's, over the edges."""
  a = np.asarray(ours, np.float64)[edges]
  b = np.asarray(theirs, np.float64)[edges]
  top = lambda x: set(np.argsort(-np.abs(x), kind="stable")[:top_k])
  return {"rel_norm": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
          "max_rel": float(np.abs(a - b).max() / np.abs(b).max()),
          "spearman_abs": float(sp_stats.spearmanr(np.abs(a),
                                                   np.abs(b)).statistic),
          "top_k": top_k, "top_k_shared": len(top(a) & top(b))}


def measure(config, workdir) -> dict:
  """Times, ratios and agreement (module docstring)."""
  import torch  # pylint: disable=import-outside-toplevel
  e = config.experiment
  start = time.perf_counter()
  kept = cli.keep_freed_memory_if_asked(config)
  model, hf, tok, prefix, label = load(e, workdir)
  eap_graph.check_model(model, "eap_ioi.bench")  # pre-norm only, named
  graph = eap_graph.graph(model)
  if torch_eap.labels(hf.config) != (list(graph.senders),
                                     list(graph.receivers)):
    raise ValueError("eap_ioi.bench: the torch peer's edges are not "
                     "eap_graph's")
  p = chosen_prompts(tok, prefix, e)
  chunk_size(e, e.prompts)  # bad settings are refused before compiling
  matmul_n, yard_repeat, yard_pause = yardstick_settings(e)
  torch.set_num_threads(e.threads)
  setup = lambda: torch.set_num_threads(e.threads)
  # Without the peer only mha_jax runs: the size where both libraries in
  # one process do not fit the machine's memory (SmolLM2 at 128 prompts).
  calls, compile_s, work = contestants(model, hf if e.peer else None, p, e)
  first, scores = {}, {}
  for name, call in calls.items():
    first[name], scores[name] = timing.timed_call(setup, call)
  setups = {n: setup for n in calls}
  calls[YARDSTICK], yard_flops = roofline.matmul_yardstick(matmul_n)
  setups[YARDSTICK] = lambda: time.sleep(yard_pause)
  load_avg = []
  times = timing.interleaved_times(
      calls, e.rounds, setups=setups, repeat={YARDSTICK: yard_repeat},
      on_round=lambda r: load_avg.append(os.getloadavg()[0]))
  methods = {}
  for m in eap.METHODS:
    ours = times[f"mha_jax {m}"]
    if not e.peer:
      methods[m] = {"mha_jax_s": {"median": float(np.median(ours)),
                                  "min": float(np.min(ours)),
                                  "rounds": ours},
                    "compile_s": compile_s[m],
                    "first_s": {"mha_jax": first[f"mha_jax {m}"]}}
      continue
    theirs = times[f"torch {m}"]
    ratios = np.asarray(ours) / np.asarray(theirs)
    methods[m] = {
        "mha_jax_s": {"median": float(np.median(ours)),
                      "min": float(np.min(ours)), "rounds": ours},
        "torch_s": {"median": float(np.median(theirs)),
                    "min": float(np.min(theirs)), "rounds": theirs},
        "ratio": {"median": float(np.median(ratios)),
                  "min": float(ratios.min()), "max": float(ratios.max()),
                  "rounds": ratios.tolist()},
        "compile_s": compile_s[m],
        "first_s": {"mha_jax": first[f"mha_jax {m}"],
                    "torch": first[f"torch {m}"]},
        "agree": agreement(scores[f"mha_jax {m}"],
                           scores[f"torch {m}"].numpy(), graph.exists,
                           e.top_k)}
  return {
      "model": label, "prompts": e.prompts,
      "tokens": int(np.shape(p["tokens"])[1]),
      "edges": graph.num_edges, "senders": len(graph.senders),
      "receivers": len(graph.receivers), "ig_steps": e.ig_steps,
      "rounds": e.rounds, "threads": e.threads, "peer": e.peer,
      "peer_chunk": e.peer_chunk,
      "methods": methods,
      "roofline": {
          "matmul_n": matmul_n, "repeat": yard_repeat, "pause_s": yard_pause,
          "work": {m: float(w) for m, w in work.items()},
          "rates": [yard_flops / t for t in times[YARDSTICK]],
          "share": roofline_shares(work, times, times[YARDSTICK], yard_flops,
                                   e.peer)},
      "loadavg_rounds": load_avg,
      # Both libraries in one process: the peak of the larger one.
      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      "keep_freed_memory": kept,
      "cores": os.cpu_count(), "cpu": machine.instruction_sets(),
      "jax": jax.__version__,
      "torch": torch.__version__, "seconds": time.perf_counter() - start}


def run(config, workdir, *, reuse_runs: bool = False,
        command: str | None = None) -> dict:
  """Measure, then write results.json and report.md into `workdir`;
  nothing is trained, so `reuse_runs` changes nothing."""
  del reuse_runs
  results = measure(config, workdir)
  return bench_report.write(config, results, workdir, command)


if __name__ == "__main__":
  cli.main(run, cli.experiment_flags(config="configs/eap_ioi_bench.py",
                                     workdir="runs/eap_ioi_bench"))
