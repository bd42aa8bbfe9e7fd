"""The measurements of `python -m experiments.pretrained_bench`.

Loading: each load runs in its own process (`load_child.py`), which
reports the seconds from call to weights on the device and the peak RSS
above the RSS after its imports, divided by the checkpoint's size: a
loader that held the checkpoint twice would be near 2, one that streams
it near 1. Speed: forward and loss + gradient of the loaded MiniLM on
one batch, mha_jax (each attention path, jitted) against transformers
(torch, 2 threads and 1) in interleaved rounds with a plain matmul, the
roofline's yardstick (`measure_speed`): median and minimum over rounds,
ratios of the minima to torch's (`speed_ratios`), and each path's share
of the matmul's rate per round.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import mha_jax
from mha_jax.core import flops
from mha_jax.measure import roofline
from mha_jax.measure import timing
from mha_jax.pretrained import gguf_files
from mha_jax.pretrained import layout
from mha_jax.pretrained import llama
from mha_jax.pretrained import safetensors_files
from mha_jax.pretrained import weights


TASKS = ("forward", "loss_grad")
YARDSTICK = "plain matmul"  # the roofline's timed call


def write_big_llama(directory: pathlib.Path, *, layers=6, d=1024,
                    vocab=16000, seed=0) -> pathlib.Path:
  """A random Llama-family checkpoint of about 0.5 GB (float32), written
  from the family's table, for the load benchmark."""
  hf = dict(model_type="llama", architectures=["LlamaForCausalLM"],
            vocab_size=vocab, hidden_size=d, intermediate_size=4 * d,
            num_hidden_layers=layers, num_attention_heads=16,
            num_key_value_heads=4, max_position_embeddings=2048,
            rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(hf))
  config = mha_jax.pretrained.load_config(directory)
  sizes = weights.axis_sizes(config)
  rng = np.random.default_rng(seed)
  tensors = {}
  for source, rule, paths in weights.expand(llama.LLAMA, layers):
    if any(s in source for s in (".bias",)):
      continue
    shape = layout.shape_of(rule.src, sizes)
    tensors[weights.checkpoint_name(llama.LLAMA, source, paths)] = (
        rng.standard_normal(shape, np.float32) * 0.02)
  safetensors_files.write(tensors, directory / safetensors_files.SINGLE,
                          metadata={"format": "pt"})
  return directory


def checkpoint_mb(path: pathlib.Path) -> float:
  """MB of the weights as both loaders hold them: a directory's
  safetensors files (float32 here), or a GGUF file's tensors dequantized
  to float32 (each once: a tied head adds nothing)."""
  if path.is_file():
    tensors = gguf_files.list_tensors(gguf_files.open_reader(path), path)
    return sum(4 * math.prod(t.shape) for t in tensors.values()) / 2**20
  return sum(p.stat().st_size for p in path.glob("*.safetensors")) / 2**20


def measure_load(path, loader: str) -> dict:
  """One load of `path` (a directory or a GGUF file) in its own process:
  `load_child`'s seconds and RSS, the weights' float32 MB
  (`checkpoint_mb`), the file's MB and the peak over the weights."""
  path = pathlib.Path(path)
  out = subprocess.run(
      [sys.executable, "-m", "experiments.pretrained_bench.load_child",
       str(path), loader], check=True, capture_output=True, text=True)
  r = json.loads(out.stdout.strip().splitlines()[-1])
  size = checkpoint_mb(path)
  files = [path] if path.is_file() else list(path.glob("*.safetensors"))
  return dict(r, checkpoint_mb=size,
              file_mb=sum(p.stat().st_size for p in files) / 2**20,
              peak_over_size=(r["peak_mb"] - r["base_mb"]) / size)


def _loss(hidden, m):
  """A scalar of the encoder's output `hidden [B, T, D]`: the mean square
  of the mean-pooled sentence vectors (what a sentence-embedding loss
  reads); `m [B, T, 1]` is 1.0 on real tokens."""
  pooled = (hidden * m).sum(1) / m.sum(1)
  return (pooled ** 2).mean()


def measure_speed(directory, ids, mask, *, implementations=("flash",
                                                            "einsum"),
                  warmup=2, repeats=10, torch_threads=(2, 1),
                  matmul_n=1024) -> dict:
  """Forward and loss+grad of the loaded MiniLM: mha_jax per path (jitted)
  and torch at each of `torch_threads` ("torch" at the first, "torch N
  thread(s)" at the others; torch at 1 thread is there because its
  threads fight the machine's load: on a busy machine one thread can be
  torch's best).

  Every call runs `warmup` times untimed, then all are timed in `repeats`
  interleaved rounds (`timing.interleaved_times`, the order rotated each
  round, torch's thread count set before each of its calls), with the
  plain `matmul_n`^3 float32 product of `roofline.matmul_yardstick` in
  the same rounds. Returns `{"speed": {path: {"forward", "loss_grad":
  [median, min] seconds}}, "rounds": the same, seconds per round,
  "work": matrix-multiply FLOPs per call of each task (the einsum path's
  compiled program, `flops.compiled_matmul_flops`: the same numerator for
  every path), "matmul_flops_per_s": the yardstick's rate per round,
  "share": {path: {task: `roofline.share`}}}`."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  calls, setups, work = {}, {}, {}
  args = (jnp.asarray(ids), jnp.asarray(mask))
  for impl in implementations + (() if "einsum" in implementations
                                 else ("einsum",)):
    model = mha_jax.load_pretrained(directory, implementation=impl)
    graphdef, state = nnx.split(model)

    def hidden(state, ids, mask, graphdef=graphdef):
      return nnx.merge(graphdef, state)(ids, mask=mask)

    programs = {"forward": jax.jit(hidden), "loss_grad": jax.jit(
        jax.value_and_grad(lambda s, i, m: _loss(hidden(s, i, m), m[
            ..., None].astype(jnp.float32))))}
    for task, fn in programs.items():
      compiled = fn.lower(state, *args).compile()
      if impl == "einsum":
        work[task] = flops.compiled_matmul_flops(compiled)
      if impl in implementations:
        calls[(impl, task)] = functools.partial(compiled, state, *args)
  hf = transformers.BertModel.from_pretrained(directory).eval()
  t_ids = torch.tensor(ids, dtype=torch.long)
  t_mask = torch.tensor(mask, dtype=torch.long)

  def torch_fwd():
    with torch.no_grad():
      return hf(input_ids=t_ids, attention_mask=t_mask).last_hidden_state

  def torch_grad():
    hf.zero_grad()
    h = hf(input_ids=t_ids, attention_mask=t_mask).last_hidden_state
    loss = _loss(h, t_mask[..., None].float())
    loss.backward()
    return loss

  for i, n in enumerate(torch_threads):
    name = torch_name(n) if i else "torch"
    for task, fn in (("forward", torch_fwd), ("loss_grad", torch_grad)):
      calls[(name, task)] = fn
      setups[(name, task)] = functools.partial(torch.set_num_threads, n)
  yard, yard_flops = roofline.matmul_yardstick(matmul_n)
  calls[(YARDSTICK, "")] = yard
  for key, fn in calls.items():
    for _ in range(warmup):
      setups.get(key, lambda: None)()
      jax.block_until_ready(fn())  # passes torch tensors through
  times = timing.interleaved_times(calls, repeats, setups=setups)
  torch.set_num_threads(torch_threads[0])
  yard_times = times.pop((YARDSTICK, ""))
  paths = dict.fromkeys(path for path, _ in times)
  rounds = {p: {t: times[(p, t)] for t in TASKS} for p in paths}
  return {
      "speed": {p: {t: [float(np.median(x)), float(min(x))]
                    for t, x in by.items()} for p, by in rounds.items()},
      "rounds": rounds, "work": work, "matmul_n": matmul_n,
      "matmul_flops_per_s": [yard_flops / y for y in yard_times],
      "share": {p: {t: roofline.share(work[t], x, yard_flops, yard_times)
                    for t, x in by.items()} for p, by in rounds.items()}}


def torch_name(threads: int) -> str:
  """`measure_speed`'s key of torch at `threads` other than the first."""
  return f"torch {threads} thread" + ("s" if threads > 1 else "")


def speed_ratios(speed, against: str = "torch") -> dict:
  """path -> {"forward", "loss_grad"}: the path's minimum seconds over
  `against`'s (`measure_speed`'s results; "torch": at its first thread
  count)."""
  return {path: {k: r[k][1] / speed[against][k][1]
                 for k in ("forward", "loss_grad")}
          for path, r in speed.items()}
