"""One training loop for every experiment: `train_and_evaluate`.

The loop runs the pure steps of `train_state.py` (jitted at the call
site: `step_fns`) on a state whose optimizer is `optimizer.py`'s, writes
its console lines and metric rows through `progress.py`, and saves Orbax
checkpoints (`checkpoint.py`) that `saved_run.py` reads back.

Determinism: the batch of step s is drawn from `fold_in(data_key, s)` and
the dropout key of step s is `fold_in(state.rng, s)`, so the whole run is
a function of (config, seed). A run resumed from a checkpoint therefore
replays exactly the steps it missed and ends with bit-identical parameters
(on CPU) to a run that was never stopped.

Progress: a console line right after the first step, then every
`train.log_every` steps or `progress.QUIET_S` seconds (progress.py says
how the pace leaves compilation out).
"""

from __future__ import annotations

import contextlib
import pathlib
import time

import jax
from absl import logging

from mha_jax.core import precision
from mha_jax.training import checkpoint
from mha_jax.training import config as config_lib
from mha_jax.parallel import sharding
from mha_jax.training import progress
from mha_jax.training import train_state
from mha_jax.training import workdir as workdir_lib

# Re-exported as public API, where users import them today: the docs
# (models.md, interpretability.md, explorer.md, multi_device.md) and the
# tour notebook teach `train.TrainState`, `train.create_train_state`,
# `train.compute_loss`, `train.train_step`, `train.eval_step`,
# `train.sharded_train_step_jit`, `train.load_state` and
# `train.load_model`; the benchmarks' scripts read `train.make_optimizer`,
# `train.batch_fn` and `train.train_step_jit`. The library, the tests and
# the other experiments import each from its own module.
from mha_jax.training.optimizer import make_optimizer
from mha_jax.training.saved_run import load_model
from mha_jax.training.saved_run import load_state
from mha_jax.training.train_state import batch_fn
from mha_jax.training.train_state import compute_loss
from mha_jax.training.train_state import create_train_state
from mha_jax.training.train_state import eval_step
from mha_jax.training.train_state import sharded_train_step_jit
from mha_jax.training.train_state import train_step
from mha_jax.training.train_state import train_step_jit
from mha_jax.training.train_state import TrainState

__all__ = ["TrainState", "batch_fn", "compute_loss", "create_train_state",
           "eval_step", "load_model", "load_state", "make_optimizer",
           "sharded_train_step_jit", "train_and_evaluate", "train_step",
           "train_step_jit"]


def train_and_evaluate(config, workdir, *, stop_at: int | None = None):
  """Train per `config`, writing metrics and checkpoints into `workdir`.

  Restarting with the same `workdir` resumes from the latest checkpoint.
  `stop_at` ends the run before that step WITHOUT a final checkpoint, as a
  kill would (tests use it to check that resuming loses nothing).
  Returns the final `TrainState`. While it runs, a second call on the same
  `workdir` (from any process) raises `workdir.WorkdirInUse` naming it.
  """
  config_lib.validate_config(config)
  # No process-wide setting is made here (a caller's process stays as it
  # was): the entry points that train apply host_memory.keep_freed_memory.
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  # One run per workdir (on the host that writes it): a second command
  # on the same folder is refused instead of racing this one.
  # Every step and evaluation is traced under the run's matmul precision.
  with (workdir_lib.lock(workdir) if jax.process_index() == 0
        else contextlib.nullcontext()), precision.setting_context(
            config.train.get("matmul_precision", "")):
    return _train_and_evaluate(config, workdir, stop_at)


def _train_and_evaluate(config, workdir, stop_at):
  if jax.process_index() == 0:
    (workdir / "config.json").write_text(
        config.to_json_best_effort(indent=2))
  tr = config.train
  mesh = sharding.mesh_from_config(config)
  state = train_state.create_train_state(config)
  logging.info("Mesh %s over %d devices", dict(mesh.shape), mesh.size)
  if mesh.size > 1:
    # Params and optimizer state by name rules; a checkpoint restores into
    # these shardings whatever mesh it was saved from.
    state = sharding.shard_tree(state, mesh)
  manager = checkpoint.make_manager(workdir, tr.checkpoint_every,
                                    tr.max_checkpoints)
  state = checkpoint.restore_latest(manager, state)
  start = int(state.step)
  metrics_path = workdir / "metrics.jsonl"
  if jax.process_index() == 0:
    checkpoint.truncate_metrics(metrics_path, start)
  if start:
    logging.info("Resumed from the checkpoint at step %d", start)

  step_fn, eval_fn, make = train_state.step_fns(config, mesh)
  data_key = train_state.seed_key(tr.seed, train_state.DATA)
  total = tr.num_steps
  t_start = time.time()
  # The first step of this process compiles; the pace counts from its end,
  # less the seconds the first evaluation spends compiling its own step.
  first, t_first, compiling = None, 0.0, 0.0
  t_line = t_start
  for step in range(start, total):
    if stop_at is not None and step >= stop_at:
      break
    state, metrics = step_fn(state, make(jax.random.fold_in(data_key, step)))
    done = step + 1
    logged = done % tr.log_every == 0 or done == total
    row = (progress.append_metrics(metrics_path, done, "train", metrics)
           if logged else None)
    if first is None:
      # A line within seconds of the start, whatever log_every is.
      shown = row or {k: float(v) for k, v in
                      jax.device_get(metrics).items()}  # waits for it
      first, t_first = done, time.time()
      t_line = t_first
      logging.info("step %d/%d | %s | first step %.1f s, compile included",
                   done, total, progress.fmt_metrics(shown),
                   t_first - t_start)
    elif logged or time.time() - t_line >= progress.QUIET_S:
      jax.block_until_ready(metrics)
      t_line = time.time()
      pace = progress.fmt_pace(done, total, first,
                               t_line - t_first - compiling)
      if row is None:  # a line between metric rows: the pace alone
        logging.info("step %d/%d | %s", done, total, pace)
      else:
        logging.info("step %d/%d | %s | %s", done, total,
                     progress.fmt_metrics(row), pace)
    if done % tr.eval_every == 0 or done == total:
      t_eval = time.time()
      row = progress.append_metrics(
          metrics_path, done, "eval",
          train_state.evaluate(state, config, eval_fn, make))
      if not compiling:
        compiling = time.time() - t_eval
      logging.info("eval step %d | %s", done, progress.fmt_metrics(row))
    checkpoint.save(manager, state, force=done == total)
  checkpoint.close(manager)
  return state
