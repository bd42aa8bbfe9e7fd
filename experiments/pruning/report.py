"""Experiment 5, reporting: the pruning table, curve and claims.

`write` turns what `run.measure` returned into report.md, results.json
and prune_curve.png; nothing here trains or runs a model. The prose is
report.md.tmpl beside this file; `render` fills it from results.json
alone, so a committed report regenerates from its results.json.
"""

from __future__ import annotations

import functools
import pathlib

from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """The figure, report.md and results.json; returns what results.json
  holds."""
  workdir = pathlib.Path(workdir)
  spread = {k: (results["mean"][k], results["std"][k])
            for k in results["curves"]}
  plots.line_plot(results["heads_kept"], spread, xlabel="heads kept",
                  ylabel="held-out loss",
                  title="Pruning the 2-layer induction model",
                  path=str(workdir / "prune_curve.png"))
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command),
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


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


def _idle(spread, kept, budget) -> str:
  """Whether any order removes a head for free (within 0.1 nats)."""
  if min(budget.values()) < int(kept[0]):
    return (f"The best order keeps the mean loss within 0.1 nats while "
            f"removing {int(kept[0]) - min(budget.values())} head(s).")
  first = spread["zero_ablation"][0][1] - spread["zero_ablation"][0][0]
  return ("No order removes even one head while keeping the mean loss "
          "within 0.1 nats of the full model (the first head removed by "
          f"zero ablation costs {report_lib.fmt(first, digits=2)} nats): "
          "in this small model no head is idle.")


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, e = saved["config"], saved["config"]["experiment"]
  kept, vs_random = saved["heads_kept"], saved["two_removed_minus_random"]
  spread = {k: (saved["mean"][k], saved["std"][k]) for k in saved["curves"]}
  full = spread["zero_ablation"][0][0]
  # Fewest heads each ranking keeps while the mean loss stays within 0.1
  # nats of the full model.
  budget = {k: min(int(h) for h, m in zip(kept, spread[k][0])
                   if m <= full + 0.1) for k in spread}
  at2 = {k: float(spread[k][0][2]) for k in spread}
  best2 = min(at2, key=at2.get)
  return {
      "command": report_lib.command("experiments.pruning", command),
      "num_heads": config["model"]["num_heads"],
      "num_steps": config["train"]["num_steps"],
      "seeds": list(e["seeds"]),
      "analysis_examples": e["analysis_examples"],
      "random_orders": e["random_orders"],
      "curve_table": _curve_table(spread, kept),
      "first_seed": e["seeds"][0],
      "full_loss": report_lib.fmt(full),
      "budget": ", ".join(f"{_name(k)} {v}" for k, v in budget.items()),
      "num_seeds": len(e["seeds"]),
      "comparison": report_lib.md_table(
          ["ranking", "loss with two heads removed", "minus random (Welch)"],
          [[_name(k), report_lib.fmt(at2[k]), _versus(vs_random[k])]
           for k in spread if k != "random"]),
      "kept_two_removed": int(kept[2]),
      "all_heads": int(kept[0]),
      "best_two_removed": _name(best2),
      "best_two_removed_loss": report_lib.fmt(at2[best2]),
      "taylor_vs_random": _versus(vs_random["taylor_estimate"]),
      "michel_vs_random": _versus(vs_random["michel"]),
      "michel_iterative_vs_random": _versus(vs_random["michel_iterative"]),
      "idle": _idle(spread, kept, budget),
  }
