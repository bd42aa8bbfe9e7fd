r"""One config trained on one device and on a 2x4 mesh: the same loss curve?

  python -m experiments.mesh_check --workdir=runs/mesh_check

About 3 minutes on 2 CPU cores. Runs the training entry point twice, each
in its own process, with the same (shortened) config, configs/mesh_check.py
(the model and task of configs/copy.py; its `experiment` group sets the
steps and the mesh, e.g. `--config.experiment.steps=300`):

  one device:  python -m experiments.train --config=configs/mesh_check.py ...
  2x4 mesh:    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
               python -m experiments.train --config=configs/mesh_check.py \
               ... --config.mesh.data=2 --config.mesh.model=4

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
from ml_collections import config_flags
import numpy as np

from mha_jax.measure import report as report_lib
from mha_jax.measure import curves
from mha_jax.parallel import sharding
from mha_jax.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/mesh_check.py", "The config both runs train; "
    "override fields as --config.experiment.steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/mesh_check", "Output folder.")


def _env(devices: int) -> dict:
  """The environment of a child run: CPU, with `devices` simulated ones."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags_ = [f for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
  if devices > 1:
    flags_.append(f"--xla_force_host_platform_device_count={devices}")
  env["XLA_FLAGS"] = " ".join(flags_)
  return env


def _train(config_args, run_dir: pathlib.Path, devices: int,
           overrides) -> dict:
  shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume
  cmd = [sys.executable, "-m", "experiments.train", *config_args,
         f"--workdir={run_dir}", *overrides]
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


def compare(config, workdir, config_args) -> dict:
  """Both training runs, then the comparison; returns every number.

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
  state1, trained = train.load_state(one)
  state2, _ = train.load_state(meshed)
  results["final_params_max_abs_diff"] = _max_abs_diff(state1.params,
                                                       state2.params)
  mesh = sharding.make_mesh(data, model, jax.devices()[:data * model])
  results["bytes"] = _bytes(state1, mesh)
  results["devices"] = jax.device_count()
  results["model"] = trained.model.to_dict()
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

{report_lib.md_table(["step", "one device", "mesh", "abs diff"], rows)}

Bytes on each of the {r['devices']} devices (per_device lists the distinct
values; leaves split on "model" must hold total / {m['model']}):

{report_lib.md_table(["tree", "total", "per device", "split leaves",
                  "split bytes", "split leaves hold total/model"],
                 byte_rows)}

Wall time (one device {r['runs']['one_device']['wall_s']:.0f} s, mesh
{r['runs']['mesh']['wall_s']:.0f} s, both including compilation) is not a
speed claim: the eight simulated devices share the same CPU cores.

Reproduce: `python -m experiments.mesh_check --workdir=runs/mesh_check`.
"""


def run(config, workdir, config_args) -> dict:
  """`compare`, then write report.md and results.json into `workdir`."""
  results = compare(config, workdir, config_args)
  text = report(results)
  print(text)
  return report_lib.write_outputs(workdir, results, text)


def main(argv):
  report_lib.check_no_arguments(argv)
  e = _CONFIG.value.experiment
  need = e.data * e.model
  if jax.device_count() < need:
    # The analysis needs the devices too; they exist only if XLA_FLAGS is
    # set before JAX starts, so start again with it.
    os.execve(sys.executable, [sys.executable, "-m", "experiments.mesh_check",
                               *sys.argv[1:]], _env(need))
  # The children read the same file with the same command-line overrides.
  flag = flags.FLAGS["config"]
  config_args = [f"--config={config_flags.get_config_filename(flag)}"] + [
      f"--config.{k}={v}"
      for k, v in config_flags.get_override_values(flag).items()]
  run(_CONFIG.value, _WORKDIR.value, config_args)


if __name__ == "__main__":
  app.run(main)
