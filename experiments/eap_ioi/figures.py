"""The EAP report's figure, drawn from results.json's contents.

faithfulness.png: one panel per ablation; the fraction of the logit
difference each circuit keeps against its size (fraction of the edges,
log scale; the empty circuit at 0 and the full one at 1 are left off a
log axis), EAP and EAP-IG with their bootstrap bands, each random draw,
and the hand-built circuit with the EAP-IG circuit of its size.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.measure import plots

FILE = "faithfulness.png"
LABELS = {"eap": "EAP", "eap-ig": "EAP-IG"}


def write(saved: dict, workdir) -> str:
  """Draw faithfulness.png into `workdir`; returns its file name."""
  abl = list(saved["curves"])
  fig, axes = plots.subplots(1, len(abl), figsize=(5.0 * len(abl), 3.6),
                             squeeze=False)
  x = np.asarray(saved["sizes"]["fractions"])
  hand = saved["hand_built"]["fraction"]
  for ax, a in zip(axes[0], abl):
    c = saved["curves"][a]
    for i, r in enumerate(c["random"]):
      ax.plot(x, r["faithfulness"], color="0.6", linewidth=0.8,
              label="random" if i == 0 else None)
    for m, curve in c["methods"].items():
      f, ci = np.asarray(curve["faithfulness"]), np.asarray(
          curve["faithfulness_ci95"])
      ax.plot(x, f, marker="o", markersize=3, label=LABELS[m])
      ax.fill_between(x, ci[:, 0], ci[:, 1], alpha=0.2)
    at = c["at_hand"]
    ax.errorbar([hand], [at["hand"][0]], yerr=[[at["hand"][0] - at["hand"][
        1]], [at["hand"][2] - at["hand"][0]]], fmt="s", color="k",
                label="hand-built heads")
    ax.axhline(1.0, color="0.8", linewidth=0.8)
    ax.axhline(0.0, color="0.8", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("circuit size (fraction of edges)")
    ax.set_ylabel("fraction of the logit difference kept")
    ax.set_title(f"{a} ablation (held-out prompts)", fontsize=10)
    ax.legend(fontsize=7)
  fig.tight_layout()
  plots.save(fig, str(pathlib.Path(workdir) / FILE))
  return FILE
