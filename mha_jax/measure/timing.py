"""Wall-clock timing and log-log slopes for the measuring experiments."""

from __future__ import annotations

import time

import jax
import numpy as np


def wall_times(fn, args, *, warmup: int, repeats: int, feed_back=None):
  """Wall seconds of `repeats` calls of `fn(*args)` after `warmup` calls.

  Each call is ended by `jax.block_until_ready`, so the time covers the
  computation, not just its dispatch. `feed_back(args, out)` gives the next
  call's args (for example a donated cache). Returns `(times, last_output)`.
  """
  times = []
  out = None
  for i in range(warmup + repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    if i >= warmup:
      times.append(time.perf_counter() - start)
    if feed_back is not None:
      args = feed_back(args, out)
  return times, out


def median_time(fn, args, *, warmup: int, repeats: int, feed_back=None):
  """`((median, min) wall seconds, last output)` of `wall_times`.

  The minimum is kept next to the median because on a shared machine the
  noise only ever adds time.
  """
  times, out = wall_times(fn, args, warmup=warmup, repeats=repeats,
                          feed_back=feed_back)
  return (float(np.median(times)), float(np.min(times))), out


def loglog_slope(xs, ys) -> float:
  """Least-squares slope of log(y) against log(x); NaN below two points."""
  if len(xs) < 2:
    return float("nan")
  return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])
