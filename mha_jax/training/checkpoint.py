"""Orbax checkpoints of a `TrainState` in `workdir/checkpoints/<step>/`.

Only the pytree part is stored (step, params, optimizer state, dropout
key); the model's graph and the optimizer are rebuilt from the config, and
the saved arrays are restored into that fresh state's structure. Saving is
synchronous: the train step donates the state's buffers, which an
asynchronous save could still be reading.
"""

from __future__ import annotations

import contextlib
import json
import pathlib

import jax
import orbax.checkpoint as ocp
from absl import logging


@contextlib.contextmanager
def quiet():
  """Hide orbax's many INFO lines so the progress lines stay readable."""
  old = logging.get_verbosity()
  logging.set_verbosity(logging.WARNING)
  try:
    yield
  finally:
    logging.set_verbosity(old)


def make_manager(workdir, every: int, keep: int) -> ocp.CheckpointManager:
  """A manager saving every `every` steps and keeping the last `keep`."""
  options = ocp.CheckpointManagerOptions(
      save_interval_steps=every, max_to_keep=keep, create=True,
      enable_async_checkpointing=False)
  path = pathlib.Path(workdir).absolute() / "checkpoints"
  with quiet():
    return ocp.CheckpointManager(path, options=options)


def _tree(state):
  return {"step": state.step, "params": state.params,
          "opt_state": state.opt_state, "rng": state.rng}


def save(manager, state, *, force: bool = False) -> bool:
  """Save if the manager's interval says so (or `force`)."""
  with quiet():
    return manager.save(int(state.step), args=ocp.args.StandardSave(
        _tree(state)), force=force)


def restore(manager, state, step: int):
  """`state` with the arrays of checkpoint `step` (same structure)."""
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(state))
  with quiet():
    got = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  return state.replace(**got)


def restore_latest(manager, state):
  """`state` from the newest checkpoint, or unchanged if there is none."""
  step = manager.latest_step()
  return state if step is None else restore(manager, state, step)


def close(manager) -> None:
  with quiet():
    manager.wait_until_finished()
    manager.close()


def truncate_metrics(path: pathlib.Path, step: int) -> None:
  """Drop metric rows after `step`: a resumed run writes them again."""
  if not path.exists():
    return
  rows = [line for line in path.read_text().splitlines()
          if line and json.loads(line)["step"] <= step]
  path.write_text("".join(r + "\n" for r in rows))
