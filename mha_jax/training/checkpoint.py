"""Orbax checkpoints of a `TrainState` (or a dict state with a "step", as
the SAE trainer keeps) in `workdir/checkpoints/<step>/`.

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
  """What is stored: a `TrainState`'s pytree part, or a plain dict state
  (with a "step") as it is."""
  if isinstance(state, dict):
    return state
  return {"step": state.step, "params": state.params,
          "opt_state": state.opt_state, "rng": state.rng}


def save(manager, state, *, force: bool = False) -> bool:
  """Save if the manager's interval says so (or `force`)."""
  tree = _tree(state)
  with quiet():
    return manager.save(int(tree["step"]), args=ocp.args.StandardSave(tree),
                        force=force)


def restore(manager, state, step: int):
  """`state` with the arrays of checkpoint `step` (same structure)."""
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(state))
  with quiet():
    got = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  return got if isinstance(state, dict) else state.replace(**got)


def restore_latest(manager, state):
  """`state` from the newest checkpoint that restores, or unchanged if
  there is none.

  A checkpoint that does not restore (files truncated by a disk fault or
  an interrupted copy) is skipped with a warning naming it and the error.
  Once an older one restores, each skipped one is moved aside to
  `checkpoints/<step>.unreadable` (kept, never deleted), so the resumed
  run can save that step again. When checkpoints exist but none restores,
  RuntimeError names each and why, and nothing is moved.
  """
  failed = []
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      restored = restore(manager, state, step)
    except Exception as e:  # pylint: disable=broad-exception-caught
      # Orbax and tensorstore raise many types on damaged files; any
      # failure to read a step is a reason to try the one before it.
      logging.warning("Checkpoint %d in %s does not restore (%s: %s); "
                      "trying the one before it", step, manager.directory,
                      type(e).__name__, _first_line(e))
      failed.append((step, e))
      continue
    for bad, _ in failed:
      _move_aside(manager, bad)
    if failed:
      logging.warning("Resumed from checkpoint %d; the unreadable ones (%s) "
                      "are kept as <step>.unreadable in %s", step,
                      ", ".join(str(s) for s, _ in failed), manager.directory)
      with quiet():
        manager.reload()
    return restored
  if failed:
    reasons = "; ".join(f"step {s}: {type(e).__name__}: {_first_line(e)}"
                        for s, e in failed)
    raise RuntimeError(f"no checkpoint in {manager.directory} restores "
                       f"({reasons})")
  return state


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [""])[0][:300]


def _move_aside(manager, step: int) -> None:
  """Rename checkpoint `step`'s folder to `<step>.unreadable` (or
  `<step>.unreadable.<n>` if that exists already)."""
  folder = pathlib.Path(manager.directory) / str(step)
  target = folder.with_name(f"{step}.unreadable")
  n = 1
  while target.exists():
    target = folder.with_name(f"{step}.unreadable.{n}")
    n += 1
  folder.rename(target)


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
