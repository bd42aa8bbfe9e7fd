"""One run per workdir: a lock that a second run refuses and a crash frees.

Two training commands started on the same `--workdir` would both resume
from the same checkpoint and interleave their metric rows and checkpoint
deletions. `lock(workdir)` holds an exclusive `fcntl.flock` on
`workdir/.lock` for the run's lifetime; the kernel drops it when the
process ends, however it ends, so a crashed or killed run never leaves
the workdir stuck. The file records who holds it (host, pid, start time),
which the refusal quotes. `check_free` asks the same question before a
command prints or builds anything, so a refusal comes first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import socket
import time


class WorkdirInUse(RuntimeError):
  """Another process is training in this workdir."""


@contextlib.contextmanager
def lock(workdir):
  """Hold `workdir`'s run lock for the `with` block; raise `WorkdirInUse`
  naming the holder if another process has it."""
  path = pathlib.Path(workdir) / ".lock"
  path.parent.mkdir(parents=True, exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise WorkdirInUse(_in_use(workdir, path)) from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")
                             }).encode())
    yield
  finally:
    os.close(fd)  # releases the lock


def check_free(workdir) -> None:
  """Raise `WorkdirInUse` (as `lock` would) if another process holds
  `workdir`'s lock; create nothing. The answer can change at once: `lock`
  is still what guards the run."""
  path = pathlib.Path(workdir) / ".lock"
  try:
    fd = os.open(path, os.O_RDWR)
  except FileNotFoundError:  # no run was ever started there
    return
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    raise WorkdirInUse(_in_use(workdir, path)) from None
  finally:
    os.close(fd)  # releases it, if this process took it


def _in_use(workdir, path: pathlib.Path) -> str:
  return (f"workdir {workdir} is in use by {_holder(path)}; wait for that "
          "run to finish (or stop it) before resuming here, or give "
          "another --workdir")


def _holder(path: pathlib.Path) -> str:
  """`process <pid> on <host> (started <time>)`, as far as the file says."""
  try:
    h = json.loads(path.read_text())
    return f"process {h['pid']} on {h['host']} (started {h['started']})"
  except (OSError, ValueError, KeyError):
    return "another process"
