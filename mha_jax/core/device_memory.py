"""How much memory the devices a computation may run on have, and a refusal
for the dense attention paths when their scores alone cannot fit.

XLA asks for a dense path's `[B, H, Tq, Tk]` scores whatever their size
(`implementation="xla"` at B=1, H=8, n=32768 asked a GPU for 80 GiB), and
the failure comes late, from the allocator, far from the call that caused
it. The check here refuses at trace time, naming the size, and only when
the refusal is certain: the need is a lower bound (one float32 copy of
the scores, where the paths hold two or more) and the capacity an upper
bound (every device of the backend together; the host's physical memory
for CPU devices, which share it).
"""

from __future__ import annotations

import functools
import os

import jax


@functools.lru_cache(maxsize=None)
def capacity(backend: str | None = None) -> tuple[int, str] | None:
  """`(bytes, what)`: the memory of all of `backend`'s devices together
  (default backend: None), or None where it cannot be read. A hardware
  fact, read once per process."""
  devices = jax.devices(backend)
  if devices[0].platform == "cpu":
    try:
      n = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
      return None
    return n, "the host's physical memory"
  limits = []
  for d in devices:
    try:
      stats = d.memory_stats() or {}
    except Exception:  # pylint: disable=broad-except  # backend-specific
      stats = {}
    if "bytes_limit" not in stats:
      return None
    limits.append(stats["bytes_limit"])
  kind = getattr(devices[0], "device_kind", devices[0].platform)
  return sum(limits), f"{len(devices)} x {kind}"


def gib(n: float) -> str:
  return f"{n / 2 ** 30:.1f} GiB"


def check_dense_scores(implementation: str, shape, itemsize: int,
                       fn: str) -> None:
  """Raise a ValueError naming the size when `shape`'s scores at
  `itemsize` bytes alone exceed the devices' memory (module docstring)."""
  have = capacity()
  need = itemsize
  for s in shape:
    need *= int(s)
  if have is None or need <= have[0]:
    return
  dims = " x ".join(str(int(s)) for s in shape)
  raise ValueError(
      f"{fn}: implementation={implementation!r} forms the scores [B, H, Tq, "
      f"Tk] = [{dims}] ({gib(need)} at {itemsize} bytes each, before "
      f"anything else), more than {have[1]} holds ({gib(have[0])}); use "
      "implementation='flash' or 'auto', which never form them")
