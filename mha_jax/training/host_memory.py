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
its heap (no `mmap`) and never hand freed memory back to the system; the
next call then reuses the pages of the last one. Measured on the text
task's step above, in fresh processes on 2 loaded cores (2026-12-03):
82,500 faults and 680 ms a step with glibc's default, 128 faults and 450
ms with this, and 52 faults when it is made after a 2048^3 matmul has run
(so, unlike an earlier version of this function, its effect no longer
depends on being first). That earlier version also set one malloc arena
for all threads; on this jax that is not needed for XLA's scratch, and
the one arena's lock had made experiment 1's small run (`make run`)
slower (93-116 s against 85-91 s), so it is gone. The small steps of
experiment 1 fault 0-16 times a step either way. What it cannot keep: a
block over 64 MiB that a worker thread allocates (YNNPACK's temporaries
inside a large product) comes from that thread's own arena, which glibc
maps afresh whatever the settings; SmolLM2's EAP scores below still
fault 296,000 pages a call so (none with `MALLOC_ARENA_MAX=1` in the
environment, 18.1-19.5 s against 19.4-19.6; not set here, for the lock).

What it costs: the process keeps its peak heap until it exits. It is
process-wide, so no library function calls it, not even the training
loop (`train.train_and_evaluate`, which a user may call in a process of
their own): the commands do. `python -m experiments.train`, every
experiment command (`experiments.cli.main`, training or not) and the
benchmarks (the train-step and real-LM ones, unless
`--config.keep_freed_memory=False`; the EAP one only with
`--config.keep_freed_memory=True`; the SAE one always) call it, so the
documented commands get it by default. A script with its own loop, or
its own call of `train_and_evaluate`, calls it once:
`mha_jax.keep_freed_memory()` (SmolLM2-135M's loss and gradient at 512
tokens, fresh processes on 2 AMD EPYC cores: 3.50-3.53 s with glibc's
default, 2.87-2.93 s with this, the same peak memory; its EAP edge scores
on 64 IOI prompts, a 5.6 GB peak: 22.1-22.4 s and 1.4M page faults a call
with glibc's default, 19.4-19.6 s and 296,000 with this).
`MHA_JAX_KEEP_FREED_MEMORY=0` in the environment turns it off everywhere
(glibc's default, for an A/B).

Elsewhere it does nothing and says why: another allocator (tcmalloc or
jemalloc, preloaded with `LD_PRELOAD`, which reuse memory on their own),
a C library other than glibc, or not Linux.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import sys

# glibc's malloc.h parameter numbers.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
# Trim threshold -1: glibc never gives the heap's top back (mallopt(3)).
# The largest positive int, 2**31 - 1, still trimmed a freed top over 2 GiB:
# SmolLM2's EAP scores (a 5.6 GB peak) then faulted 1.4M pages a call.
_KEEP = -1
_PAD = 64 * 2 ** 20  # grow the heap 64 MiB at a time
_OTHER_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")
OFF_VARIABLE = "MHA_JAX_KEEP_FREED_MEMORY"  # "0": leave glibc as it is
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
  if os.environ.get(OFF_VARIABLE) == "0":
    _done = {"applied": False, "reason": f"{OFF_VARIABLE}=0 turns it off"}
  elif not sys.platform.startswith("linux"):
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
                  (M_TOP_PAD, _PAD))
      ok = all(mallopt(param, value) == 1 for param, value in settings)
      _done = {"applied": ok, "reason": "glibc mallopt" if ok else
               "glibc refused a mallopt setting"}
  return _done
