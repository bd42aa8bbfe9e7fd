"""Training runs of the experiments: one folder per (setting, seed).

An experiment trains its config under a few overrides (a depth, a head
count) and several seeds, each run into its own folder below the
experiment's workdir (`config.json`, `metrics.jsonl`, `checkpoints/`, as
`train.train_and_evaluate` writes them), then analyses the trained models.

This is plumbing, but it lives in the library rather than beside the entry
points: most experiments train through it (and the two-offset sweep of
`experiments/offset_sweep.py`, which two of them share), and an experiment
must not import another's folder. Whether a finished run may be reused is
an argument of each call, not state of the process; the one thing the
process keeps is a count of the runs it started, for the console line
"Training run k of n of this setting (run m of the command)" that opens
each run (the settings are the experiment's loop, unknown here, so n
counts the seeds of one `seed_runs` call and m every run so far).
"""

from __future__ import annotations

from collections.abc import Iterator
import itertools
import pathlib
import shutil
from typing import NamedTuple

from absl import logging
import ml_collections

from mha_jax.training import config as config_lib
from mha_jax.measure import curves
from mha_jax.training import train
from mha_jax.training import saved_run
from mha_jax.training import train_state


def variant(config, **overrides) -> ml_collections.ConfigDict:
  """A validated copy of `config` with dotted overrides.

  `variant(c, **{"model.num_heads": 8, "train.seed": 1})`; `config` itself
  is left unchanged. Raises ValueError naming the field when the result is
  inconsistent (see `config.validate_config`).
  """
  c = ml_collections.ConfigDict(config.to_dict())
  for path, value in overrides.items():
    parts = path.split(".")
    if len(parts) != 2 or parts[0] not in c:
      raise ValueError(f"variant: overrides are 'group.field' with a group of "
                       f"the config ({sorted(c.keys())}), got {path!r}")
    c[parts[0]][parts[1]] = value
  config_lib.validate_config(c)
  return c


# Runs started by this process, for the console lines.
_RUN_COUNT = itertools.count(1)


def train_run(config, run_dir, *, reuse: bool = False,
              label: str = "") -> train_state.TrainState:
  """Train `config` from scratch into `run_dir`; return the final state.

  An older run in `run_dir` is deleted first: resuming it could mix two
  configs, and a report must describe the config it states. With `reuse`,
  a finished run whose config.json equals `config` is loaded instead (to
  redo only the analysis). The console line that opens the run says
  which it is: `label` ("run 2 of 3 of this setting") and its number
  among the runs of this process.
  """
  run_dir = pathlib.Path(run_dir)
  which = f"run {next(_RUN_COUNT)} of the command"
  which = f"{label} ({which})" if label else which
  if reuse and (run_dir / "config.json").exists():
    same = ((run_dir / "config.json").read_text()
            == config.to_json_best_effort(indent=2))
    finished = curves.read(run_dir, "train")[0][-1:] == [
        config.train.num_steps]
    if same and finished:
      logging.info("Reusing %s: %s", which, run_dir)
      return saved_run.load_state(run_dir)[0]
  shutil.rmtree(run_dir, ignore_errors=True)
  logging.info("Training %s: %s", which, run_dir)
  return train.train_and_evaluate(config, run_dir)


class SeedRun(NamedTuple):
  """One trained run of `seed_runs`."""
  seed: int
  config: ml_collections.ConfigDict  # the config it was trained with
  run_dir: pathlib.Path
  state: train_state.TrainState


def seed_runs(config, workdir, seeds, name: str = "seed{seed}", *,
              reuse: bool = False, **overrides) -> Iterator[SeedRun]:
  """Train `config` with `overrides` once per seed, in order; yield each run.

  Run `seed` goes to `workdir / name.format(seed=seed)` with
  `train.seed = seed`; `overrides` are dotted as in `variant`. Runs are
  trained lazily, one per step of the iteration, so a caller can analyse
  each model before the next one trains.
  """
  seeds = tuple(seeds)
  for k, seed in enumerate(seeds, 1):
    c = variant(config, **overrides, **{"train.seed": seed})
    run_dir = pathlib.Path(workdir) / name.format(seed=seed)
    label = f"run {k} of {len(seeds)} of this setting"
    yield SeedRun(seed, c, run_dir,
                  train_run(c, run_dir, reuse=reuse, label=label))
