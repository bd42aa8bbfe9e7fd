r"""One config trained on one device and on a 2x4 mesh: the same loss curve?

  python -m experiments.mesh_check --workdir=runs/mesh_check

About 3 minutes on 2 CPU cores. Runs the training entry point twice, each
in its own process, with the same (shortened) config:

  one device:  python -m experiments.train --config=configs/copy.py ...
  2x4 mesh:    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
               python -m experiments.train --config=configs/copy.py ... \
               --config.mesh.data=2 --config.mesh.model=4

then loads both final checkpoints and writes report.md / results.json:
the largest loss difference per logged step, the largest parameter
difference at the end, and the parameter bytes each device holds (every
split leaf must hold 1 / mesh.model of itself). Eight simulated devices
share the same CPU cores, so the wall times are NOT a speed claim.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from experiments import common
from mha_jax import sharding
from mha_jax import train

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"



def _define_flags():
  """Defined only when run as a program: importing this module (tests, other
  entry points with their own --config) must not clash on flag names."""
  flags.DEFINE_string("config", "configs/copy.py",
                      "Config file both runs train.")
  flags.DEFINE_string("workdir", "runs/mesh_check", "Output folder.")
  flags.DEFINE_integer("steps", 150, "Training steps of each run.")
  flags.DEFINE_integer("data", 2, "Data axis of the mesh run.")
  flags.DEFINE_integer("model", 4, "Model (head) axis of the mesh run.")


def _env(devices: int) -> dict:
  """The environment of a child run: CPU, with `devices` simulated ones."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags_ = [f for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
  if devices > 1:
    flags_.append(f"--xla_force_host_platform_device_count={devices}")
  env["XLA_FLAGS"] = " ".join(flags_)
  return env


def _train(config_path, run_dir: pathlib.Path, devices: int,
           overrides) -> dict:
  shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume
  cmd = [sys.executable, "-m", "experiments.train",
         f"--config={config_path}", f"--workdir={run_dir}", *overrides]
  start = time.time()
  subprocess.run(cmd, env=_env(devices), check=True)
  shown = " ".join(cmd[1:])
  if devices > 1:
    shown = f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} " \
            f"python {shown}"
  else:
    shown = f"python {shown}"
  return {"command": shown, "wall_s": time.time() - start}


def _max_abs_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                             strict=True))


def _bytes(state, mesh) -> dict:
  """Parameter and optimizer bytes: total and on each device, split leaves."""
  placed = sharding.shard_tree(state, mesh)
  out = {}
  for name, tree in (("params", placed.params),
                     ("opt_state", placed.opt_state)):
    got = sharding.bytes_per_device(tree)
    split = [leaf for leaf in jax.tree.leaves(tree)
             if sharding.MODEL in leaf.sharding.spec]
    split_ok = all(
        {s.data.nbytes for s in leaf.addressable_shards}
        == {leaf.nbytes // mesh.shape[sharding.MODEL]} for leaf in split)
    out[name] = {"total": got["total"],
                 "per_device": sorted(set(got["per_device"].values())),
                 "split_leaves": len(split),
                 "split_bytes": sum(leaf.nbytes for leaf in split),
                 "split_leaves_hold_total_over_model": split_ok}
  return out


def run(workdir: pathlib.Path, config_path: str, steps: int, data: int,
        model: int) -> dict:
  """Both training runs, then the comparison; returns every number."""
  short = [f"--config.train.num_steps={steps}", "--config.train.log_every=1",
           f"--config.train.eval_every={max(steps // 3, 1)}",
           f"--config.train.checkpoint_every={steps}",
           f"--config.train.warmup_steps={min(20, steps // 2)}"]
  one = workdir / "one_device"
  meshed = workdir / f"mesh{data}x{model}"
  runs = {"one_device": _train(config_path, one, 1,
                               short + ["--config.mesh.data=1"]),
          "mesh": _train(config_path, meshed, data * model, short + [
              f"--config.mesh.data={data}", f"--config.mesh.model={model}"])}

  results = {"config": config_path, "steps": steps,
             "mesh": {"data": data, "model": model}, "runs": runs}
  for split in ("train", "eval"):
    s1, l1 = common.curve(one, split)
    s2, l2 = common.curve(meshed, split)
    assert s1 == s2, (s1, s2)
    diff = np.abs(np.asarray(l1) - np.asarray(l2))
    results[split] = {"steps": s1, "loss_one_device": l1, "loss_mesh": l2,
                      "abs_diff": diff, "max_abs_diff": float(diff.max()),
                      "max_rel_diff": float(np.max(diff / np.abs(l1)))}
  state1, config = train.load_state(one)
  state2, _ = train.load_state(meshed)
  results["final_params_max_abs_diff"] = _max_abs_diff(state1.params,
                                                       state2.params)
  mesh = sharding.make_mesh(data, model, jax.devices()[:data * model])
  results["bytes"] = _bytes(state1, mesh)
  results["devices"] = jax.device_count()
  results["model"] = config.model.to_dict()
  return results


def report(r: dict) -> str:
  tr, ev, by = r["train"], r["eval"], r["bytes"]
  m = r["mesh"]
  worst = int(np.argmax(tr["abs_diff"]))
  rows = [[s, f"{a:.6f}", f"{b:.6f}", f"{d:.2e}"] for s, a, b, d in zip(
      ev["steps"], ev["loss_one_device"], ev["loss_mesh"], ev["abs_diff"])]
  byte_rows = [[k, v["total"], ", ".join(map(str, v["per_device"])),
                v["split_leaves"], v["split_bytes"],
                v["split_leaves_hold_total_over_model"]]
               for k, v in by.items()]
  return f"""# Same loss curve on one device and on a {m['data']}x{m['model']} mesh

Config `{r['config']}`, {r['steps']} steps, shortened by overrides:

    {r['runs']['one_device']['command']}
    {r['runs']['mesh']['command']}

Train loss, every step: largest |difference| {tr['max_abs_diff']:.2e}
(relative {tr['max_rel_diff']:.2e}) at step {tr['steps'][worst]}; final
parameters differ by at most {r['final_params_max_abs_diff']:.2e}. The runs
are not bit-identical because sharded matmuls sum over heads, MLP width and
batch in another order (per-device partial sums, then an all-reduce).

Eval loss:

{common.md_table(["step", "one device", "mesh", "abs diff"], rows)}

Bytes on each of the {r['devices']} devices (per_device lists the distinct
values; leaves split on "model" must hold total / {m['model']}):

{common.md_table(["tree", "total", "per device", "split leaves",
                  "split bytes", "split leaves hold total/model"],
                 byte_rows)}

Wall time (one device {r['runs']['one_device']['wall_s']:.0f} s, mesh
{r['runs']['mesh']['wall_s']:.0f} s, both including compilation) is not a
speed claim: the eight simulated devices share the same CPU cores.

Reproduce: `python -m experiments.mesh_check --workdir=runs/mesh_check`.
"""


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  need = f.data * f.model
  if jax.device_count() < need:
    # The analysis needs the devices too; they exist only if XLA_FLAGS is
    # set before JAX starts, so start again with it.
    os.execve(sys.executable, [sys.executable, "-m", "experiments.mesh_check",
                               *sys.argv[1:]], _env(need))
  workdir = pathlib.Path(f.workdir)
  results = run(workdir, f.config, f.steps, f.data, f.model)
  common.write_outputs(workdir, results, report(results))
  print(report(results))


if __name__ == "__main__":
  _define_flags()
  app.run(main)
