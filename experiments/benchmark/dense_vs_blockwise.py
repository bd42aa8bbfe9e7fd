r"""The dense path against the blockwise one on CPU, by the size of the scores.

  python -m experiments.benchmark.dense_vs_blockwise [--nokeep_freed_memory]

`attend` alone (no projections): `einsum`, which forms the float32 scores
[B, H, Tq, Tk], against `flash`, which never does, forward and
forward+backward (the gradient of sum(out^2) with respect to q, k and v),
each compiled ahead of time and timed in interleaved rounds, the order
rotating each round (`measure.timing.interleaved_times`); a time is the
median over the rounds after the first two. The shapes grow the
scores from 8 to 512 MiB at H = 8, Dh = 32 (and one at Dh = 64), causal
and not. `auto`'s CPU rule (`kernels/auto.py`, CPU_DENSE_SCORE_BYTES)
is read off this table; docs/performance.md quotes a run. Writes nothing.
"""

from __future__ import annotations

import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from mha_jax.core import attention
from mha_jax.measure import timing
from mha_jax.training import host_memory

# (B, T, H, Dh): float32 scores of 8, 32, 64, 128, 256, 512 MiB, then the
# standard benchmark shape at Dh = 64.
SHAPES = ((16, 128, 8, 32), (16, 256, 8, 32), (8, 512, 8, 32),
          (4, 1024, 8, 32), (2, 2048, 8, 32), (1, 4096, 8, 32),
          (8, 512, 8, 64))
PATHS = ("einsum", "flash")


def _programs(shape, is_causal):
  """{(path, mode): compiled program} and its arguments."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32)
             for _ in range(3))
  programs = {}
  for path in PATHS:
    def forward(q, k, v, path=path):
      return attention.attend(q, k, v, is_causal=is_causal,
                              implementation=path)[0]
    grad = jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v) ** 2),
                    argnums=(0, 1, 2))
    for mode, fn in (("fwd", forward), ("fwd+bwd", grad)):
      programs[path, mode] = jax.jit(fn).lower(q, k, v).compile()
  return programs, (q, k, v)


def measure(shape, is_causal, rounds):
  """Median ms of each (path, mode), interleaved over `rounds` (the first
  two rounds left out)."""
  programs, args = _programs(shape, is_causal)
  times = timing.interleaved_times(
      {key: functools.partial(program, *args)
       for key, program in programs.items()}, rounds)
  return {key: 1e3 * statistics.median(t[2:]) for key, t in times.items()}


def main(argv):
  del argv
  fl = flags.FLAGS
  if fl.keep_freed_memory:
    kept = host_memory.keep_freed_memory()
    print(f"host memory kept: {kept['applied']} ({kept['reason']})")
  print("| causal | B, T, H, Dh | scores MiB | fwd einsum / flash ms | ratio "
        "| fwd+bwd einsum / flash ms | ratio |")
  print("|---|---|---|---|---|---|---|")
  for is_causal in (True, False):
    for shape in SHAPES:
      b, t, h, _ = shape
      ms = measure(shape, is_causal, fl.rounds)
      cells = []
      for mode in ("fwd", "fwd+bwd"):
        dense, blockwise = ms["einsum", mode], ms["flash", mode]
        cells += [f"{dense:.1f} / {blockwise:.1f}", f"{dense / blockwise:.2f}"]
      print(f"| {is_causal} | {', '.join(map(str, shape))} | "
            f"{4 * b * h * t * t / 2 ** 20:.0f} | {' | '.join(cells)} |",
            flush=True)


if __name__ == "__main__":
  flags.DEFINE_integer("rounds", 7, "Timed calls of each program (the "
                       "first two are dropped).")
  flags.DEFINE_bool("keep_freed_memory", True, "Keep freed host memory "
                    "for reuse first (training/host_memory.py).")
  app.run(main)
