"""Loss curves of a training run, and the landmarks the experiments report.

`train.train_and_evaluate` appends one JSON row per logged step to
`<run_dir>/metrics.jsonl` (`{"step", "split", "loss", ...}`); `read` gives
one metric of one split back as two equal-length lists. The landmarks are
pure functions of such a curve: where the loss falls fastest (the induction
phase change), when a curve first gets below or above a threshold (how soon
a variant learns the task, when a head's score forms) and when it has
covered half of its change (a landmark without a threshold).

Over several seeds, "when the loss first gets below a threshold" is a time
to an event that some runs never reach before training ends (they are
censored at the last step). Averaging only the runs that got there, or a
mix of steps and "never", hides that, so `survival_curve` keeps every run:
at each evaluation step, the fraction of runs whose loss has not yet been
below the threshold. With one schedule and one length for every run, all
censoring happens at the same step and this is the plain empirical
fraction (the Kaplan-Meier estimate with a single censoring time).
`logrank_p` compares two groups with the log-rank test, which uses the
censored runs instead of dropping them. The figures (`plot_survival`,
`plot_first_steps`, `plot_seed_curves`) draw one line or dot per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import json
import pathlib

import matplotlib
import numpy as np
from scipy import stats as sp_stats

from mha_jax.measure import plots


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


def first_step(steps, hit):
  """The first of `steps` where `hit` (one bool per step) holds; None if
  it holds nowhere."""
  idx = np.flatnonzero(np.asarray(hit, bool))
  return int(np.asarray(steps)[idx[0]]) if idx.size else None


def first_below(steps, losses, threshold: float):
  """The first step whose loss is below `threshold`; None if none is."""
  return first_step(steps, np.asarray(losses, np.float64) < threshold)


def first_above(steps, values, threshold: float):
  """The first step whose value exceeds `threshold`; None if none does."""
  return first_step(steps, np.asarray(values, np.float64) > threshold)


def half_way_step(steps, values) -> int:
  """The first step by which `values` has covered half of its change from
  the first to the last value (a threshold-free landmark of a curve)."""
  v = np.asarray(values, np.float64)
  if v[-1] == v[0]:
    return int(steps[0])
  return first_step(steps, (v - v[0]) / (v[-1] - v[0]) >= 0.5)


def survival_curve(first_steps: Sequence[int | None],
                   steps: Sequence[int]) -> list[float]:
  """Fraction of runs not yet below the threshold at each of `steps`.

  `first_steps` holds each run's first step below the threshold, or None
  for a run that never got there. A run counts as "still above" at step s
  while its first step is later than s.
  """
  if not first_steps:
    raise ValueError("survival_curve: `first_steps` is empty")
  n = len(first_steps)
  return [sum(1 for f in first_steps if f is None or f > s) / n
          for s in steps]


def median_step(first_steps: Sequence[int | None]) -> int | float | None:
  """The step by which half of the runs were below the threshold.

  The smallest step at which the survival fraction is <= 0.5 (the
  Kaplan-Meier median with one censoring time); None when fewer than half
  of the runs reached the threshold (the median is then "after the end").
  """
  reached = sorted(f for f in first_steps if f is not None)
  need = int(np.ceil(len(first_steps) / 2))
  return reached[need - 1] if len(reached) >= need else None


def logrank_p(first_a: Sequence[int | None], first_b: Sequence[int | None],
              censor_at: int) -> float | None:
  """Two-sided log-rank p-value of "both groups drop at the same rate".

  Runs that never reached the threshold are right-censored at `censor_at`
  (the last step). None when no run of either group reached it (nothing to
  compare).
  """
  def data(first):
    return sp_stats.CensoredData(
        uncensored=[f for f in first if f is not None],
        right=[censor_at for f in first if f is None])
  if all(f is None for f in list(first_a) + list(first_b)):
    return None
  return float(sp_stats.logrank(data(first_a), data(first_b)).pvalue)


def plot_survival(fractions: Mapping[str, tuple[Sequence[int],
                                                Sequence[float]]],
                  *, threshold: float, title: str = "",
                  path: str | None = None):
  """Step plot of `fractions[label] = (steps, fraction still above)`
  (`survival_curve` per group of runs)."""
  fig, ax = plots.subplots(figsize=(5.4, 3.4))
  for i, (label, (steps, frac)) in enumerate(fractions.items()):
    # A small vertical offset per label keeps equal curves apart.
    ax.step([0] + list(steps), np.asarray([1.0] + list(frac)) + 0.008 * i,
            where="post", label=label, linewidth=1.4)
  ax.set_xlabel("step")
  ax.set_ylabel(f"fraction of seeds with loss >= {threshold:g}")
  ax.set_ylim(-0.05, 1.1)
  if title:
    ax.set_title(title, fontsize=10)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return plots.save(fig, path)


def plot_first_steps(first_steps: Mapping[str, Sequence[int | None]], *,
                     censor_at: int, title: str = "",
                     path: str | None = None):
  """One row per group, one dot per run at its first step below threshold.

  Runs that never got there are drawn as open triangles at `censor_at`.
  """
  labels = list(first_steps)
  fig, ax = plots.subplots(figsize=(5.4, 0.45 * len(labels) + 1.4))
  for row, label in enumerate(labels):
    vals = list(first_steps[label])
    jitter = np.linspace(-0.15, 0.15, len(vals)) if len(vals) > 1 else [0.0]
    for j, v in zip(jitter, vals):
      if v is None:
        ax.plot(censor_at, row + j, marker=">", markerfacecolor="none",
                color="tab:red", markersize=7)
      else:
        ax.plot(v, row + j, marker="o", color="tab:blue", markersize=5)
  ax.set_yticks(range(len(labels)))
  ax.set_yticklabels(labels, fontsize=8)
  ax.axvline(censor_at, color="grey", linewidth=0.8, linestyle=":")
  ax.set_xlabel(f"first eval step below threshold (open triangle: not "
                f"reached by step {censor_at})")
  if title:
    ax.set_title(title, fontsize=10)
  fig.tight_layout()
  return plots.save(fig, path)


def plot_seed_curves(groups: Mapping[str, Sequence[tuple[Sequence,
                                                         Sequence]]], *,
                     ylabel: str, title: str = "", logy: bool = False,
                     path: str | None = None):
  """`groups[setting] = [(steps, values) per seed]`: thin lines, one colour
  per setting, one legend entry per setting (the legend sits outside the
  axes). Returns the figure; writes a PNG to `path` when given."""
  fig, ax = plots.subplots(figsize=(6.4, 3.4))
  colours = matplotlib.colormaps["tab10"]
  for i, (label, runs) in enumerate(groups.items()):
    for j, (steps, values) in enumerate(runs):
      ax.plot(np.asarray(steps), np.asarray(values), color=colours(i % 10),
              linewidth=1.0, alpha=0.8,
              label=(f"{label} ({len(runs)} seed"
                     f"{'s' if len(runs) > 1 else ''})" if j == 0 else None))
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  if logy:
    ax.set_yscale("log")
  if title:
    ax.set_title(title, fontsize=10)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  fig.tight_layout()
  return plots.save(fig, path)
