"""Figures of the real-heads experiment, from its saved results.

Shape letters: L layers, H heads, G repeat distances.

`draw` writes, per model, `<model>_heads.png`: one layer x head map per
survey score (the mean over inputs; a dot marks heads whose interval
lies wholly past the score's highest floor), and for a model with
distances `<model>_distance.png`: the mean induction score of the sliding
and of the global layers' best head, and the copy loss with each head set
ablated, against the repeat distance.
"""

from __future__ import annotations

import numpy as np

from experiments.real_heads import survey
from mha_jax.measure import plots


def _heads(path, name, r):
  s = r["survey"]["scores"]
  names = list(survey.SCORES)
  fig, axes = plots.subplots(1, len(names), figsize=(2.2 * len(names), 4.2))
  for ax, key in zip(axes, names):
    x = s[key]
    mean, lo, hi = (np.asarray(x[k]) for k in ("mean", "lo", "hi"))
    im = ax.imshow(mean, aspect="auto", cmap="viridis", origin="upper")
    past = lo > x["floor"] if x["direction"] == "high" else hi < x["floor"]
    ly, hx = np.nonzero(past)
    ax.scatter(hx, ly, s=4, c="white", marker="o")
    ax.set_title(f"{key}\n({x['on']}; floor {x['floor']:.2f})", fontsize=8)
    ax.set_xlabel("head", fontsize=8)
    ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=ax, fraction=0.08, pad=0.02).ax.tick_params(
        labelsize=6)
  axes[0].set_ylabel("layer", fontsize=8)
  fig.suptitle(f"{r['info']['label']}: every head's scores (dot: interval "
               "past the floor)", fontsize=9)
  fig.tight_layout()
  plots.save(fig, path)


def _distance(path, r):
  d = r["distance"]
  x = np.asarray(d["distances"])
  ind = np.asarray(d["induction"]).mean(1)  # [G, L, H]
  is_global = np.asarray([w is None for w in r["info"]["windows"]])
  fig, axes = plots.subplots(1, 2, figsize=(9.0, 3.2))
  for kind, sel in (("sliding layers", ~is_global),
                    ("global layers", is_global)):
    axes[0].plot(x, ind[:, sel].max((1, 2)), marker="o",
                 label=f"best head, {kind}")
  axes[0].set_ylabel("induction score")
  loss = d["loss"]
  lines = {"copy loss": loss["none"], "no copy": loss["no_copy"],
           **{f"{a}: {k.replace('_', ' ')}": loss[a][k] for a in ("zero",
                                                                  "mean")
              for k in ("global_induction", "local_induction")},
           **{f"{a}: random": np.mean([v for k, v in loss[a].items()
                                       if k.startswith("random_")], 0)
              for a in ("zero", "mean")},
           "mean: global layers": loss["mean"]["global_layers"]}
  for label, v in lines.items():
    axes[1].plot(x, np.asarray(v).mean(1), marker="o", label=label,
                 linestyle="--" if label.startswith("zero") else "-")
  axes[1].set_ylabel("copy loss (nats)")
  for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("repeat distance (tokens)")
    ax.legend(fontsize=7)
  fig.tight_layout()
  plots.save(fig, path)


def draw(workdir, results) -> list[str]:
  """Write the figures into `workdir`; returns their file names."""
  names = []
  for name, r in results["models"].items():
    names.append(f"{name}_heads.png")
    _heads(f"{workdir}/{names[-1]}", name, r)
    if "distance" in r:
      names.append(f"{name}_distance.png")
      _distance(f"{workdir}/{names[-1]}", r)
  return names
