"""The source's cost claims, measuring: both sweeps and their slopes.

What is measured, and how, is `experiments.cost_scaling.scaling`'s
docstring; `measure` runs the sweep against the head count and against the
length, fits the log-log slopes over the `fit_points` largest n and sums
up how each path's cost moves with h, so results.json holds every number
the report shows.
"""

from __future__ import annotations

import pathlib
import time

import jax

from experiments.cost_scaling import scaling


def measure(config, workdir) -> dict:
  """{"heads": points, "length": points, "slopes": {path: {"time",
  "memory", "xla_flops"}} (`scaling.length_slopes`), "head_effects": {path:
  ...} (`scaling.head_effects`), "took_s": seconds the sweeps took, "jax"
  and "backend": what they ran on}."""
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  start = time.time()
  heads_pts, n_pts = scaling.sweep(config)
  return {"heads": heads_pts, "length": n_pts,
          "slopes": scaling.length_slopes(n_pts, config.fit_points),
          "head_effects": scaling.head_effects(heads_pts),
          "took_s": time.time() - start, "jax": jax.__version__,
          "backend": jax.default_backend()}
