r"""The matrix products of a training step, one at a time, XLA against torch.

  python -m experiments.benchmark.attention_products [--shape=text_size] \
      [--path=einsum] [--rounds=20] [--copies=12] [--notorch]

A dense attention layer's step makes six batched matrix products per
layer (per batch and head; `P` the weights and `dS` the score gradient,
both `[Tq, Tk]`): S = Q K^T and O = P V forward; dP = dO V^T,
dV = P^T dO, dQ = dS K and dK = dS^T Q backward. Beside them are the 2D
products of the projections: x W forward, and per weight dx = dy W^T
and dW = x^T dy backward.

Torch multiplies a transposed operand in place (a BLAS flag); XLA's
CPU backend hands a dot to YNNPACK only when both operands are in the
plain GEMM layout, copying the big ones transposed where needed (the
layout work of docs/performance.md), and leaves the others to Eigen.
This reads the compiled train step of `--shape` (configs/benchmark.py)
for every dot it contains: its operand shapes, its form (N: the lhs
contracts its last dim, the rhs its first after the batch dims, as a
plain GEMM reads them; T otherwise) and the kernel XLA gave it (a
YNNPACK fusion, or a plain `dot` that runs as an Eigen contraction).
Then it times each distinct dot alone, jitted (and names the kernel it
got alone), and torch's `matmul` of the same operands (a thread per
core, denormals flushed as XLA does) in interleaved rounds, with the CPU
seconds each XLA dot used per wall second (1.0: one thread did the
work, whatever the core count).

Last, whether XLA runs independent products of one program side by
side: the most frequent batched dot 1, 2 and `--copies` times on
different operands in one jitted function, the time per product and the
CPU seconds per wall second. XLA's CPU runtime runs a program of few
operations in order (its thunk executor's rule: below a small count,
concurrency would cost more than it gives) and the operations of a
larger one as their inputs are ready, on its thread pool; the rows show
where that sets in.

Writes nothing: the tables go to stdout (docs/performance.md quotes
one).
"""

from __future__ import annotations

import collections
import os
import re
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from configs import benchmark as benchmark_config
from experiments.benchmark import train_step
from mha_jax.training import config as config_lib
from mha_jax.measure import timing
from mha_jax.training import host_memory

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$")
_SHAPE_RE = re.compile(r"^[a-z]\w*\[([\d,]*)\]")


def _dims(shape: str) -> tuple[int, ...]:
  m = _SHAPE_RE.match(shape)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def _attr(rest: str, name: str) -> tuple[int, ...]:
  m = re.search(name + r"=\{([\d,]*)\}", rest)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def step_dots(hlo_text: str) -> list[dict]:
  """Every `dot` of a compiled program's HLO text: its output and operand
  dims, batch and contracting dims, the `op_name` it came from, and its
  kernel: "YNNPACK" when it sits in a computation that a `__ynn_fusion`
  calls, "oneDNN" likewise for a oneDNN fusion, else "Eigen" (a plain
  dot, which XLA's CPU runtime runs as an Eigen contraction)."""
  shapes, kernel_of, dots, current = {}, {}, [], None
  for line in hlo_text.splitlines():
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0]
      current = current.lstrip("%")
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    name, shape, opcode, rest = m.groups()
    shapes[(current, name)] = _dims(shape)
    if opcode == "fusion":
      called = re.search(r"calls=%?([\w.\-]+)", rest)
      kind = re.search(r'"kind":"(__\w+)"', rest)
      if called and kind:
        kernel_of[called.group(1)] = {"__ynn_fusion": "YNNPACK",
                                      "__onednn_fusion": "oneDNN"}.get(
                                          kind.group(1), kind.group(1))
    if opcode == "dot":
      operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
      op_name = re.search(r'op_name="([^"]*)"', rest)
      dots.append(dict(
          computation=current, out=_dims(shape), operands=operands,
          lhs_batch=_attr(rest, "lhs_batch_dims"),
          rhs_batch=_attr(rest, "rhs_batch_dims"),
          lhs_contracting=_attr(rest, "lhs_contracting_dims"),
          rhs_contracting=_attr(rest, "rhs_contracting_dims"),
          op_name=op_name.group(1) if op_name else ""))
  for d in dots:
    d["lhs"], d["rhs"] = (shapes.get((d["computation"], o), ())
                          for o in d.pop("operands")[:2])
    d["kernel"] = kernel_of.get(d["computation"], "Eigen")
  return dots


def form_of(dot: dict) -> str:
  """"NN", "NT", "TN" or "TT" of a dot with batch dims: N where the lhs
  contracts its last dim and the rhs its first non-batch dim (the
  layout a plain GEMM reads), T otherwise."""
  lhs_n = dot["lhs_contracting"] == (len(dot["lhs"]) - 1,)
  rhs_n = dot["rhs_contracting"] == (len(dot["rhs_batch"]),)
  return ("N" if lhs_n else "T") + ("N" if rhs_n else "T")


def gemm_operands(dot: dict, lhs, rhs):
  """NumPy `lhs`, `rhs` of `dot` arranged as `[batch..., M, K]` and
  `[batch..., K, N]` (one contracting dim each), so that a plain batched
  matmul of them gives the dot's output."""
  (lc,), (rc,) = dot["lhs_contracting"], dot["rhs_contracting"]
  lhs_free = [i for i in range(lhs.ndim)
              if i not in dot["lhs_batch"] and i != lc]
  rhs_free = [i for i in range(rhs.ndim)
              if i not in dot["rhs_batch"] and i != rc]
  return (lhs.transpose(*dot["lhs_batch"], *lhs_free, lc),
          rhs.transpose(*dot["rhs_batch"], rc, *rhs_free))


def _cpu_per_wall(fn, calls: int = 20) -> float:
  """CPU seconds of this process per wall second over `calls` calls."""
  jax.block_until_ready(fn())
  c0, w0 = time.process_time(), time.perf_counter()
  for _ in range(calls):
    jax.block_until_ready(fn())
  return (time.process_time() - c0) / (time.perf_counter() - w0)


def main(argv):
  del argv
  fl = flags.FLAGS
  host_memory.keep_freed_memory()
  cfg = benchmark_config.get_config()
  spec = cfg.train_step.specs[fl.shape]
  c = train_step.experiment_config(spec, fl.path)
  m = config_lib.model_config(c)
  b, h, t = c.task.batch_size, m.num_heads, c.task.seq_len
  dh = m.d_model // m.num_heads
  _, _, compiled = train_step.jax_step(c)
  dots = step_dots(compiled.as_text())
  print(f"{fl.shape} ({fl.path}): L={m.num_layers} B={b} H={h} "
        f"T={t} Dh={dh}; the compiled train step's dots:\n")
  print("| kernel | form | lhs | rhs | out | count |\n|---|---|---|---|---|---|")
  key_of = lambda d: (d["lhs"], d["rhs"], d["out"], d["lhs_contracting"],
                      d["rhs_contracting"])
  count = collections.Counter((d["kernel"], form_of(d)) + key_of(d)
                              for d in dots)
  # Batched (attention) products first, then the 2D ones, largest first.
  order = lambda k: (-len(k[2]), k[2:])
  for k in sorted(count, key=order):
    kernel, form, lhs, rhs, out = k[:5]
    print(f"| {kernel} | {form} | {list(lhs)} | {list(rhs)} | {list(out)} "
          f"| {count[k]} |")

  torch = None
  if fl.torch:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_flush_denormal(True)  # as XLA's CPU code does
    torch.set_num_threads(os.cpu_count())
  calls, threads, flop, alone, label, in_step = {}, {}, {}, {}, {}, {}
  rng = np.random.default_rng(0)
  # Each distinct product once (a shape can sit in two kernels' fusions).
  for k in dict.fromkeys(k[2:] for k in sorted(count, key=order)):
    d = next(d for d in dots if key_of(d) == k)
    lhs, rhs, out = k[:3]
    key = f"{list(lhs)} x {list(rhs)} ({form_of(d)})"
    label[key] = d
    in_step[key] = sum(n for c, n in count.items() if c[2:] == k)
    a = rng.standard_normal(lhs, np.float32)
    bb = rng.standard_normal(rhs, np.float32)
    numbers = ((d["lhs_contracting"], d["rhs_contracting"]),
               (d["lhs_batch"], d["rhs_batch"]))
    ja, jb = jnp.asarray(a), jnp.asarray(bb)
    f = jax.jit(lambda x, y, n=numbers: jax.lax.dot_general(x, y, n)).lower(
        ja, jb).compile()
    alone[key] = "+".join(sorted({e["kernel"] for e in step_dots(
        f.as_text())}))
    calls[f"XLA {key}"] = lambda f=f, ja=ja, jb=jb: f(ja, jb)
    threads[key] = _cpu_per_wall(calls[f"XLA {key}"])
    flop[key] = 2 * np.prod(out) * np.prod([lhs[i] for i in
                                            d["lhs_contracting"]])
    if torch is not None:
      ta, tb = (torch.from_numpy(np.ascontiguousarray(x))
                for x in gemm_operands(d, a, bb))
      calls[f"torch {key}"] = lambda ta=ta, tb=tb: torch.matmul(ta, tb)
  for fn in calls.values():
    jax.block_until_ready(fn())
  # Before each timing a block of 5 untimed calls of the same, then a
  # timed block of 5. A single untimed call was too short: a 2 ms product
  # right after the other library's took up to 1.5x its time alone, the
  # other's worker threads still spinning on the 2 cores.
  warm = {k: (lambda fn=fn: [jax.block_until_ready(fn()) for _ in range(5)])
          for k, fn in calls.items()}
  times = timing.interleaved_times(calls, fl.rounds, setups=warm,
                                   repeat={k: 5 for k in calls})
  print(f"\nEach dot alone on operands in the layout it gets in the step "
        f"(torch: `matmul` of the same [batch, M, K] x [batch, K, N]), "
        f"medians of {fl.rounds} interleaved rounds of 5 calls:\n")
  print("| dot (form) | count | kernel in the step / alone | XLA ms "
        "| XLA GFLOP/s | XLA CPU s per wall s | torch ms | torch GFLOP/s "
        "| XLA / torch (range) |\n|---|---|---|---|---|---|---|---|---|")
  for key in threads:
    x = statistics.median(times[f"XLA {key}"])
    row = (f"| {key} | {in_step[key]} | {label[key]['kernel']} / "
           f"{alone[key]} | {1e3 * x:.2f} "
           f"| {flop[key] / x / 1e9:.0f} | {threads[key]:.2f} | ")
    if torch is not None:
      tt = times[f"torch {key}"]
      r = [p / q for p, q in zip(times[f"XLA {key}"], tt)]
      row += (f"{1e3 * statistics.median(tt):.2f} | "
              f"{flop[key] / statistics.median(tt) / 1e9:.0f} | "
              f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |")
    else:
      row += "- | - | - |"
    print(row)
  # Each product's median times its count in the step: what the step's
  # products would take at these rates, one after another.
  total = lambda lib: sum(statistics.median(times[f"{lib} {key}"]) * n
                          for key, n in in_step.items())
  line = f"\nSummed over the step's products: XLA {1e3 * total('XLA'):.0f} ms"
  if torch is not None:
    line += f", torch {1e3 * total('torch'):.0f} ms"
  print(line)

  (_, _, lhs, rhs, *_), _ = collections.Counter(
      {k: n for k, n in count.items() if len(k[2]) > 2}).most_common(1)[0]
  d = next(d for d in dots if (d["lhs"], d["rhs"]) == (lhs, rhs))
  numbers = ((d["lhs_contracting"], d["rhs_contracting"]),
             (d["lhs_batch"], d["rhs_batch"]))
  dot = lambda x, y: jax.lax.dot_general(x, y, numbers)
  copies = {}
  for n in dict.fromkeys((1, 2, fl.copies)):
    xs, ys = ([jnp.asarray(rng.standard_normal(shape, np.float32))
               for _ in range(n)] for shape in (lhs, rhs))
    f = jax.jit(lambda xs, ys: [dot(x, y) for x, y in zip(xs, ys)])
    copies[n] = lambda f=f, xs=xs, ys=ys: f(xs, ys)
  times = timing.interleaved_times(copies, fl.rounds, setups=copies,
                                   repeat={k: 5 for k in copies})
  print(f"\n{list(lhs)} x {list(rhs)}, independent copies on different "
        "operands in one program:\n\n| products | ms per product "
        "| CPU s per wall s |\n|---|---|---|")
  for n, fn in copies.items():
    print(f"| {n} | {1e3 * statistics.median(times[n]) / n:.2f} | "
          f"{_cpu_per_wall(fn):.2f} |")


if __name__ == "__main__":
  # Defined here, not on import, so that tests can import the helpers.
  flags.DEFINE_string("shape", "text_size", "A key of configs/benchmark.py's "
                      "train_step.specs.")
  flags.DEFINE_string("path", "einsum", "The attention path whose compiled "
                      "step is read.")
  flags.DEFINE_integer("rounds", 20, "Interleaved timing rounds.")
  flags.DEFINE_integer("copies", 12, "The largest number of independent "
                       "products in one program (last table).")
  flags.DEFINE_bool("torch", True, "Time torch's products too.")
  app.run(main)
