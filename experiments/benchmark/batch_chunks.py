r"""The training step with the einsum path's batch chunks on and off.

  python -m experiments.benchmark.batch_chunks [--shapes=induction,text_size,random] \
      [--path=einsum] [--rounds=20] [--processes=3]

On CPU the einsum path computes a call whose float32 scores reach
`mha_jax.core.batch_chunks.MIN_SCORE_BYTES` in independent chunks of the
batch (that module says why). This times the same train step
(configs/benchmark.py's `train_step.specs`, or its "random" shape drawn
with `--random_seed`; the first batch) compiled twice in one process:
once with the threshold out of reach (the whole batch at once) and once
as the library runs it, alternating the two, `--rounds` steps each after
2 untimed ones, in `--processes` fresh processes per shape. Per shape:
the chunk count the rule gives, each side's median step, the median of
the per-round ratios (chunked / whole) of each process, CPU seconds per
wall second, and whether the losses after the last step are the same
bits.

Writes nothing: the table goes to stdout (docs/performance.md quotes
one).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags


def chunks_of(c) -> int:
  """The chunk count `batch_chunks.count` gives config `c`'s attention
  calls (self-attention: Tq = Tk = the task's sequence length)."""
  # pylint: disable=g-import-not-at-top
  from mha_jax import hooks
  from mha_jax.core import batch_chunks
  from mha_jax.training import config as config_lib
  # pylint: enable=g-import-not-at-top
  m = config_lib.model_config(c)
  t = c.task.seq_len
  return batch_chunks.count(c.task.batch_size, m.num_heads, t, t,
                            hooks.NO_HOOKS)


def _child(shape: str, path: str, rounds: int, seed: int) -> dict:
  """Both programs of `shape` in this process, alternating."""
  # pylint: disable=g-import-not-at-top
  import jax
  from experiments.benchmark import train_step
  from mha_jax.core import batch_chunks
  from mha_jax.training import host_memory
  from mha_jax.training import train
  # pylint: enable=g-import-not-at-top
  host_memory.keep_freed_memory()
  c = train_step.experiment_config(train_step.spec_of(shape, seed), path)
  batch = train.batch_fn(c)(jax.random.PRNGKey(0))
  runs, threshold = {}, batch_chunks.MIN_SCORE_BYTES
  for name, at in (("whole", float("inf")), ("chunked", threshold)):
    batch_chunks.MIN_SCORE_BYTES = at  # read while tracing, below
    state = train.create_train_state(c)
    # A fresh function per program: jit's trace cache keys on it.
    step = jax.jit(lambda s, b: train.train_step(s, b), donate_argnums=0)
    runs[name] = [step.lower(state, batch).compile(), state]
  batch_chunks.MIN_SCORE_BYTES = threshold
  times = {k: [] for k in runs}
  cpu = dict.fromkeys(runs, 0.0)
  loss = {}
  for r in range(rounds + 2):
    for name, run in runs.items():
      wall0, cpu0 = time.perf_counter(), time.process_time()
      run[1], metrics = run[0](run[1], batch)
      loss[name] = float(jax.block_until_ready(metrics["loss"]))
      if r >= 2:
        times[name].append(time.perf_counter() - wall0)
        cpu[name] += time.process_time() - cpu0
  return {"chunks": chunks_of(c),
          "ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
          "ratio": statistics.median(
              c_ / w for w, c_ in zip(times["whole"], times["chunked"])),
          "cpu_per_wall": {k: cpu[k] / sum(times[k]) for k in runs},
          "same_loss": loss["whole"] == loss["chunked"]}


def main(argv):
  del argv
  fl = flags.FLAGS
  shapes = [s for s in fl.shapes.split(",") if s]
  if fl.child:
    print(json.dumps(_child(shapes[0], fl.path, fl.rounds, fl.random_seed)))
    return
  print(f"{fl.path} train step, batch chunks off (whole) and on (chunked), "
        f"alternating in one process, {fl.rounds} timed steps each, "
        f"{fl.processes} fresh processes per shape:\n")
  print("| shape | chunks | whole ms | chunked ms | chunked / whole per "
        "process | CPU s per wall s (whole / chunked) | same loss bits |\n"
        "|---|---|---|---|---|---|---|")
  for shape in shapes:
    rows = []
    for _ in range(fl.processes):
      out = subprocess.run(
          [sys.executable, "-m", "experiments.benchmark.batch_chunks",
           "--child", f"--shapes={shape}", f"--path={fl.path}",
           f"--rounds={fl.rounds}", f"--random_seed={fl.random_seed}"],
          capture_output=True, text=True, check=False)
      if out.returncode:
        raise RuntimeError(f"batch_chunks: the run of {shape} failed:\n"
                           f"{out.stderr[-2000:]}")
      rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = lambda k, side: statistics.median(r[k][side] for r in rows)
    ratios = ", ".join(f"{r['ratio']:.3f}" for r in rows)
    print(f"| {shape} | {rows[0]['chunks']} | {med('ms', 'whole'):.1f} | "
          f"{med('ms', 'chunked'):.1f} | "
          f"{ratios} | "
          f"{med('cpu_per_wall', 'whole'):.2f} / "
          f"{med('cpu_per_wall', 'chunked'):.2f} | "
          f"{'yes' if all(r['same_loss'] for r in rows) else 'no'} |",
          flush=True)


if __name__ == "__main__":
  # Defined here, not on import, so that tests can import the helpers
  # (the flags of `host_devices`, which times shapes the same way).
  flags.DEFINE_string("shapes", "induction,text_size,random",
                      "Keys of configs/benchmark.py's train_step.specs, or "
                      "random, comma-separated.")
  flags.DEFINE_string("path", "einsum", "mha_jax's implementation.")
  flags.DEFINE_integer("rounds", 20, "Timed steps of each program.")
  flags.DEFINE_integer("processes", 3, "Fresh processes per shape.")
  flags.DEFINE_integer("random_seed", 1006221605, "Seed of the random "
                       "shape's sizes (train_step.random_spec; the "
                       "committed runs' seed).")
  flags.DEFINE_bool("child", False, "Internal: time one shape in this "
                    "process and print one JSON line.")
  app.run(main)
