"""The output-head report's figure, drawn from results.json's contents.

groups.png: for each model and named group, the held-out joint direct
effect of the 50 (config) random groups of equal size as a histogram,
and the group's own as a line.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.measure import plots

NAME = "groups.png"
LABEL = {"name_movers": "name movers", "s_suppressors": "S suppressors",
         "negative": "negative heads"}


def write(saved: dict, workdir) -> list[str]:
  """Draw the figure (none where no model has a group); returns the file
  names."""
  panels = [(model, kind, g) for model, r in saved["models"].items()
            for kind, g in r["groups"].items() if g["size"]]
  if not panels:
    return []
  fig, axes = plots.subplots(1, len(panels),
                             figsize=(2.6 * len(panels) + 1, 3))
  for ax, (model, kind, g) in zip(np.atleast_1d(axes), panels):
    ax.hist(g["random"]["per_group"], bins=15, color="0.7")
    ax.axvline(g["joint"]["effect"]["mean"], color="C3")
    ax.set_title(f"{model}: {LABEL[kind]} ({g['size']})", fontsize=8)
    ax.set_xlabel("held-out joint direct effect", fontsize=8)
  fig.suptitle("Each named group (red) against random groups of equal "
               "size from the heads in no group (grey)", fontsize=9, y=1.06)
  plots.save(fig, str(pathlib.Path(workdir) / NAME))
  return [NAME]
