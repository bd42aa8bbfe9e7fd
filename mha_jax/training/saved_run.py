"""A finished or stopped run read back from its workdir: its config, the
steps of its checkpoints, its state and its trained model.
"""

from __future__ import annotations

import json
import pathlib

import ml_collections

from mha_jax.training import checkpoint
from mha_jax.training import train_state


def load_config(workdir) -> ml_collections.ConfigDict:
  """The config a run in `workdir` was started with."""
  text = (pathlib.Path(workdir) / "config.json").read_text()
  return ml_collections.ConfigDict(json.loads(text))


def check_run(workdir) -> pathlib.Path:
  """`workdir` as a path, if it holds a training run with a checkpoint.

  Raises FileNotFoundError saying what is missing (the folder, its
  config.json, or any checkpoint) and, for an experiment's folder, which
  of its sub-folders are runs; it creates nothing.
  """
  workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"--workdir={workdir}: no such directory")
  if not (workdir / "config.json").is_file():
    runs = sorted(p.name for p in workdir.iterdir()
                  if (p / "config.json").is_file())
    hint = (f"; its runs are in the sub-folders {', '.join(runs)}" if runs
            else "; train one with python -m experiments.train")
    raise FileNotFoundError(f"--workdir={workdir}: no config.json, so not a "
                            f"training run{hint}")
  ckpt = workdir / "checkpoints"
  if not ckpt.is_dir() or not checkpoint_steps(workdir):
    raise FileNotFoundError(f"--workdir={workdir}: no checkpoint in "
                            f"{ckpt}; train the run (python -m "
                            "experiments.train) before reading it")
  return workdir


def checkpoint_steps(workdir) -> list[int]:
  """The steps of a run's saved checkpoints, sorted (its folder names)."""
  return sorted(int(p.name) for p in
                (pathlib.Path(workdir) / "checkpoints").iterdir()
                if p.name.isdigit())


def load_state(workdir, step: int | None = None):
  """`(TrainState, config)` of a run, from checkpoint `step` (None: latest).

  Step 0 is the state the run started from: runs save no checkpoint there,
  so unless one exists it is rebuilt from the config's seed, as
  `train_and_evaluate` built it (the untrained baseline of an analysis).
  A folder that is not a run with a checkpoint fails by `check_run`.
  """
  config = load_config(check_run(workdir))
  tr = config.train
  state = train_state.create_train_state(config)
  manager = checkpoint.make_manager(workdir, tr.checkpoint_every,
                                    tr.max_checkpoints)
  try:
    saved = sorted(manager.all_steps())
    if step is None and not saved:
      raise FileNotFoundError(f"load_state: no checkpoint in {workdir}")
    step = saved[-1] if step is None else step
    if step in saved:
      state = checkpoint.restore(manager, state, step)
    elif step != 0:
      raise FileNotFoundError(f"load_state: `step` {step} has no checkpoint "
                              f"in {workdir}; saved steps: {saved}")
  finally:
    checkpoint.close(manager)
  return state, config


def load_model(workdir, step: int | None = None):
  """`(model, config)`: a run's trained nnx model (analysis, decoding)."""
  state, config = load_state(workdir, step)
  return state.model(), config
