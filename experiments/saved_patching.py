"""The per-head patching numbers of a circuits run, as explorer columns.

`experiments.circuits` measures each head's activation and attribution
patching (`runs[<run name>]["heads"]` of its results.json) and shows
them as columns of its explorer page's head table; `experiments.explore`
shows the same columns for any run folder that has them. So the layout
has two users and lives beside both, read where it is written:
`patching_columns` turns one run's measured result into those columns,
`beside(run_dir, ...)` reads them back for a run folder.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np


def patching_columns(result, num_layers: int, num_heads: int
                     ) -> dict[str, np.ndarray]:
  """{"<direction> <method> patching": `[L, H]`} of a run's measured
  `result` (its "heads" entry); only the arrays of that shape."""
  get = lambda d, k: d.get(k) if isinstance(d, dict) else None
  cols = {}
  for direction in ("denoise", "noise"):
    for method in ("activation", "attribution"):
      heads = get(get(result, "heads"), direction)
      values = get(heads, method)
      arr = np.asarray([] if values is None else values, float)
      if arr.shape == (num_layers, num_heads):
        cols[f"{direction} {method} patching"] = arr
  return cols


def beside(run_dir, num_layers: int, num_heads: int):
  """`{"source": file, "columns": patching_columns(...)}` for a run of
  this experiment, or None.

  Looks in `run_dir/circuits/results.json` and then in the results.json
  beside the run (`runs[<run name>]`); None when there is no such file,
  it is another experiment's (other layouts: a list of runs, no "heads"),
  or its arrays are not `[num_layers, num_heads]`.
  """
  run_dir = pathlib.Path(run_dir)
  for path, name in ((run_dir / "circuits" / "results.json", None),
                     (run_dir.parent / "results.json", run_dir.name)):
    if not path.is_file():
      continue
    res = json.loads(path.read_text())
    if name is not None:
      runs = res.get("runs") if isinstance(res, dict) else None
      res = runs.get(name) if isinstance(runs, dict) else None
    cols = patching_columns(res, num_layers, num_heads)
    if cols:
      return {"source": str(path), "columns": cols}
  return None
