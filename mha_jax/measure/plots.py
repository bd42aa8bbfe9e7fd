"""Figures for the experiments: attention grids, per-head bars, loss curves.

Shape letters: L layers, H heads, Tq query length, Tk key length.

Every function returns a matplotlib `Figure` made outside pyplot (no
display needed) and, given `path`, also writes it as a PNG. Inputs are plain
arrays (NumPy or JAX); nothing here touches a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import os

from matplotlib.figure import Figure
import numpy as np

from mha_jax.measure import report


def figure(**kwargs) -> Figure:
  """A figure made outside pyplot. Importing this module chooses no
  backend, so a notebook keeps its own; pyplot holds no reference, so
  nothing needs closing; `savefig` renders PNGs with Agg."""
  return Figure(**kwargs)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
  """`(figure, axes)` as `pyplot.subplots` returns them, on `figure()`."""
  fig = figure(figsize=figsize)
  return fig, fig.subplots(nrows, ncols, **kwargs)


def save(fig, path: str | None, *, dpi: int = 80):
  """Write `fig` as PNG to `path` (creating the folder); return the figure."""
  if path is not None:
    folder = os.path.dirname(path)
    if folder:
      os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", bbox_inches="tight")
  return fig


def attention_grid(weights: Sequence[np.ndarray] | np.ndarray, *,
                   q_labels: Sequence[str] | None = None,
                   k_labels: Sequence[str] | None = None,
                   head_titles: Sequence[Sequence[str]] | None = None,
                   title: str = "", path: str | None = None,
                   cell: float = 2.2):
  """Layer x head grid of heatmaps for ONE example.

  Args:
    weights: per layer `[H, Tq, Tk]` (a list, or an array `[L, H, Tq, Tk]`);
      layers may have different head counts.
    q_labels, k_labels: tick labels (tokens) for queries (rows) and keys.
    head_titles: optional `[L][H]` strings shown above each panel (for
      example the head's induction score).
    title: figure title. path: write a PNG there when given.
    cell: inches per panel.

  Returns:
    The figure; `fig.axes` holds exactly one axes per (layer, head).
  """
  layers = [np.asarray(w, np.float32) for w in weights]
  for i, w in enumerate(layers):
    if w.ndim != 3:
      raise ValueError(f"attention_grid: layer {i} weights must be [H, Tq, "
                       f"Tk], got shape {w.shape}")
  n_rows, n_cols = len(layers), max(w.shape[0] for w in layers)
  fig = figure(figsize=(cell * n_cols, cell * n_rows + 0.4))
  for li, w in enumerate(layers):
    tq, tk = w.shape[1:]
    for hi in range(w.shape[0]):
      ax = fig.add_subplot(n_rows, n_cols, li * n_cols + hi + 1)
      ax.imshow(w[hi], cmap="viridis", vmin=0.0, vmax=1.0,
                interpolation="nearest", aspect="auto")
      name = (head_titles[li][hi] if head_titles is not None
              else report.head_name(li, hi))
      ax.set_title(name, fontsize=8)
      _ticks(ax.set_yticks, ax.set_yticklabels, q_labels, tq, hi == 0, cell)
      _ticks(ax.set_xticks, ax.set_xticklabels, k_labels, tk,
             li == n_rows - 1, cell, rotation=90)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return save(fig, path)


# Tick labels are drawn at TICK_FONT points, at most one per
# TICK_FONT * TICK_SPACING points of the panel: smaller type is unreadable
# at the PNGs' 80 dpi, and denser labels overlap.
TICK_FONT, TICK_SPACING = 7, 1.4


def _ticks(set_ticks, set_labels, labels, n, show, cell, rotation=0):
  """Label every position when the labels fit the panel (`cell` inches),
  otherwise every k-th one; no ticks without labels or off the edge."""
  if labels is None or not show:
    set_ticks([])
    return
  if len(labels) != n:
    raise ValueError(f"attention_grid: {len(labels)} tick labels for {n} "
                     "positions")
  fit = max(int(cell * 72 / (TICK_FONT * TICK_SPACING)), 1)
  at = range(0, n, -(-n // fit))  # ceil(n / fit): every k-th position
  set_ticks(list(at))
  set_labels([str(labels[i]) for i in at], fontsize=TICK_FONT,
             rotation=rotation)


def metric_bars(metrics: Mapping[str, np.ndarray], *, title: str = "",
                path: str | None = None, errors: Mapping | None = None):
  """One panel per metric; a bar per head, grouped by layer.

  `metrics[name]` is `[L, H]` (or `[H]` for one layer); `errors` may give
  matching spreads (for example std over seeds) drawn as error bars.
  """
  names = list(metrics)
  fig, axes = subplots(1, len(names), squeeze=False,
                           figsize=(3.2 * len(names), 2.8))
  for ax, name in zip(axes[0], names):
    vals = np.atleast_2d(np.asarray(metrics[name], np.float32))  # [L, H]
    err = None if errors is None or name not in errors else np.atleast_2d(
        np.asarray(errors[name], np.float32))
    n_layers, n_heads = vals.shape
    width = 0.8 / n_layers
    for li in range(n_layers):
      x = np.arange(n_heads) + (li - (n_layers - 1) / 2) * width
      ax.bar(x, vals[li], width, label=f"layer {li}",
             yerr=None if err is None else err[li], capsize=2)
    ax.set_xticks(range(n_heads))
    ax.set_xticklabels([f"H{h}" for h in range(n_heads)], fontsize=7)
    ax.set_title(name, fontsize=9)
  if title:
    fig.suptitle(title, fontsize=10)
  # One legend for the figure, below the panels: inside a panel it covers
  # a bar wherever the bars are tall.
  rect = (0, 0, 1, 1)
  if n_layers > 1:
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center",
               ncol=n_layers, fontsize=8, frameon=False)
    rect = (0, 0.1, 1, 1)
  fig.tight_layout(rect=rect)
  return save(fig, path)


def loss_curves(curves: Mapping[str, tuple[Sequence, Sequence]], *,
                title: str = "", ylabel: str = "loss", logy: bool = False,
                path: str | None = None):
  """Loss against step, one line per label: `curves[label] = (steps, losses)`.

  Several seeds of one setting can share a label prefix; each gets its own
  line so the spread is visible.
  """
  fig, ax = subplots(figsize=(5.0, 3.2))
  for label, (steps, losses) in curves.items():
    ax.plot(np.asarray(steps), np.asarray(losses), label=label, linewidth=1.2)
  return _finish(fig, ax, "step", ylabel, title, False, logy, path)


def line_plot(x: Sequence, series: Mapping[str, tuple[Sequence, Sequence]], *,
              xlabel: str, ylabel: str, title: str = "", logx: bool = False,
              logy: bool = False, path: str | None = None):
  """Mean with a spread band per series: `series[label] = (mean, spread)`.

  A spread of None (one seed: no spread) draws the line alone.
  """
  fig, ax = subplots(figsize=(5.0, 3.2))
  x = np.asarray(x, np.float32)
  for label, (mean, spread) in series.items():
    mean = np.asarray(mean)
    ax.plot(x, mean, marker="o", label=label, linewidth=1.2)
    if spread is not None:
      spread = np.asarray(spread)
      ax.fill_between(x, mean - spread, mean + spread, alpha=0.2)
  return _finish(fig, ax, xlabel, ylabel, title, logx, logy, path)


def _finish(fig, ax, xlabel, ylabel, title, logx, logy, path):
  """Labels, scales, legend and title of a one-panel figure; then save."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logx:
    ax.set_xscale("log", base=2)
  if logy:
    ax.set_yscale("log")
  if title:
    ax.set_title(title, fontsize=10)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return save(fig, path)


def setting_bars(labels: Sequence[str], means: Sequence[float],
                 spreads: Sequence[float] | None = None, *, ylabel: str,
                 title: str = "", logy: bool = False,
                 path: str | None = None):
  """One bar per setting (for example per head count), with error bars."""
  # A label's parts go on lines of their own ("h=4, d_model=256 (d_k=256)"
  # on three), so a bar's 0.9 inch holds a line of about 12 characters at
  # 8 pt; longer lines are slanted.
  lines = [str(x).replace(", ", "\n").replace(" (", "\n(") for x in labels]
  slant = max(len(part) for x in lines for part in x.split("\n")) > 12
  fig, ax = subplots(figsize=(max(4.0, 0.9 * len(labels) + 1.5), 3.2))
  ax.bar(range(len(labels)), np.asarray(means, np.float32),
         yerr=None if spreads is None else np.asarray(spreads, np.float32),
         capsize=3, color="tab:blue")
  ax.set_xticks(range(len(labels)))
  ax.set_xticklabels(lines, fontsize=8, rotation=30 if slant else 0,
                     ha="right" if slant else "center")
  ax.set_ylabel(ylabel)
  if logy:
    ax.set_yscale("log")
  if title:
    ax.set_title(title, fontsize=10)
  fig.tight_layout()
  return save(fig, path)
