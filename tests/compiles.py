"""Counting XLA compiles, for tests that pin when a call may compile.

XLA records each backend compile as a `jax.monitoring` duration event, so
every program compiled inside the block counts: jitted ones and the small
ones eager `jnp` calls compile for each new shape.
"""

import contextlib

import jax

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compiles():
  """Yields a list that gets one entry per XLA compile inside the block."""
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
