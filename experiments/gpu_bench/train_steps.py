"""Part a: one training step, mha_jax against the same model in PyTorch on
the same device, in each precision (devices.PRECISIONS).

The shapes and both models are the train-step benchmark's
(experiments/benchmark/train_step.py): an experiment's config with its
model and task overrides (or the "random" sizes, drawn afresh with the
seed recorded), mha_jax's `train.train_step_jit` through
`train_step.jax_step`, and `torch_models.Decoder` with AdamW and clipping
through `torch_models.train_step` on the same batch, moved to torch's
device. torch runs eagerly and, where `train_step.torch_compile`, as
`torch.compile(model)` (the optimizer step stays eager in both).

For each shape and precision every contestant is built and run once
(compiling: those seconds are kept as `first_s`), then `warmup` untimed
steps, then `rounds` rounds in which each one, in an order rotated every
round, runs one untimed step and a block of steps lasting about
`min_block_s` (`timing.interleaved_times`); a time is the block's mean,
a figure the median over rounds, and a ratio the median over rounds of
the two contestants' times in the same round.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

from experiments.benchmark import train_step as ts_lib
from experiments.gpu_bench import devices
from mha_jax.measure import timing
from mha_jax.training import config as config_lib


def _jax_contestant(spec, path, p):
  """`(step, batch, first seconds, first loss)` for mha_jax at `p`."""
  c = ts_lib.experiment_config(spec, path)
  c.model.dtype = p.dtype
  start = time.perf_counter()
  with devices.jax_context(p):  # read when the step is traced (here)
    step, batch, _ = ts_lib.jax_step(c)
    loss = float(step())
  return step, batch, time.perf_counter() - start, loss


def _torch_contestant(torch, device, base, batch, p, compiled: bool):
  """`(step, first seconds, first loss)` for the PyTorch twin at `p`."""
  from experiments.benchmark import torch_models  # pylint: disable=import-outside-toplevel
  torch.manual_seed(base.train.seed)
  model = torch_models.Decoder(**ts_lib.peer_sizes(base)).to(device)
  opt = torch_models.optimizer(model, base.train)
  tb = {k: v.to(device) for k, v in torch_models.batch_to_torch(
      batch).items()}
  # dynamic=False: one program per shape, as XLA compiles (torch would
  # otherwise recompile for dynamic shapes once a second shape came).
  run = torch.compile(model, dynamic=False) if compiled else model
  clip = base.train.grad_clip

  def step():
    with devices.autocast(torch, p, device):
      loss = torch_models.train_step(run, opt, tb, clip)
    devices.sync(torch, device)
    return loss

  start = time.perf_counter()
  loss = float(step())
  return step, time.perf_counter() - start, loss


def _ratio(a, b) -> dict:
  return timing.spread([x / y for x, y in zip(a, b)])


def measure_group(name, spec, base, p, ts, budget, torch, device) -> dict:
  """One shape at one precision: every contestant's figures and ratios."""
  row = {"shape": name, "precision": p.name, "contestants": {},
         "skipped": {}}
  steps = {}
  if not devices.names(ts.paths):
    raise ValueError("config.train_step.paths: name at least one mha_jax "
                     "path (the batch comes from its task)")
  for path in devices.names(ts.paths):
    step, batch, first, loss = _jax_contestant(spec, path, p)
    steps[f"mha_jax {path}"] = step
    row["contestants"][f"mha_jax {path}"] = {"first_s": first,
                                             "first_loss": loss}
  modes = [("torch eager", False)]
  if torch is None:
    row["skipped"]["torch"] = devices.torch_or_reason()[1]
    modes = []
  elif ts.torch_compile:
    modes.append(("torch.compile", True))
  else:
    row["skipped"]["torch.compile"] = (
        "not run: config.train_step.torch_compile is False (the smoke run: "
        "torch.compile on a CPU builds C++ kernels, a minute or more)")
  for label, compiled in modes:
    why = budget.reason()
    if why:
      row["skipped"][label] = why
      continue
    try:
      with devices.torch_settings(torch, p):
        step, first, loss = _torch_contestant(torch, device, base, batch,
                                              p, compiled)
    except Exception as e:  # pylint: disable=broad-except
      if not compiled:
        raise
      # torch.compile needs a working compiler toolchain for the device
      # (Triton on CUDA, a C++ compiler on a CPU): a failure is recorded.
      row["skipped"][label] = (f"failed: {type(e).__name__}: "
                               f"{str(e).strip().splitlines()[0][:300]}")
      continue
    steps[label] = step
    row["contestants"][label] = {"first_s": first, "first_loss": loss}
  with (devices.torch_settings(torch, p) if torch
        else contextlib.nullcontext()):
    blocks = {}
    for label, step in steps.items():
      (one,), _ = timing.wall_times(step, (), warmup=ts.warmup, repeats=1)
      blocks[label] = max(1, math.ceil(ts.min_block_s / max(one, 1e-9)))
    # Each timing: one untimed step (the train-step benchmark's docstring
    # says why), then a block of steps, kept as seconds per step.
    rounds = timing.interleaved_times(steps, ts.rounds, setups=steps,
                                      repeat=blocks)
  for label, per_step in rounds.items():
    row["contestants"][label].update(
        block_steps=blocks[label], step_s=per_step,
        step_ms=1e3 * statistics.median(per_step))
  ours = [l for l in steps if l.startswith("mha_jax")]
  peers = [l for l in steps if not l.startswith("mha_jax")]
  row["ratios"] = {
      j: {t: _ratio(row["contestants"][j]["step_s"],
                    row["contestants"][t]["step_s"]) for t in peers}
      for j in ours}
  return row


def measure(config, budget) -> dict:
  """Every shape of `config.train_step.shapes` at every precision."""
  ts = config.train_step
  torch, _ = devices.torch_or_reason()
  device = devices.torch_device(torch) if torch else None
  out = {"device": device, "rows": [], "shapes": {}}
  for name in devices.names(ts.shapes):
    if name == "random":
      spec, seed = ts_lib.random_spec(ts.random)
    elif name in ts.specs:
      spec, seed = ts.specs[name], None
    else:
      raise ValueError(f"config.train_step.shapes: unknown {name!r}; "
                       f"expected keys of config.train_step.specs "
                       f"{sorted(ts.specs)} or 'random'")
    base = ts_lib.experiment_config(spec)
    m = config_lib.model_config(base)
    out["shapes"][name] = {"L": m.num_layers, "H": m.num_heads,
                           "D": m.d_model, "T": base.task.seq_len,
                           "B": base.task.batch_size, "V": m.vocab_size,
                           "random_seed": seed}
    for p in devices.precisions(ts.precisions):
      why = budget.reason()
      if why:
        out["rows"].append({"shape": name, "precision": p.name,
                            "skipped_all": why})
        continue
      row = measure_group(name, spec, base, p, ts, budget, torch, device)
      print(f"[train_step] {name} {p.name}: " + ", ".join(
          f"{l} {c['step_ms']:.2f} ms" for l, c in row["contestants"].items()
          if "step_ms" in c), flush=True)
      out["rows"].append(row)
  return out
