"""One config on one device and on a mesh, measuring: train both, compare.

`measure` runs the training entry point twice, each in its own process
(one device; `mesh.data x mesh.model` simulated CPU devices), then loads
both final checkpoints and compares their loss curves, parameters and the
bytes each device holds.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import time

import jax
import numpy as np

from experiments import cli
from mha_jax.measure import curves
from mha_jax.parallel import sharding
from mha_jax.training import saved_run


def _train(config_args, run_dir: pathlib.Path, devices: int,
           overrides) -> dict:
  shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume
  cmd = [sys.executable, "-m", "experiments.train", *config_args,
         f"--workdir={run_dir}", *overrides]
  start = time.time()
  subprocess.run(cmd, env=cli.env_with_devices(devices), check=True)
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

def measure(config, workdir, config_args) -> dict:
  """Both training runs, then the comparison; returns the results dict.

  `config_args` are the `--config=...` arguments that give the training
  entry point `config` (the file and the overrides this process read).
  """
  workdir = pathlib.Path(workdir)
  steps, data, model = (config.experiment.steps, config.experiment.data,
                        config.experiment.model)
  short = [f"--config.train.num_steps={steps}", "--config.train.log_every=1",
           f"--config.train.eval_every={max(steps // 3, 1)}",
           f"--config.train.checkpoint_every={steps}",
           f"--config.train.warmup_steps={min(20, steps // 2)}"]
  one = workdir / "one_device"
  meshed = workdir / f"mesh{data}x{model}"
  runs = {"one_device": _train(config_args, one, 1,
                               short + ["--config.mesh.data=1"]),
          "mesh": _train(config_args, meshed, data * model, short + [
              f"--config.mesh.data={data}", f"--config.mesh.model={model}"])}

  results = {"config": config_args[0].split("=", 1)[1], "steps": steps,
             "mesh": {"data": data, "model": model}, "runs": runs}
  for split in ("train", "eval"):
    s1, l1 = curves.read(one, split)
    s2, l2 = curves.read(meshed, split)
    assert s1 == s2, (s1, s2)
    diff = np.abs(np.asarray(l1) - np.asarray(l2))
    results[split] = {"steps": s1, "loss_one_device": l1, "loss_mesh": l2,
                      "abs_diff": diff, "max_abs_diff": float(diff.max()),
                      "max_rel_diff": float(np.max(diff / np.abs(l1)))}
  state1, trained = saved_run.load_state(one)
  state2, _ = saved_run.load_state(meshed)
  results["final_params_max_abs_diff"] = _max_abs_diff(state1.params,
                                                       state2.params)
  mesh = sharding.make_mesh(data, model, jax.devices()[:data * model])
  results["bytes"] = _bytes(state1, mesh)
  results["devices"] = jax.device_count()
  results["model"] = trained.model.to_dict()
  return results
