"""Wall-clock timing, XLA compile counts and log-log slopes for the
measuring experiments."""

from __future__ import annotations

import contextlib
import statistics
import time

import jax
import numpy as np


COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compiles():
  """Yields a list that gets one entry per XLA compile inside the block.

  XLA records each backend compile as a `jax.monitoring` duration event,
  so every program compiled inside the block counts: jitted ones and the
  small ones eager `jnp` calls compile for each new shape."""
  seen = []

  def listener(event, secs, **kwargs):
    del secs, kwargs
    if event == COMPILE_EVENT:
      seen.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield seen
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def wall_times(fn, args, *, warmup: int, repeats: int, feed_back=None,
               slow_s: float | None = None):
  """Wall seconds of `repeats` calls of `fn(*args)` after `warmup` calls.

  Each call is ended by `jax.block_until_ready` (which passes non-JAX
  outputs, e.g. torch tensors, through), so the time covers the
  computation, not just its dispatch. `feed_back(args, out)` gives the next
  call's args (for example a donated cache). With `slow_s`, a first timed
  call longer than that is the only one (a case too slow to repeat).
  Returns `(times, last_output)`.
  """
  times = []
  out = None
  for i in range(warmup + repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    if i >= warmup:
      times.append(time.perf_counter() - start)
      if slow_s is not None and times[0] > slow_s:
        break
    if feed_back is not None:
      args = feed_back(args, out)
  return times, out


def rotated(names: list, r: int) -> list:
  """`names` rotated left by `r`: the order of round `r` of interleaved
  timing, so that a change of a shared machine's load falls on every
  call alike."""
  shift = r % len(names)
  return names[shift:] + names[:shift]


def interleaved_times(calls: dict, rounds: int, *, setups=None,
                      repeat=None, on_round=None) -> dict:
  """`{name: [wall seconds per round]}` of `calls` (`{name: fn()}`, each
  compiled and warm): one timing of each per round, every call ended by
  `block_until_ready`, the order rotating by one each round (`rotated`).

  Args:
    calls: `{name: fn()}`.
    rounds: how many rounds.
    setups: `{name: setup()}`, run untimed before each timing of that
      name (torch's thread count; a step that lets another library's
      worker threads settle).
    repeat: `{name: n}`: a timing is n consecutive calls, kept as seconds
      per call (short calls, timed in blocks so the clock's own cost is
      small); default 1.
    on_round: `on_round(r)` as round r starts (e.g. to read the load).
  """
  names, times = list(calls), {name: [] for name in calls}
  setups, repeat = setups or {}, repeat or {}
  for r in range(rounds):
    if on_round is not None:
      on_round(r)
    for name in rotated(names, r):
      if name in setups:
        setups[name]()
      count = repeat.get(name, 1)
      start = time.perf_counter()
      for _ in range(count):
        jax.block_until_ready(calls[name]())
      times[name].append((time.perf_counter() - start) / count)
  return times


def spread(values) -> dict:
  """`{"median", "min", "max"}` of per-round values (times, or ratios
  taken within each round), as every benchmark reports them."""
  values = [float(v) for v in values]
  if not values:
    raise ValueError("spread: expected at least one value, got none")
  return {"median": statistics.median(values), "min": min(values),
          "max": max(values)}


def timed_call(setup, fn):
  """`(wall seconds, output)` of one `fn()` after an untimed `setup()`
  (e.g. setting torch's thread count), ended by `block_until_ready`
  (which passes non-JAX outputs, e.g. torch tensors, through)."""
  setup()
  (seconds,), out = wall_times(fn, (), warmup=0, repeats=1)
  return seconds, out


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
