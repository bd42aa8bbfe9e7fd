"""Experiment 1, figures: loss curves, attention, head scores, ablation.

`write` draws the PNGs the report links from what `run.measure` returned
(in memory: the per-example attention weights are not in results.json).
Shape letters: L layers, H heads per layer.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

FIGURES = ("loss_curves.png", "attention.png", "head_metrics.png",
           "ablation.png")


def write(config, runs, workdir) -> None:
  """The four PNGs of `FIGURES`, of the first seed's deep model."""
  deep, ctrl = config.model.num_layers, config.experiment.control_layers
  seed = config.experiment.seeds[0]
  r = runs[f"L{deep}_seed{seed}"]
  m = r["metrics"]
  titles = [[f"{report_lib.head_name(l, h)} "
             f"prev {m['previous_token'][l, h]:.2f} "
             f"ind {m['induction'][l, h]:.2f}"
             for h in range(m["induction"].shape[1])]
            for l in range(m["induction"].shape[0])]
  curves = {f"{d}-layer seed {s}": (runs[f"L{d}_seed{s}"]["curve"]["steps"],
                                    runs[f"L{d}_seed{s}"]["curve"]["loss"])
            for d in (deep, ctrl) for s in config.experiment.seeds}
  plots.loss_curves(curves, title="Held-out loss on the repeated segment",
                    path=str(workdir / FIGURES[0]))
  tokens = [str(t) for t in np.asarray(r["tokens_example"])]
  plots.attention_grid(r["weights_example"], q_labels=tokens,
                       k_labels=tokens, head_titles=titles,
                       title=f"{deep}-layer model, seed {seed}: one "
                       "held-out sequence (rows: queries)",
                       path=str(workdir / FIGURES[1]), cell=2.6)
  plots.metric_bars({k: m[k] for k in ("previous_token", "induction",
                                       "duplicate_token", "entropy")},
                    title=f"Per-head scores ({deep}-layer, seed {seed})",
                    path=str(workdir / FIGURES[2]))
  imp = r["importance"]
  plots.metric_bars({"zero ablation": imp["zero_ablation"],
                     "mean ablation (per position)": imp["mean_ablation"],
                     "resample ablation": imp["resample_ablation"],
                     "-gradient (Taylor)": imp["taylor_estimate"],
                     "Michel |gradient|": imp["gradient_abs"]},
                    title="Loss increase when a head is removed",
                    path=str(workdir / FIGURES[3]))
