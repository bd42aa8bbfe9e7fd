r"""The train-step benchmark set: one optimizer step, mha_jax against PyTorch.

What a user deciding between libraries times: a whole training step
(forward, loss, backward, gradient clipping, AdamW) of the attention-only
decoder the experiments train. Each shape is an experiment's own config
(`configs/<name>.py`) with optional overrides of its model and task
fields (configs/benchmark.py, `train_step.shapes`), or "random": the
text task's model at sizes drawn each run from `train_step.random`
(`random_spec`; the row keeps the seed); the batch is that task's own
first batch, and the same arrays feed every library.

Paths:
- mha_jax's implementations (`einsum`, `vmap`, `flash`, `auto`, ...): the
  experiment's `train.train_step_jit`, with `model.implementation` set;
- `torch`: the same model written in PyTorch (`torch_models.Decoder`; a
  test checks it computes the same loss and gradients on the same
  weights), with `F.scaled_dot_product_attention`;
- `torch_compile`: that model under `torch.compile` (inductor, compiled
  by an untimed step; a compiler that fails here is a skip, saying why);
- `transformer_lens`: TransformerLens's `HookedTransformer` of the same
  sizes, as users run it.
torch and transformer_lens are optional: a path that cannot be imported
is skipped, saying so.

The roofline: a plain float32 matmul (`train_step.matmul_n`^3) is timed
in the same rounds as the steps; a path's fraction of the matmul rate is,
per round, the step's matrix-multiply FLOPs (`step_matmul_flops`: the
dense program's forward and backward, read from its jaxpr) per second of
its step over the matmul's FLOPs per second, with its median and range
over rounds. A path that skips work (flash's causal blocks) or does
extra (TransformerLens's hooks) gets the same numerator, so the fraction
compares the time of one model's work.

Timing: everything runs in this one process, built and warmed up first
(`warmup` untimed steps each, so compilation is out), then `rounds`
rounds. In each round every path, in an order that rotates from round to
round, runs one untimed step and then a timed block of consecutive steps
(as many as last `min_block_s` at its warm-up speed; a path's time in the
round is the block's mean). The untimed step is there because a library's
worker threads keep spinning for a while after its step returns: timed
straight after torch's step, the same compiled mha_jax program took 40%
longer at the `induction` shape (11-12 ms against 15-18), and the
rotation always put the same path there. A figure is the median over
rounds; a ratio is the median over rounds of the two paths' times in the
same round, with its range (min-max), so a drift of the machine's speed
during the run cancels. torch gets one thread per
core (`torch.set_num_threads(os.cpu_count())`), as XLA's CPU client does.
With `config.keep_freed_memory` the benchmark's process keeps freed host
memory for reuse before anything runs (run.py; mha_jax.training.
host_memory), which changes every path's time, torch's included.
"""

from __future__ import annotations

import importlib
import math
import os
import random
import statistics

import jax
import ml_collections

from mha_jax.core import attention
from mha_jax.core import flops
from mha_jax.measure import roofline
from mha_jax.measure import timing
from mha_jax.parallel import sharding
from mha_jax.training import config as config_lib
from mha_jax.training import train
from mha_jax.training import train_state

PEERS = ("torch", "torch_compile", "transformer_lens")


def experiment_config(spec, implementation=None):
  """The experiment config `spec.config` names ("text", or "induction:smoke"
  with the argument its `get_config` takes), with `spec.model` and
  `spec.task` overrides (and `model.implementation` when given)."""
  name, _, arg = spec.config.partition(":")  # "induction:smoke" as in --config
  try:
    module = importlib.import_module(f"configs.{name}")
  except ModuleNotFoundError as e:
    raise ValueError(f"config.train_step.specs: no configs/{name}.py") from e
  c = module.get_config(arg or None)
  c.model.update(dict(spec.get("model", {})))
  c.task.update(dict(spec.get("task", {})))
  if implementation is not None:
    c.model.implementation = implementation
  return c


def peer_sizes(c):
  """The sizes `torch_models` builds from; ValueError naming the model
  fields the PyTorch peers do not mirror."""
  m = config_lib.model_config(c)
  unsupported = [name for name, bad in (
      ("attention_only", not m.attention_only),
      ("positions", m.positions != "rotary"), ("final_ln", not m.final_ln),
      ("use_bias", m.use_bias),
      ("num_kv_heads", m.num_kv_heads not in (None, m.num_heads)),
      ("head_dim", m.head_dim not in (None, m.d_model // m.num_heads)),
      ) if bad]
  if unsupported:
    raise ValueError(f"train_step: the PyTorch peers mirror attention-only "
                     f"rotary decoders only; model fields {unsupported} "
                     "differ")
  return dict(vocab_size=m.vocab_size, d_model=m.d_model,
              num_layers=m.num_layers, num_heads=m.num_heads,
              seq_len=c.task.seq_len)


def jax_step(c, devices: int = 1):
  """`(step, batch, compiled)`: a closure running one training step of
  config `c` on its task's first batch (blocking until done), the batch,
  and the compiled step program (whose HLO the profile reads).

  With `devices` > 1 the step is the training loop's own on a data mesh
  of that many devices (`config.mesh.data`; `train_state.step_fns`), the
  state replicated and the batch split over them; the process must have
  exactly that many (on a CPU: host devices, which exist only when
  `XLA_FLAGS=--xla_force_host_platform_device_count` is set before JAX
  starts). `compiled` is then None."""
  state = train.create_train_state(c)
  if devices == 1:
    batch = train.batch_fn(c)(jax.random.PRNGKey(0))
    compiled = train.train_step_jit.lower(state, batch).compile()
    run = compiled
  else:
    c = ml_collections.ConfigDict(c.to_dict())
    c.mesh.update(data=devices, model=1, sequence=1)
    mesh = sharding.mesh_from_config(c)  # names the field when it can't
    state = sharding.shard_tree(state, mesh)
    run, _, make = train_state.step_fns(c, mesh)
    batch, compiled = make(jax.random.PRNGKey(0)), None
  holder = {"state": state}

  def step():
    holder["state"], metrics = run(holder["state"], batch)
    return jax.block_until_ready(metrics["loss"])
  return step, batch, compiled


def peer_step(path, c, batch):
  """A step closure for a PyTorch peer (`PEERS`) of config `c` on `batch`,
  or the reason it is skipped. torch gets one thread per core.
  "torch_compile" is the eager model under `torch.compile` (inductor's
  default mode; the optimizer step stays eager, as in PyTorch's own
  recipes), compiled here by one untimed step: a compiler that fails on
  this machine is a skip with its error, not a failed run. torch flushes
  denormals to zero from here on, as XLA's CPU code does."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from experiments.benchmark import torch_models  # pylint: disable=g-import-not-at-top
  except ImportError:
    return f"{path}: torch is not importable here (not a dependency)"
  # XLA's CPU code flushes denormal floats to zero; torch computes with
  # them, which costs Intel CPUs many times a normal operation, and
  # training on one repeated batch drives the gradients there: on an
  # Intel Xeon torch's text_size step grew from 300 to over 800 ms in 60
  # steps without flushing and stayed under 300 ms with it. So the
  # peers flush as XLA does. The setting is the process's and reaches
  # torch's worker threads only if set before they start (they copy it
  # when created), so it is set here, before the first peer's first op,
  # and left on.
  torch.set_flush_denormal(True)
  torch.set_num_threads(os.cpu_count())
  sizes = peer_sizes(c)
  torch.manual_seed(c.train.seed)
  if path == "transformer_lens":
    try:
      model = torch_models.hooked_transformer(**sizes, seed=c.train.seed)
    except ImportError:
      return "transformer_lens is not importable here (not a dependency)"
  else:
    model = torch_models.Decoder(**sizes)
  opt = torch_models.optimizer(model, c.train)
  tb = torch_models.batch_to_torch(batch)
  run = torch.compile(model) if path == "torch_compile" else model
  step = lambda: torch_models.train_step(run, opt, tb, c.train.grad_clip)
  if path == "torch_compile":
    try:
      step()
    except Exception as e:  # pylint: disable=broad-except
      return f"torch.compile failed here: {type(e).__name__}: {e}"[:300]
  return step


def step_matmul_flops(c) -> int:
  """The matrix-multiply FLOPs of one training step of config `c` as the
  dense program computes them (read from the einsum path's jaxpr: the
  forward, the backward and nothing of the optimizer; attention's full
  [T, T] scores, causal or not), the work the roofline divides by."""
  dense = ml_collections.ConfigDict(c.to_dict())
  dense.model.implementation = "einsum"
  state = train.create_train_state(dense)
  batch = train.batch_fn(dense)(jax.random.PRNGKey(0))
  return flops.jaxpr_matmul_flops(train.train_step, state, batch)


def _ratio(times, a, b):
  """Median and range over rounds of times[a] / times[b]."""
  return timing.spread([x / y for x, y in zip(times[a], times[b])])


MATMUL = "plain matmul"  # the yardstick's name among the timed calls


def measure_shape(name, spec, paths, rounds, warmup, min_block_s=0.0,
                  matmul_n=1024, host_devices=1):
  """Rows for one shape: one per path, timed in interleaved rounds with a
  plain `matmul_n`^3 float32 matmul (the roofline's yardstick, timed in
  the same rounds so a change of load falls on it too). mha_jax's paths
  train on a data mesh of `host_devices` devices (`jax_step`)."""
  steps, rows, batch = {}, {}, None
  for path in paths:
    if path in PEERS:
      continue
    c = experiment_config(spec, path)
    steps[path], batch, _ = jax_step(c, host_devices)
  base = experiment_config(spec)
  if batch is None:  # only peers asked for: the batch the task draws
    batch = train.batch_fn(base)(jax.random.PRNGKey(0))
  for path in paths:
    if path in PEERS:
      step = peer_step(path, base, batch)
      if isinstance(step, str):
        rows[path] = {"skipped": step}
        continue
      steps[path] = step
  steps[MATMUL], flops_mm = roofline.matmul_yardstick(matmul_n)
  flops_step = step_matmul_flops(base)
  block = {}
  for path, step in steps.items():
    (seconds,), _ = timing.wall_times(step, (), warmup=warmup + 1,
                                      repeats=1)
    block[path] = max(1, math.ceil(min_block_s / seconds))
  # Each timing: one untimed step (the module docstring says why), then
  # a block of `block[path]` steps.
  times = timing.interleaved_times(steps, rounds, setups=steps, repeat=block)
  rate = [flops_mm / m / 1e9 for m in times[MATMUL]]
  out = []
  m = config_lib.model_config(base)
  for path in paths:
    row = {"set": "train_step", "shape": name, "path": path,
           "L": m.num_layers, "H": m.num_heads, "D": m.d_model,
           "T": base.task.seq_len, "B": base.task.batch_size,
           "V": m.vocab_size, "matmul_gflop": flops_step / 1e9,
           "matmul_n": matmul_n, "matmul_gflops": rate,
           "host_devices": host_devices,
           **rows.get(path, {})}
    if path in times:
      row["block_steps"] = block[path]
      row["step_s"] = times[path]
      row["step_ms"] = 1e3 * statistics.median(times[path])
      row["roofline"] = roofline.share(flops_step, times[path], flops_mm,
                                       times[MATMUL])
      for peer in PEERS:
        if peer in times and peer != path:
          row[f"x_{peer}"] = _ratio(times, path, peer)
    print(f"[train_step] {name} {path}: "
          + (row.get("skipped") or f"{row['step_ms']:.1f} ms/step, "
             f"{100 * row['roofline']['median']:.0f}% of the matmul rate"),
          flush=True)
    out.append(row)
  return out


def spec_of(shape: str, seed: int):
  """configs/benchmark.py's train-step spec of `shape`, or its "random"
  shape drawn with `seed`; ValueError naming `--shapes` for another name
  (the scripts that time one shape per process take it as a flag)."""
  from configs import benchmark as benchmark_config  # pylint: disable=g-import-not-at-top
  ts = benchmark_config.get_config().train_step
  if shape == "random":
    ts.random.seed = seed
    return random_spec(ts.random)[0]
  if shape not in ts.specs:
    raise ValueError(f"--shapes: expected keys of configs/benchmark.py's "
                     f"train_step.specs or random, got {shape!r}")
  return ts.specs[shape]


def random_spec(r) -> tuple[dict, int]:
  """`(spec, seed)`: a `train_step.specs` entry with sizes drawn from the
  choices of `r` (`config.train_step.random`), uniformly and
  independently per field, d_model = num_heads * head_dim; the seed is
  `r.seed`, or one drawn from the operating system when it is -1."""
  seed = int(r.seed)
  if seed == -1:
    seed = int.from_bytes(os.urandom(4), "little")
  if seed < 0:
    raise ValueError(f"config.train_step.random.seed: expected -1 (draw "
                     f"one) or a seed >= 0, got {seed}")
  rng = random.Random(seed)
  pick = lambda field: rng.choice(tuple(r[field]))
  layers, heads, head_dim = (pick("num_layers"), pick("num_heads"),
                             pick("head_dim"))
  return ml_collections.ConfigDict(dict(
      config=r.config,
      model=dict(num_layers=layers, num_heads=heads,
                 d_model=heads * head_dim),
      task=dict(seq_len=pick("seq_len"),
                batch_size=pick("batch_size")))), seed


def sweep(config) -> list[dict]:
  """Every shape of `config.train_step.shapes` (comma-separated keys of
  `config.train_step.specs`) on every path of `config.train_step.paths`."""
  ts = config.train_step
  names = [s.strip() for s in ts.shapes.split(",") if s.strip()]
  paths = [p.strip() for p in ts.paths.split(",") if p.strip()]
  bad = [p for p in paths
         if p not in PEERS and not attention.known_implementation(p)]
  if bad:
    raise ValueError(f"config.train_step.paths: unknown {bad}; expected "
                     f"{sorted(attention.all_paths())} or "
                     f"{list(PEERS)}")
  unknown = [s for s in names if s not in ts.specs and s != "random"]
  if unknown:
    raise ValueError(f"config.train_step.shapes: unknown {unknown}; "
                     f"expected keys of config.train_step.specs "
                     f"{sorted(ts.specs)} or 'random'")
  rows = []
  for name in names:
    spec, seed = (random_spec(ts.random) if name == "random"
                  else (ts.specs[name], None))
    shape_rows = measure_shape(name, spec, paths, ts.rounds, ts.warmup,
                               ts.min_block_s, ts.matmul_n,
                               ts.get("host_devices", 1))
    if seed is not None:
      for row in shape_rows:
        row["random_seed"] = seed
    rows += shape_rows
  return rows
