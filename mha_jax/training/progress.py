"""The training loop's console lines and metric rows.

A console line right after the first step (its seconds, mostly
compiling), then one every `train.log_every` steps with the metrics and
at least one every `QUIET_S` seconds; the steps per second and the ETA
count only the steps after the first, less the first evaluation's
compile, so that compilation does not inflate the estimate. Metric rows
go to `metrics.jsonl`, one JSON object per line.
"""

from __future__ import annotations

import json
import pathlib

import jax


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# The longest a run goes without a console line after its first step: a
# line comes every `log_every` steps, or sooner when those take longer.
QUIET_S = 10.0


def pace(done: int, total: int, first: int, seconds: float):
  """`(steps per second, seconds left)` when `seconds` of wall time were
  spent on steps `first + 1 .. done`, i.e. after step `first`, the one
  that compiled (timing it would put compilation into the estimate);
  `(None, None)` while no step after it has run."""
  if done <= first or seconds <= 0:
    return None, None
  rate = (done - first) / seconds
  return rate, (total - done) / rate


def fmt_pace(done, total, first, seconds) -> str:
  rate, left = pace(done, total, first, seconds)
  if rate is None:
    return "ETA after the next step"
  return f"{rate:.1f} steps/s | ETA {_fmt_time(left)}"


def fmt_metrics(row) -> str:
  return " | ".join(f"{k} {v:.4f}" for k, v in row.items()
                    if k not in ("step", "split"))


def append_metrics(path: pathlib.Path, step: int, split: str, metrics):
  row = {"step": step, "split": split}
  row.update({k: float(v) for k, v in jax.device_get(metrics).items()})
  if jax.process_index() == 0:  # many hosts share one workdir: one writer
    with path.open("a") as f:
      f.write(json.dumps(row) + "\n")
  return row
