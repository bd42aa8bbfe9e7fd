"""Report plumbing of the experiment entry points (not library code).

Each entry point defines its flags at module level, computes its results
through the library (`mha_jax.measure.runs` trains the seeds, the analysis modules
measure) and then writes them with the helpers here: number formats,
Markdown tables and the report.md / results.json pair. Only entry points
write reports, so this stays beside them.
"""

from __future__ import annotations

import json
import pathlib

from absl import app
import jax
import numpy as np

from mha_jax.measure import stats


# Mean and sample std (ddof = 1; None for one seed) over seeds.
mean_std = stats.mean_std


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
  """`0.123 ± 0.004` (mean ± sample std), or `0.123` without a std."""
  if std is None:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def md_table(headers, rows) -> str:
  """A Markdown table; cells are written with `str`."""
  lines = ["| " + " | ".join(str(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _to_json(x, drop):
  """`x` with arrays as lists and every dict key in `drop` left out."""
  if isinstance(x, dict):
    return {str(k): _to_json(v, drop) for k, v in x.items() if k not in drop}
  if isinstance(x, (list, tuple)):
    return [_to_json(v, drop) for v in x]
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  if isinstance(x, (np.floating, np.integer, np.bool_)):
    return x.item()
  return x


def write_outputs(workdir, results: dict, report: str, drop=()) -> dict:
  """Write results.json (every number) and report.md into `workdir`.

  Keys named in `drop` are left out of results.json at any depth (the
  per-example arrays kept only for figures). Returns what was written.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  written = _to_json(results, frozenset(drop))
  (workdir / "results.json").write_text(json.dumps(written, indent=1) + "\n")
  (workdir / "report.md").write_text(report.rstrip() + "\n")
  return written


def check_no_arguments(argv) -> None:
  """Entry points take flags only; refuse stray positional arguments."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
