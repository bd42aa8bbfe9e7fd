"""Figures of the sinks experiment, from its results dict.

Shape letters: S seeds, L layers, H heads, T length. `draw` writes every
PNG the report shows: per-head shares (heads sorted within each layer,
mean ± std over seeds), the learned sinks' shares, the parked share at
each query of the most parking head, the loss per setting and every
head's parked share against its zero-ablation effect.
"""

from __future__ import annotations

import numpy as np

from experiments.sinks import survey
from mha_jax.measure import plots


def _sorted_heads(a):
  """`[L, H]` with each layer's heads sorted from the largest value down
  (heads have no identity across seeds; rank within a layer does)."""
  return -np.sort(-np.asarray(a), axis=-1)


def _mean_std_sorted(per_seed, key):
  """(mean, sample std or None for one seed) over seeds of `key`'s `[L, H]`
  shares, each layer's heads sorted from the largest down."""
  a = np.stack([_sorted_heads(s["shares"][key]) for s in per_seed.values()])
  return a.mean(0), (a.std(0, ddof=1) if len(a) > 1 else None)


def draw(workdir, config, runs, summary) -> list[str]:
  """Every figure of the report into `workdir`; returns their file names.

  `runs` {setting: {seed (int): survey}}, `summary` {setting: {scalar:
  `stats.summary`}}.
  """
  uni = survey.uniform_key0_share(config.task.seq_len)
  panels, errors = {}, {}
  for name, per_seed in runs.items():
    panels[name], err = _mean_std_sorted(per_seed, "key0")
    if err is not None:
      errors[name] = err
  plots.metric_bars(panels, errors=errors or None,
                    title="Share of attention on position 0 per head (heads "
                    f"sorted within each layer; mean ± std over seeds; "
                    f"uniform causal {uni:.3f})",
                    path=str(workdir / "key0_share.png"))
  figures = ["key0_share.png"]
  sink_settings = [n for n, ps in runs.items()
                   if "sink_logits" in next(iter(ps.values()))]
  if sink_settings:
    panels, errors = {}, {}
    for name in sink_settings:
      for key, label in (("sink", "sink share"),
                         ("parked", "parked (pos 0 + sink)")):
        panels[f"{name}: {label}"], err = _mean_std_sorted(runs[name], key)
        if err is not None:
          errors[f"{name}: {label}"] = err
    plots.metric_bars(panels, errors=errors or None,
                      title="Learned sink's share per head (sorted within "
                      "each layer; mean ± std over seeds)",
                      path=str(workdir / "sink_share.png"))
    figures.append("sink_share.png")
  _profile_figure(config, runs, workdir / "parked_by_query.png")
  figures.append("parked_by_query.png")
  names = list(runs)
  plots.setting_bars(
      names, [summary[n]["loss"]["mean"] for n in names],
      [summary[n]["loss"]["std"] or 0.0 for n in names],
      ylabel="held-out loss", logy=True, title="Final loss per setting "
      "(mean ± std over seeds)", path=str(workdir / "loss.png"))
  figures.append("loss.png")
  _scatter(runs, workdir / "share_vs_ablation.png")
  figures.append("share_vs_ablation.png")
  return figures


def _profile_figure(config, runs, path):
  """Per setting, the head of each run that parks most on late queries:
  its position-0 + sink share at every query, mean ± std over seeds,
  against uniform causal attention's 1/(i+1)."""
  t = config.task.seq_len
  q = np.arange(1, t)
  series = {}
  for name, per_seed in runs.items():
    curves = []
    for s in per_seed.values():
      l, h = np.unravel_index(np.argmax(s["shares"]["parked_late"]),
                              s["shares"]["parked_late"].shape)
      prof = s["profile"]
      curves.append((prof["key0"][l, h] + prof["sink"][l, h])[1:])
    curves = np.stack(curves)
    series[name] = (curves.mean(0),
                    curves.std(0, ddof=1) if len(curves) > 1 else None)
  series["uniform causal"] = (1.0 / (q + 1), None)
  plots.line_plot(q, series, xlabel="query position", ylabel="position 0 + "
                  "sink share", logy=True, title="The head that parks most "
                  "(on queries >= T/2), per setting", path=str(path))


def _scatter(runs, path):
  """Every head of every run: parked share against zero-ablation Δloss."""
  fig, ax = plots.subplots(figsize=(5.4, 3.6))
  for name, per_seed in runs.items():
    x = np.concatenate([s["shares"]["parked"].ravel()
                        for s in per_seed.values()])
    y = np.concatenate([np.ravel(s["ablation"]) for s in per_seed.values()])
    ax.scatter(x, y, s=12, label=name, alpha=0.75)
  ax.set_yscale("symlog", linthresh=0.01)
  ax.set_xlabel("share on position 0 + sink share (per head)")
  ax.set_ylabel("zero-ablation Δloss")
  ax.set_title("Do heads that park attention matter less?", fontsize=10)
  ax.legend(fontsize=7)
  fig.tight_layout()
  plots.save(fig, str(path))
