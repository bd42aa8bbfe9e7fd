"""Experiment 5, reporting: the pruning table, curve and claims.

`write` turns what `run.measure` returned into report.md, results.json
and prune_curve.png; nothing here trains or runs a model.
"""

from __future__ import annotations

import pathlib

from mha_jax.measure import plots
from mha_jax.measure import report as report_lib


def write(config, results, workdir) -> dict:
  """The figure, report.md and results.json; returns what results.json
  holds."""
  workdir = pathlib.Path(workdir)
  spread = {k: (results["mean"][k], results["std"][k])
            for k in results["curves"]}
  plots.line_plot(results["heads_kept"], spread, xlabel="heads kept",
                  ylabel="held-out loss",
                  title="Pruning the 2-layer induction model",
                  path=str(workdir / "prune_curve.png"))
  return report_lib.write_outputs(
      workdir, results, _report(config, spread, results["heads_kept"],
                                results["two_removed_minus_random"]),
      config=config)


def _name(k: str) -> str:
  """A ranking's key as the report names it."""
  return k.replace("_", " ")


def _versus(d) -> str:
  """A ranking minus random order with two heads removed, and what its
  interval allows one to say."""
  text = (f"{report_lib.signed(d['diff'], 2)} nats, 95% interval "
          f"{report_lib.interval(d['ci95'], 2)}")
  if d["excludes_0"] is None:
    return text + " (one seed: no interval)"
  if not d["excludes_0"]:
    return text + ": no better than random at this seed count"
  return text + (": WORSE than random" if d["diff"] > 0
                 else ": better than random")


def _curve_table(spread, kept) -> str:
  """Mean ± std of the loss at every number of heads kept."""
  header = ["heads kept"] + [_name(k) for k in spread]
  rows = [[int(h)] + [report_lib.fmt(m[i], None if s is None else s[i],
                                     digits=2)
                      for m, s in spread.values()]
          for i, h in enumerate(kept)]
  return report_lib.md_table(header, rows)


def _intro(config) -> str:
  """The command and what was ranked and removed."""
  e = config.experiment
  return (
      f"Command: {report_lib.command('experiments.pruning')} "
      "(config `configs/pruning.py`): the 2-layer induction model "
      f"({config.model.num_heads} heads per layer, "
      f"{config.train.num_steps} steps), seeds {list(e.seeds)}. For each "
      f"seed, heads are ranked on one held-out batch of "
      f"{e.analysis_examples} sequences and removed cumulatively (gate 0), "
      "least important first; the loss is measured on a second held-out "
      "batch. Rankings: zero, per-position mean and resample ablation; the "
      "batch-gradient Taylor estimate; Michel et al.'s expected |gradient| "
      "(raw, and normalised per layer as they do: 'michel'); "
      "'michel iterative' recomputes the normalised score after every "
      "removal, as their pruning does. 'random' averages "
      f"{e.random_orders} random orders per seed; 'most important first' "
      "removes by zero ablation in reverse. Mean ± sample std over seeds.")


def _claim(spread, kept, vs_random, budget) -> str:
  """What this shows: the best order with two removed, the gradient
  rankings against random, and whether any head is idle."""
  at2 = {k: float(spread[k][0][2]) for k in spread}
  best2 = min(at2, key=at2.get)
  full = spread["zero_ablation"][0][0]
  return (
      f"With {int(kept[2])} of {int(kept[0])} heads kept, the lowest mean "
      f"loss is {_name(best2)}'s ({report_lib.fmt(at2[best2])}); the table "
      "above gives every ranking against random order. The batch-gradient "
      "(Taylor) ranking: " + _versus(vs_random["taylor_estimate"])
      + ". At a trained optimum d loss / d gate is ~0 for every head, so "
      "its sign carries little information. Michel et al.'s score "
      "(per-layer normalised): " + _versus(vs_random["michel"])
      + "; iterated: " + _versus(vs_random["michel_iterative"]) + ". "
      + (f"No order removes even one head while keeping the mean loss "
         f"within 0.1 nats of the full model (the first head removed by "
         f"zero ablation costs "
         f"{report_lib.fmt(spread['zero_ablation'][0][1] - full, digits=2)} "
         "nats): in this small model no head is idle."
         if min(budget.values()) == int(kept[0]) else
         f"The best order keeps the mean loss within 0.1 nats while "
         f"removing {int(kept[0]) - min(budget.values())} head(s)."))


def _report(config, spread, kept, vs_random) -> str:
  """report.md: the table, the figure, the comparison and the claims."""
  full = spread["zero_ablation"][0][0]
  # Fewest heads each ranking keeps while the mean loss stays within 0.1
  # nats of the full model.
  budget = {k: min(int(h) for h, m in zip(kept, spread[k][0])
                   if m <= full + 0.1) for k in spread}
  comparison = report_lib.md_table(
      ["ranking", "loss with two heads removed", "minus random (Welch)"],
      [[_name(k), report_lib.fmt(float(spread[k][0][2])),
        _versus(vs_random[k])] for k in spread if k != "random"])
  lines = [
      "# Experiment 5: head importance and pruning",
      "",
      _intro(config),
      "",
      _curve_table(spread, kept),
      "",
      "![prune_curve.png](prune_curve.png)",
      "",
      f"Every head of seed {config.experiment.seeds[0]}'s model in a "
      "browser, with its ablation effect on the test batch: "
      "[explorer.html](explorer.html).",
      "",
      "Fewest heads kept with the mean loss within 0.1 nats of the full "
      f"model ({report_lib.fmt(full)}): "
      + ", ".join(f"{_name(k)} {v}" for k, v in budget.items()) + ".",
      "",
      f"## Two heads removed, against random order "
      f"({len(config.experiment.seeds)} seeds)",
      "",
      comparison,
      "",
      "## What this shows",
      "",
      _claim(spread, kept, vs_random, budget),
  ]
  return "\n".join(lines)
