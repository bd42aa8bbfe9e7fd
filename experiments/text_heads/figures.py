"""Figures of the text-heads experiment, from its results dict.

Shape letters: L layers, H heads. `draw` writes the held-out bits per
byte, ICL score and best induction score over training (one line per
seed), the attention of one model on the first 40 bytes of a held-out
window, and its per-head scores.
"""

from __future__ import annotations

from mha_jax.measure import curves
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib
from mha_jax.training import tasks
from mha_jax.training import text_corpus


def draw(workdir, runs, summary, config) -> list[str]:
  """Every figure of the report into `workdir`; returns their file names.

  `runs` {run name: measured dict}, `summary` {variant: headline
  summaries}; the attention grid and the per-head bars show the run that
  kept a "weights_example".
  """
  variants = list(summary)
  groups = {v: [(r["dynamics"]["steps"], r["dynamics"]["bpb"])
                for n, r in runs.items() if n.rsplit("_seed", 1)[0] == v]
            for v in variants}
  fig = curves.plot_seed_curves(groups, ylabel="held-out bits per byte",
                                title="Held-out bits per byte over training")
  ax = fig.axes[0]
  for key, style in (("unigram", ":"), ("bigram", "--")):
    ax.axhline(summary[variants[0]][key]["mean"], color="grey",
               linestyle=style, linewidth=1.0, label=key)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  plots.save(fig, str(workdir / "bpb_curves.png"))
  for key, label, name in (
      ("icl", "ICL score (bits, late - early)", "icl_curves.png"),
      ("max_induction", "best repeated-text induction score",
       "induction_curves.png")):
    curves.plot_seed_curves(
        {v: [(r["dynamics"]["steps"], r["dynamics"][key])
             for n, r in runs.items() if n.rsplit("_seed", 1)[0] == v]
         for v in variants}, ylabel=label, title=label + " over training",
        path=str(workdir / name))
  r0 = next(r for r in runs.values() if "weights_example" in r)
  weights, tokens = r0["weights_example"]
  lab = r0["taxonomy"]["label"]
  labels = [text_corpus.byte_label(t, first_id=tasks.NUM_SPECIAL)
            for t in tokens]
  plots.attention_grid(
      weights, q_labels=labels, k_labels=labels,
      head_titles=[[f"{report_lib.head_name(l, h)} {lab[l, h]}"
                    for h in range(lab.shape[1])]
                   for l in range(lab.shape[0])],
      title=f"{variants[-1]}, seed {config.experiment.seeds[0]}: the first "
      "40 bytes of a held-out window", path=str(workdir / "attention.png"),
      cell=2.4)
  plots.metric_bars({k: r0["scores"][k] for k in (
      "previous_token", "first_token", "line_start", "repeat_induction")},
                    title=f"Per-head scores ({variants[-1]}, seed "
                    f"{config.experiment.seeds[0]})",
                    path=str(workdir / "head_scores.png"))
  return ["bpb_curves.png", "icl_curves.png", "induction_curves.png",
          "attention.png", "head_scores.png"]
