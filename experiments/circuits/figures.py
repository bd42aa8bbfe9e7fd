"""Figures of experiment 6 (the induction circuit), one row per seed.

Shape letters: S seeds, L layers, H heads, T length, N checkpoints.

Inputs are the per-seed dicts of `survey.survey` (NumPy), keyed by
a row label; every function writes one PNG through `plots.save` and
returns the figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np

from mha_jax.measure import plots
from mha_jax.measure import report as report_lib


def _heatmap(ax, values, *, vmin, vmax, cmap, xlabels, ylabels, title,
             annotate=True):
  values = np.asarray(values, np.float32)
  ax.imshow(values, vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto",
            interpolation="nearest")
  ax.set_xticks(range(values.shape[1]))
  ax.set_xticklabels(xlabels, fontsize=7)
  ax.set_yticks(range(values.shape[0]))
  ax.set_yticklabels(ylabels, fontsize=7)
  ax.set_title(title, fontsize=8)
  if annotate:  # 7 pt: the smallest type that reads at the PNGs' 80 dpi
    for (i, j), v in np.ndenumerate(values):
      ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)


def _grid(n_rows, n_cols, cell=(3.0, 2.4)):
  fig, axes = plots.subplots(n_rows, n_cols, squeeze=False,
                           figsize=(cell[0] * n_cols, cell[1] * n_rows + 0.5))
  return fig, axes


def _heads(layer, n):
  return [report_lib.head_name(layer, h) for h in range(n)]


def composition(runs: Mapping[str, dict], baseline: Mapping[str, tuple], *,
                path: str):
  """Q, K, V composition `[Hs, Hr]` per seed, baseline in the titles."""
  fig, axes = _grid(len(runs), 3)
  vmax = max(float(np.max(r["composition"][k])) for r in runs.values()
             for k in "qkv")
  for row, (label, r) in enumerate(runs.items()):
    for col, kind in enumerate("qkv"):
      m, s = baseline[kind]
      vals = r["composition"][kind]
      _heatmap(axes[row, col], vals, vmin=0.0, vmax=vmax, cmap="viridis",
               xlabels=_heads(1, vals.shape[1]),
               ylabels=_heads(0, vals.shape[0]),
               title=f"{label}: {kind.upper()}-composition\n(random "
               f"{m:.3f} ± {s:.3f})")
  fig.suptitle("Composition: layer-0 head (rows) into layer-1 head "
               "(columns)", fontsize=9)
  fig.tight_layout()
  return plots.save(fig, path)


def path_patching(runs: Mapping[str, dict], *, path: str):
  """Noising and denoising path scores per input, `[Hs, Hr + all]`."""
  fig, axes = _grid(len(runs), 6)
  for row, (label, r) in enumerate(runs.items()):
    for d, direction in enumerate(("noise", "denoise")):
      grid = r["heads"][direction]["path"]
      for i, kind in enumerate("qkv"):
        vals = np.concatenate([grid[kind], grid[f"{kind}_all"][:, None]], 1)
        _heatmap(axes[row, 3 * d + i], vals, vmin=-1.0, vmax=1.0,
                 cmap="RdBu_r",
                 xlabels=_heads(1, vals.shape[1] - 1) + ["all"],
                 ylabels=_heads(0, vals.shape[0]),
                 title=f"{label}: {direction} via {kind}")
  fig.suptitle("Path patching: layer-0 head (rows) -> one input of layer-1 "
               "heads (columns); 1 = the whole clean-minus-corrupted "
               "log-prob", fontsize=9)
  fig.tight_layout()
  return plots.save(fig, path)


def head_patching(runs: Mapping[str, dict], *, path: str):
  """Activation vs attribution patching per head, both directions."""
  fig, axes = _grid(len(runs), 2, cell=(4.2, 2.0))
  for row, (label, r) in enumerate(runs.items()):
    for col, direction in enumerate(("denoise", "noise")):
      h = r["heads"][direction]
      act, attr = h["activation"].ravel(), h["attribution"].ravel()
      n_l, n_h = h["activation"].shape
      names = [report_lib.head_name(l, i) for l in range(n_l)
               for i in range(n_h)]
      x = np.arange(len(names))
      ax = axes[row, col]
      ax.bar(x - 0.2, act, 0.4, label="activation patching")
      ax.bar(x + 0.2, attr, 0.4, label="attribution (1st order)")
      ax.axhline(0.0, color="k", linewidth=0.5)
      ax.set_xticks(x)
      ax.set_xticklabels(names, fontsize=7)
      ax.set_title(f"{label}: {direction} one head's z", fontsize=8)
      if row == 0 and col == 0:
        ax.legend(fontsize=7)
  fig.tight_layout()
  return plots.save(fig, path)


def position_patching(runs: Mapping[str, dict], layout: Sequence[int], *,
                      path: str):
  """Per position: resid_pre of each layer and each head's z (rows) x
  query position (columns); activation and attribution, both ways."""
  segment, first, second = layout
  fig, axes = _grid(len(runs), 4, cell=(3.4, 2.4))
  for row, (label, r) in enumerate(runs.items()):
    for col, (direction, kind) in enumerate(
        (("denoise", "activation"), ("denoise", "attribution"),
         ("noise", "activation"), ("noise", "attribution"))):
      p = r["positions"][direction][kind]
      n_l, n_h, _ = p["z"].shape
      vals = np.concatenate([p["resid_pre"], p["z"].reshape(n_l * n_h, -1)])
      ylabels = ([f"resid L{l}" for l in range(n_l)]
                 + [f"{report_lib.head_name(l, h)} z" for l in range(n_l)
                    for h in range(n_h)])
      ax = axes[row, col]
      _heatmap(ax, vals, vmin=-0.5, vmax=0.5, cmap="RdBu_r",
               xlabels=[str(t) if t % 4 == 0 else ""
                        for t in range(vals.shape[1])],
               ylabels=ylabels, title=f"{label}: {direction}, {kind}",
               annotate=False)
      for x in (first, second):
        for edge in (x - 0.5, x + segment - 0.5):
          ax.axvline(edge, color="k", linewidth=0.6, linestyle="--")
  fig.suptitle(f"Patching one position (columns: query position; dashed: "
               f"the first copy at {first} and the second at {second}, "
               f"{segment} tokens; red = moves the metric, scale ±0.5)",
               fontsize=9)
  fig.tight_layout()
  return plots.save(fig, path)


def copying_and_dla(runs: Mapping[str, dict], baseline: tuple, *,
                    path: str):
  """Copying score and direct logit attribution per head, per seed."""
  fig, axes = _grid(2, len(runs), cell=(3.0, 2.2))
  m, s = baseline
  for col, (label, r) in enumerate(runs.items()):
    for row, (vals, title) in enumerate(
        ((r["copying"]["copying"], "copying score"),
         (r["dla"]["heads"], "direct logit attribution"))):
      n_l, n_h = vals.shape
      names = [report_lib.head_name(l, i) for l in range(n_l)
               for i in range(n_h)]
      ax = axes[row, col]
      ax.bar(range(len(names)), vals.ravel(),
             color=["tab:blue"] * n_h + ["tab:red"] * (n_l - 1) * n_h)
      if row == 0:
        ax.axhspan(m - 2 * s, m + 2 * s, color="k", alpha=0.15,
                   label="random: mean ± 2 std")
        ax.legend(fontsize=7)
      ax.axhline(0.0, color="k", linewidth=0.5)
      ax.set_xticks(range(len(names)))
      ax.set_xticklabels(names, fontsize=7)
      ax.set_title(f"{label}: {title}", fontsize=8)
  fig.tight_layout()
  return plots.save(fig, path)


def dynamics(runs: Mapping[str, dict], *, path: str):
  """Loss (top) and per-head scores (bottom) at every checkpoint."""
  fig, axes = _grid(2, len(runs), cell=(3.4, 2.4))
  for col, (label, r) in enumerate(runs.items()):
    dyn, pc = r["dynamics"], r["phase_change"]
    steps = dyn["steps"]
    ax = axes[0, col]
    ax.plot(r["curve"]["steps"], r["curve"]["loss"], "k-", label="eval loss")
    ax.set_title(f"{label}: loss", fontsize=8)
    ax.set_xlabel("step", fontsize=7)
    ax = axes[1, col]
    n_h = dyn["previous_token"].shape[-1]
    blues, reds = matplotlib.colormaps["Blues"], matplotlib.colormaps["Reds"]
    for h in range(n_h):
      shade = 0.4 + 0.6 * h / max(n_h - 1, 1)
      ax.plot(steps, dyn["previous_token"][:, 0, h], color=blues(shade),
              label=f"{report_lib.head_name(0, h)} prev-token")
      ax.plot(steps, dyn["current_token"][:, 0, h], color=blues(shade),
              linestyle=":",
              label=f"{report_lib.head_name(0, h)} current-token")
      ax.plot(steps, dyn["induction"][:, -1, h], color=reds(shade),
              label=f"{report_lib.head_name(1, h)} induction")
    ax.set_ylim(0.0, 1.0)
    ax.set_title(f"{label}: head scores", fontsize=8)
    ax.set_xlabel("step", fontsize=7)
    for a in axes[:, col]:
      a.axvspan(pc["from_step"], pc["to_step"], color="tab:orange",
                alpha=0.2)
  axes[1, -1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
  fig.suptitle("Training: the heads' scores and the loss (orange: the "
               "steepest loss drop between two evaluations)", fontsize=9)
  fig.tight_layout()
  return plots.save(fig, path)
