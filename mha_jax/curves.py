"""Loss curves of a training run, and the landmarks the experiments report.

`train.train_and_evaluate` appends one JSON row per logged step to
`<run_dir>/metrics.jsonl` (`{"step", "split", "loss", ...}`); `read` gives
one metric of one split back as two equal-length lists. The landmarks are
pure functions of such a curve: where the loss falls fastest (the induction
phase change) and when it first gets below a threshold (how soon a variant
learns the task).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np


def read(run_dir, split: str = "eval", key: str = "loss"):
  """`(steps, values)` of metric `key` on `split` ("train" or "eval")."""
  rows = [json.loads(line) for line in
          (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if r["split"] == split and key in r]
  return [r["step"] for r in rows], [r[key] for r in rows]


def phase_change(steps, losses) -> dict:
  """The interval between two evaluations with the steepest loss drop.

  Returns `{"from_step", "to_step", "loss_before", "loss_after", "drop"}`.
  Needs at least two points: a drop is a difference of neighbours.
  """
  if len(steps) != len(losses) or len(steps) < 2:
    raise ValueError(f"phase_change: needs >= 2 (step, loss) points of equal "
                     f"count, got {len(steps)} steps and {len(losses)} losses")
  drops = -np.diff(np.asarray(losses))
  i = int(np.argmax(drops))
  return {"from_step": steps[i], "to_step": steps[i + 1],
          "loss_before": losses[i], "loss_after": losses[i + 1],
          "drop": float(drops[i])}


def first_below(steps, losses, threshold: float):
  """The first step whose loss is below `threshold`; None if none is."""
  for s, v in zip(steps, losses):
    if v < threshold:
      return s
  return None
