"""The IOI report's figures, drawn from results.json's contents.

patching_<model>.png, one per circuit model: each head's activation-
patching fraction (ABC into clean) per role, one [L, H] panel per role,
and its direct path to the logits.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.measure import plots


def patching_figure(model: str) -> str:
  """The file name of one circuit model's patching figure."""
  return f"patching_{model}.png"


def write(saved: dict, workdir) -> list[str]:
  """Draw the figures the results hold; returns their file names."""
  return [_patching(c, workdir) for c in saved["circuits"].values()]


def _patching(c: dict, workdir) -> str:
  act = np.asarray(c["activation"]["fraction"])  # [L, H, R]
  panels = [(f"at {r}", act[:, :, i])
            for i, r in enumerate(c["activation"]["roles"])]
  panels.append(("direct path",
                 np.asarray(c["direct"]["fraction"])))
  fig, axes = plots.subplots(1, len(panels),
                             figsize=(2.2 * len(panels) + 1, 5))
  axes = np.atleast_1d(axes)
  lim = max(0.2, float(np.nanmax(np.abs([p for _, p in panels]))))
  for ax, (title, values) in zip(axes, panels):
    im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim,
                   aspect="auto", origin="lower")
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("head")
  axes[0].set_ylabel("layer")
  fig.colorbar(im, ax=list(axes), shrink=0.8,
               label="share of the clean - ABC logit difference removed")
  fig.suptitle(f"{c['model']}: activation patching of each head's z (ABC "
               f"into clean) by position, and its direct path; {c['n']} "
               "prompts")
  name = patching_figure(c["model"])
  plots.save(fig, str(pathlib.Path(workdir) / name))
  return name
