r"""Where a training step's time goes: mha_jax's ops and PyTorch's, side by side.

  python -m experiments.benchmark.profile --shape=text_size --path=einsum \
      [--nokeep_freed_memory]

Traces `steps` steps of one train-step shape of configs/benchmark.py with
`jax.profiler` (a Perfetto trace), and sums each XLA operation's time
over the steps and the threads; each operation is named by the program
line it came from (its `op_name`: `jvp(...)` is the forward, `transpose(
jvp(...))` the backward) and sorted into kinds by what XLA fused into it
(a matmul, an exp, a reduction, a transpose or copy, slices and pads, or
other elementwise work). Then the same model in
PyTorch (`torch_models.Decoder`) under `torch.profiler`, by operator. It
also counts the minor page faults and kernel time per step of each, which
is where a program's fresh scratch memory shows (training/host_memory.py).
Writes nothing: the tables go to stdout (docs/performance.md quotes one).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import resource
import sys
import tempfile
import time

import jax
from absl import app
from absl import flags

from configs import benchmark as benchmark_config
from experiments.benchmark import train_step
from mha_jax.training import host_memory
from mha_jax.training import train



def _hlo_ops(text):
  """instruction name -> (shape, op_name, opcodes of its fused body)."""
  bodies, ops, current = collections.defaultdict(set), {}, None
  for line in text.splitlines():
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      continue
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\(", line)
    if not m:
      continue
    name, shape, opcode = m.groups()
    bodies[current].add(opcode)
    op_name = re.search(r'op_name="([^"]*)"', line)
    calls = re.findall(r"calls=%?([\w.\-]+)", line)
    ops[name] = (shape, op_name.group(1) if op_name else "", opcode, calls)
  return {name: (shape, op_name, {opcode}.union(*(bodies[c] for c in calls)))
          for name, (shape, op_name, opcode, calls) in ops.items()}


def _kind(opcodes):
  if "dot" in opcodes:
    return "matmul"
  if "exponential" in opcodes:
    return "exp (softmax)"
  if "reduce" in opcodes:
    return "reduction"
  if "transpose" in opcodes or "copy" in opcodes:
    return "layout (transpose, copy)"
  if opcodes & {"dynamic-slice", "dynamic-update-slice", "pad", "slice",
                "concatenate"}:
    return "slices, pads, concatenations"
  return "other elementwise"


def _faults(fn, steps):
  """(minor page faults, kernel seconds) per call of `fn`."""
  r0 = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(steps):
    fn()
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  return ((r1.ru_minflt - r0.ru_minflt) / steps,
          (r1.ru_stime - r0.ru_stime) / steps)


def profile_jax(config, steps, top):
  step, _, compiled = train_step.jax_step(config)
  for _ in range(3):
    step()
  faults, sys_s = _faults(step, steps)
  with tempfile.TemporaryDirectory() as d:
    start = time.perf_counter()
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(steps):
        step()
    wall = (time.perf_counter() - start) / steps
    trace = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)[0]
    events = json.load(gzip.open(trace))["traceEvents"]
  ops = _hlo_ops(compiled.as_text())
  by_kind, by_line = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e["name"] in ops:
      _, op_name, opcodes = ops[e["name"]]
      by_kind[_kind(opcodes)] += e["dur"] / 1e3 / steps
      where = re.sub(r"^jit\(train_step\)/", "", op_name) or "(no op_name)"
      by_line[(_kind(opcodes), where[-70:])] += e["dur"] / 1e3 / steps
  total = sum(by_kind.values())
  print(f"\nmha_jax ({config.model.implementation}): {1e3 * wall:.0f} ms per "
        f"profiled step; operations {total:.0f} ms summed over threads; "
        f"{faults:.0f} minor page faults and {1e3 * sys_s:.0f} ms kernel "
        "time per step (unprofiled)\n")
  print("| kind | ms per step | share |\n|---|---|---|")
  for kind, ms in by_kind.most_common():
    print(f"| {kind} | {ms:.1f} | {100 * ms / total:.0f}% |")
  print("\n| kind | from | ms per step |\n|---|---|---|")
  for (kind, where), ms in by_line.most_common(top):
    print(f"| {kind} | `{where}` | {ms:.1f} |")


def profile_torch(config, steps, top):
  step = train_step.peer_step(
      "torch", config, train.batch_fn(config)(jax.random.PRNGKey(0)))
  if isinstance(step, str):
    print(f"\nskipped: {step}")
    return
  import torch  # pylint: disable=g-import-not-at-top
  for _ in range(3):
    step()
  faults, sys_s = _faults(step, steps)
  with torch.profiler.profile(activities=[
      torch.profiler.ProfilerActivity.CPU]) as prof:
    start = time.perf_counter()
    for _ in range(steps):
      step()
    wall = (time.perf_counter() - start) / steps
  print(f"\ntorch: {1e3 * wall:.0f} ms per profiled step; {faults:.0f} minor "
        f"page faults and {1e3 * sys_s:.0f} ms kernel time per step "
        "(unprofiled)\n")
  print("| operator | self CPU ms per step | calls per step |\n|---|---|---|")
  rows = sorted(prof.key_averages(), key=lambda r: -r.self_cpu_time_total)
  for r in rows[:top]:
    print(f"| `{r.key}` | {r.self_cpu_time_total / 1e3 / steps:.1f} | "
          f"{r.count // steps} |")


def main(argv):
  del argv
  fl = flags.FLAGS
  if fl.keep_freed_memory:
    print("host memory kept:", host_memory.keep_freed_memory()["reason"])
  specs = benchmark_config.get_config().train_step.specs
  if fl.shape not in specs:
    raise SystemExit(f"--shape: expected one of {sorted(specs)}, got "
                     f"{fl.shape!r}")
  config = train_step.experiment_config(specs[fl.shape], fl.path)
  print(f"{fl.shape}: {' '.join(sys.argv[1:])}")
  profile_jax(config, fl.steps, fl.top)
  profile_torch(config, fl.steps, fl.top)


if __name__ == "__main__":
  # Defined here, not on import, so that tests can import the helpers.
  flags.DEFINE_string("shape", "text_size", "A key of configs/benchmark.py's "
                      "train_step.specs.")
  flags.DEFINE_string("path", "einsum", "mha_jax's implementation.")
  flags.DEFINE_integer("steps", 5, "Profiled steps of each library.")
  flags.DEFINE_integer("top", 12, "Rows of each table.")
  flags.DEFINE_bool("keep_freed_memory", True, "Keep freed host memory "
                    "for reuse first (mha_jax.training.host_memory).")
  app.run(main)
