"""Keep freed host memory for reuse: XLA's CPU programs stop page-faulting.

On CPU, XLA allocates each call's scratch (all temporaries of one
compiled program, about 250 MB for a training step of the text task at
L4 H8 D256 B16) with `malloc` and frees it when the call returns. glibc
serves any block over 32 MB with a fresh `mmap` and gives it back with
`munmap`, so every call touches new pages: 63,000 minor page faults per
step there, 158-178 ms of kernel time per step across the two cores, and
the kernel zeroes each page before XLA writes it (docs/performance.md,
"The training step"). PyTorch's eager ops allocate blocks small enough
for glibc's free lists and do not pay this.

`keep_freed_memory()` tells glibc (`mallopt`) to serve every block from
its heap and never hand freed memory back to the system, with one arena
for all threads (a worker thread's arena cannot hold such a block; without
the one arena the faults stayed, 90,000 a step). The next call then
reuses the pages of the last one: 0 faults a step when it is called
before any JAX computation, and that step about a quarter faster. Its
effect depends on what ran before it: with a 2048^3 matmul run between it
and the step the step faulted 34,000 times, and called after that matmul
90,000 times, as without it (docs/performance.md); preloading tcmalloc
does not depend on order. What it costs: the process keeps its peak footprint until it
exits, and with one arena the threads share one lock, which made
experiment 1's small run (`make run`) slower, 93-116 s against 85-91 s.
So it is opt-in and process-wide: the library never calls it on import
and the experiments do not; a script or notebook whose compiled step
needs more than 32 MB of scratch (`compiled.memory_analysis()`) calls it
once before JAX runs anything, and the benchmark does with
`--config.keep_freed_memory=True`.

Elsewhere it does nothing and says why: another allocator (tcmalloc or
jemalloc, preloaded with `LD_PRELOAD`, which reuse memory on their own),
a C library other than glibc, or not Linux.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import pathlib
import sys

# glibc's malloc.h parameter numbers.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -4, -8
_KEEP = 2 ** 31 - 1  # trim threshold: never give the heap's top back
_PAD = 64 * 2 ** 20  # grow the heap 64 MiB at a time
_OTHER_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")
_done: dict | None = None


def _loaded_allocator() -> str | None:
  """The name of a preloaded malloc replacement in this process, if any."""
  try:
    maps = pathlib.Path("/proc/self/maps").read_text()
  except OSError:
    return None
  return next((name for name in _OTHER_ALLOCATORS if name in maps), None)


def keep_freed_memory() -> dict:
  """Make glibc keep freed memory for reuse (see the module docstring).

  Returns `{"applied": bool, "reason": str}`; calling it again returns the
  first answer. Never raises: a machine where it does not apply keeps
  its allocator as it is.
  """
  global _done
  if _done is not None:
    return _done
  if not sys.platform.startswith("linux"):
    _done = {"applied": False, "reason": f"not Linux ({sys.platform})"}
  elif other := _loaded_allocator():
    _done = {"applied": False,
             "reason": f"{other} is the allocator here; it reuses memory"}
  else:
    try:
      libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
      mallopt = libc.mallopt
    except (OSError, AttributeError):
      _done = {"applied": False, "reason": "no glibc mallopt"}
    else:
      settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, _KEEP),
                  (M_TOP_PAD, _PAD), (M_ARENA_MAX, 1))
      ok = all(mallopt(param, value) == 1 for param, value in settings)
      _done = {"applied": ok, "reason": "glibc mallopt" if ok else
               "glibc refused a mallopt setting"}
  return _done
