"""Figures of the pretrained-heads experiment, from its results dict.

Shape letters: L layers, H heads, K points of the pruning curve. `draw`
writes the PNGs the report shows, each the counterpart of one of Clark et
al. (2019)'s figures: per-layer shares on [CLS], [SEP] and punctuation
(their Fig. 2), the gradient at [SEP] (Fig. 3), entropy per layer (Fig.
4), the heads embedded by their JS distances (Fig. 6), and the pruning
curve.
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import plots

_SHARES = (("cls", "[CLS]"), ("sep", "[SEP]"), ("punct", '"." and ","'))


def _band(ax, x, s, label, **kw):
  """Mean line with its 95% interval as a band; `s` a results summary."""
  mean, ci = np.asarray(s["mean"]), np.asarray(s["ci95"])
  line, = ax.plot(x, mean, marker="o", label=label, linewidth=1.2, **kw)
  ax.fill_between(x, ci[..., 0], ci[..., 1], alpha=0.2,
                  color=line.get_color())


def _layers(results):
  return np.arange(results["model"]["layers"])


def _shares(path, results):
  fig, axes = plots.subplots(1, 3, figsize=(10.5, 3.0))
  x = _layers(results)
  for ax, (key, label) in zip(axes, _SHARES):
    h = results["heads"][key]
    _band(ax, x, h["layer_trained"], "pretrained")
    _band(ax, x, h["layer_init"], "re-initialised", linestyle=":")
    ax.axhline(h["uniform"]["mean"], color="grey", linestyle="--",
               label="uniform")
    ax.set_title(f"share on {label}", fontsize=9)
    ax.set_xlabel("layer")
    ax.legend(fontsize=7)
  fig.tight_layout()
  plots.save(fig, path)


def _entropy(path, results):
  fig, ax = plots.subplots(figsize=(4.5, 3.0))
  x = _layers(results)
  h = results["heads"]["entropy"]
  _band(ax, x, h["layer_trained"], "pretrained")
  _band(ax, x, h["layer_init"], "re-initialised", linestyle=":")
  ax.axhline(h["uniform"]["mean"], color="grey", linestyle="--",
             label="uniform")
  ax.set_xlabel("layer")
  ax.set_ylabel("mean row entropy (nats)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  plots.save(fig, path)


def _gradient(path, results):
  fig, (a, b) = plots.subplots(1, 2, figsize=(8.0, 3.0))
  x = _layers(results)
  g = results["gradient"]
  _band(a, x, g["sep"], "keys = [SEP]")
  _band(a, x, g["other"], "other keys")
  a.set_ylabel("mean |d cos / d attention|")
  a.set_xlabel("layer")
  a.legend(fontsize=7)
  _band(b, x, g["sep_share"], "share on [SEP]")
  b.set_xlabel("layer")
  b.legend(fontsize=7)
  fig.tight_layout()
  plots.save(fig, path)


def _mds(path, results):
  fig, axes = plots.subplots(1, 2, figsize=(8.5, 3.6))
  nl, nh = results["model"]["layers"], results["model"]["heads"]
  layer = np.repeat(np.arange(nl), nh)
  for ax, name in zip(axes, ("trained", "init")):
    p = np.asarray(results["js"][name]["mds"])
    sc = ax.scatter(p[:, 0], p[:, 1], c=layer, cmap="viridis", s=18)
    ax.set_title("pretrained" if name == "trained" else "re-initialised",
                 fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
  fig.colorbar(sc, ax=axes, label="layer")
  plots.save(fig, path)


def _pruning(path, results):
  p = results["pruning"]
  plots.line_plot(
      p["removed"],
      {"least harmful first": (p["ranked"]["accuracy"], None),
       "random order (mean ± std)": (p["random"]["accuracy"],
                                     p["random"]["accuracy_std"])},
      xlabel="heads removed (zero ablation)", ylabel="ranking accuracy",
      path=path)


def draw(workdir, results) -> list[str]:
  """Every figure into `workdir`; returns their file names."""
  names = {"layer_shares.png": _shares, "entropy.png": _entropy,
           "sep_gradient.png": _gradient, "heads_mds.png": _mds,
           "pruning.png": _pruning}
  for name, fn in names.items():
    fn(f"{workdir}/{name}", results)
  return list(names)
