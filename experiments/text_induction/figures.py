"""Induction on real text, figures: the bump plot and the trajectories.

Each function draws one PNG from what `run.measure` returned (per run,
its checkpoint trajectories and landmarks). Shape letters: S checkpoints,
L layers, H heads.
"""

from __future__ import annotations

import matplotlib
import numpy as np

from mha_jax.measure import plots
from mha_jax.measure import report as report_lib


def _log_bins(length: int, bins: int = 24):
  """`[(start, end), ...]` positions 0..length-1 in about `bins` groups of
  equal width on a log axis (the first ones a single position each)."""
  edges = np.unique(np.round(np.logspace(0, np.log10(length + 1), bins + 1))
                    .astype(int) - 1)
  return list(zip(edges[:-1], edges[1:]))


def bump(runs, kind, seeds, e, path):
  """Loss against position (log x) at `e.bump_steps` checkpoints, one
  panel per seed: Olsson et al.'s "bump" plot. Each point is the mean
  over a group of positions of equal width on the log axis, drawn at the
  group's centre: one position is too noisy on these windows."""
  fig, axes = plots.subplots(1, len(seeds), figsize=(4.6 * len(seeds), 3.4),
                             squeeze=False)
  for ax, seed in zip(axes[0], seeds):
    tr = runs[f"{kind}_seed{seed}"]["traj"]
    steps = tr["steps"]
    bins = _log_bins(len(tr["loss_by_position"][0]))
    centre = [np.sqrt((a + 1) * b) for a, b in bins]  # 1-based positions
    pick = sorted(set(np.linspace(0, len(steps) - 1, e.bump_steps)
                      .round().astype(int).tolist()))
    for i in pick:
      loss = np.asarray(tr["loss_by_position"][i])
      ax.plot(centre, [loss[a:b].mean() for a, b in bins], marker=".",
              label=f"step {steps[i]}", color=_shade(i, len(steps)))
    for lo, hi in (e.early_positions, e.late_positions):
      ax.axvspan(lo + 1, hi, color="grey", alpha=0.15)
    ax.set_xscale("log")
    ax.set_title(f"{kind}, seed {seed}", fontsize=9)
    ax.set_xlabel("position in the window (token)")
    ax.set_ylabel("held-out loss (nats per token)")
    ax.legend(fontsize=6)
  plots.save(fig, path)


def _shade(i, n):
  """A colour from light to dark along the checkpoints."""
  return matplotlib.colormaps["viridis"](0.9 * (1 - i / max(n - 1, 1)))


def trajectories(runs, kind, seeds, e, path):
  """Per seed, on one time axis: the best prefix-matching score of each
  layer, the copying score of the head that matches best at the end, and
  the ICL score (right axis), with the two landmarks marked."""
  fig, axes = plots.subplots(1, len(seeds), figsize=(5.2 * len(seeds), 3.4),
                             squeeze=False)
  fig.subplots_adjust(wspace=0.6)
  for ax, seed in zip(axes[0], seeds):
    r = runs[f"{kind}_seed{seed}"]
    tr, marks = r["traj"], r["landmarks"]
    steps = tr["steps"]
    pm = np.asarray(tr["prefix_matching"])  # [S, L, H]
    for l in range(pm.shape[1]):
      ax.plot(steps, pm[:, l].max(-1), label=f"prefix matching, layer {l}")
    l, h = np.unravel_index(np.argmax(pm[-1]), pm[-1].shape)
    ax.plot(steps, np.asarray(tr["copying"])[:, l, h], ":",
            label=f"copying, {report_lib.head_name(l, h)}")
    ax.axhline(e.threshold, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    right = ax.twinx()
    right.plot(steps, tr["icl"], color="black", label="ICL score")
    right.set_ylabel("ICL score (nats, late - early)")
    for step, style in ((marks["formation_step"], "-"),
                        (marks["icl_step"], "-.")):
      if step is not None:
        ax.axvline(step, color="tab:red", linewidth=0.8, linestyle=style)
    ax.set_title(f"{kind}, seed {seed}", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    right.legend(fontsize=6, loc="lower left")
  plots.save(fig, path)
