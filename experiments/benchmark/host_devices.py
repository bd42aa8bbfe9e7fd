r"""A training step on one CPU device against a data mesh of host devices.

  python -m experiments.benchmark.host_devices [--shapes=induction,text_size,random] \
      [--path=einsum] [--devices=2] [--pairs=3] [--steps=15]

XLA's CPU backend runs each batched attention product on one thread (see
`experiments.benchmark.attention_products`), and a training step is
mostly a chain of operations each waiting for the last, so on a machine
with two cores one of them idles through much of it. XLA can instead present
the CPU as several devices (`XLA_FLAGS=--xla_force_host_platform_device_
count=N`, read when JAX starts); the training loop's data mesh
(`config.mesh.data=-1` takes every device) then gives each device its
share of the batch, and the devices' programs run side by side.

This times the same train step (configs/benchmark.py's `train_step.specs`,
or its "random" shape drawn with `--random_seed`; the first batch, `--steps` steps after 3 untimed ones) in fresh
processes, one with the default single device and one with `--devices`
host devices, alternating which goes first, `--pairs` times per shape.
Per shape: each side's median step, the per-pair ratio (devices / one),
CPU seconds per wall second, and the loss after the timed steps on both
(the same model and data: they differ by the order of the batch mean's
additions only).

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


def _child(shape: str, path: str, steps: int, seed: int) -> dict:
  """Time `steps` train steps of `shape` on all of this process's devices
  (`train_step.jax_step`: the training loop's data mesh when there are
  more than one)."""
  # pylint: disable=g-import-not-at-top
  import jax
  from experiments.benchmark import train_step
  from mha_jax.training import host_memory
  # pylint: enable=g-import-not-at-top
  host_memory.keep_freed_memory()
  c = train_step.experiment_config(train_step.spec_of(shape, seed), path)
  step, _, _ = train_step.jax_step(c, jax.device_count())
  for _ in range(3):
    step()
  times, cpu0, wall0 = [], time.process_time(), time.perf_counter()
  for _ in range(steps):
    start = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - start)
  cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
  return {"devices": jax.device_count(),
          "step_ms": 1e3 * statistics.median(times),
          "cpu_per_wall": cpu, "loss": float(loss)}


def _run(shape: str, devices: int) -> dict:
  """One fresh process timing `shape` on `devices` host devices."""
  fl = flags.FLAGS
  from experiments import cli  # pylint: disable=g-import-not-at-top
  out = subprocess.run(
      [sys.executable, "-m", "experiments.benchmark.host_devices", "--child",
       f"--shapes={shape}", f"--path={fl.path}",
       f"--steps={fl.steps}", f"--random_seed={fl.random_seed}"],
      env=cli.env_with_devices(devices), capture_output=True, text=True,
      check=False)
  if out.returncode:
    raise RuntimeError(f"host_devices: the {devices}-device run of {shape} "
                       f"failed:\n{out.stderr[-2000:]}")
  row = json.loads(out.stdout.strip().splitlines()[-1])
  if row["devices"] != devices:
    raise RuntimeError(f"host_devices: asked for {devices} devices, the run "
                       f"had {row['devices']}")
  return row


def main(argv):
  del argv
  fl = flags.FLAGS
  shapes = [s for s in fl.shapes.split(",") if s]
  if fl.child:
    print(json.dumps(_child(shapes[0], fl.path, fl.steps,
                            fl.random_seed)))
    return
  if fl.devices < 2:
    raise app.UsageError(f"--devices: expected 2 or more, got "
                         f"{fl.devices}")
  n = fl.devices
  print(f"{fl.path} train step, 1 device against {n} host devices "
        f"(data mesh), {fl.pairs} alternating pairs of fresh processes, "
        f"{fl.steps} timed steps each:\n")
  print(f"| shape | 1 device ms | {n} devices ms | {n} / 1 per pair (range) "
        f"| CPU s per wall s (1 / {n}) | loss 1 / {n} |\n"
        "|---|---|---|---|---|---|")
  for shape in shapes:
    one, many = [], []
    for p in range(fl.pairs):
      order = (1, n) if p % 2 == 0 else (n, 1)
      rows = {d: _run(shape, d) for d in order}
      one.append(rows[1])
      many.append(rows[n])
    ratio = [m["step_ms"] / o["step_ms"] for o, m in zip(one, many)]
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    print(f"| {shape} | {med(one, 'step_ms'):.1f} | "
          f"{med(many, 'step_ms'):.1f} | {statistics.median(ratio):.2f} "
          f"({min(ratio):.2f}-{max(ratio):.2f}) | "
          f"{med(one, 'cpu_per_wall'):.2f} / {med(many, 'cpu_per_wall'):.2f}"
          f" | {one[0]['loss']:.7f} / {many[0]['loss']:.7f} |", flush=True)


if __name__ == "__main__":
  # Defined here, not on import, so that tests can import the helpers.
  flags.DEFINE_string("shapes", "induction,text_size,random",
                      "Keys of configs/benchmark.py's train_step.specs, or "
                      "random, comma-separated.")
  flags.DEFINE_string("path", "einsum", "mha_jax's implementation.")
  flags.DEFINE_integer("devices", 2, "Host devices of the mesh run.")
  flags.DEFINE_integer("pairs", 3, "Alternating pairs of processes per "
                       "shape.")
  flags.DEFINE_integer("steps", 15, "Timed steps per process.")
  flags.DEFINE_integer("random_seed", 1006221605, "Seed of the random "
                       "shape's sizes (train_step.random_spec; the "
                       "committed runs' seed).")
  flags.DEFINE_bool("child", False, "Internal: time one shape in this "
                    "process and print one JSON line.")
  app.run(main)
