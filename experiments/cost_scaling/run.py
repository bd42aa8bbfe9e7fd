"""The source's cost claims, measuring: both sweeps and their slopes.

What is measured, and how, is `experiments.cost_scaling.scaling`'s
docstring; `measure` runs the sweep against the head count and against the
length and fits the log-log slopes over the `fit_points` largest n.
"""

from __future__ import annotations

import pathlib
import time

from experiments.cost_scaling import scaling


def measure(config, workdir) -> dict:
  """{"heads": points, "length": points, "slopes": {path: {"time",
  "memory"}}, "took_s": seconds the sweeps took (for the report only; not
  in results.json)}."""
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  start = time.time()
  heads_pts, n_pts = scaling.sweep(config)
  return {"heads": heads_pts, "length": n_pts,
          "slopes": scaling.length_slopes(n_pts, config.fit_points),
          "took_s": time.time() - start}
