"""Experiment 3, reporting: tables, figures and claims from the results.

Shape letters: H heads, d_k head width, n positions of part B.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model. The prose is
report.md.tmpl beside this file, with the sweep's methods paragraph in
experiments/offset_sweep_report.md.tmpl (shared with two_offsets);
`render` fills them from results.json alone, so a committed report
regenerates from its results.json.
"""

from __future__ import annotations

import functools
import pathlib

from experiments import offset_sweep_report as sweep_report
from experiments.head_dim import run as run_lib
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

FIGURES = ("nmse_vs_dk.png", "nmse_curves.png", "low_rank_fit.png",
           "plateau_check.png")
# Per-example arrays kept for the figures only.
DROP = ("weights_example",)
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(config, workdir, results)
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _steps(first) -> str:
  """Per-seed first steps, `-` where a seed never got there."""
  return ", ".join("-" if x is None else str(x) for x in first)


def _figures(config, workdir, results) -> None:
  """NMSE against d_k, NMSE curves, the plateau check and part B."""
  e = config.experiment
  d = config.model.d_model
  cont, summary = results["part_a"], results["part_a_summary"]
  plateau, fit = results["part_a_plateau"], results["part_b"]
  nmse = [summary[k]["nmse"] for k in cont]
  plots.line_plot([d // h for h in e.heads],
                  {"two-offset retrieval": ([s["mean"] for s in nmse],
                                            [s["std"] or 0.0 for s in nmse])},
                  xlabel="d_k (h = d_model / d_k)", ylabel="normalised MSE",
                  logx=True, logy=True,
                  title=f"Part A: d_model = {d}, one layer, each d_k at its "
                  "own learning rate", path=str(workdir / FIGURES[0]))
  sweep_report.plot_nmse_curves(
      {k: [r["curve"] for r in rs] for k, rs in cont.items()},
      title="Part A: held-out NMSE against steps, every run",
      path=str(workdir / FIGURES[1]))
  if plateau:
    sweep_report.plot_nmse_curves(
        {k: [p["long_curve"]] for k, p in plateau.items()},
        title=f"Plateau check: seed {e.selection_seed} at each setting's "
        f"rate, {e.plateau_factor}x the steps",
        path=str(workdir / FIGURES[3]))
  plots.line_plot(fit["d_k"], {"mean KL to target": (
      fit["kl_mean"], [s or 0.0 for s in fit["kl_std"]])},
                  xlabel="d_k", ylabel="KL (nats)", logy=True,
                  title=f"Part B: fit one head to a random {e.fit_n}x"
                  f"{e.fit_n} attention",
                  path=str(workdir / FIGURES[2]))


def _part_a_table(saved) -> str:
  """The NMSE table: one row per setting."""
  summ, vs = saved["part_a_summary"], saved["part_a_vs_best"]
  threshold = saved["config"]["experiment"]["nmse_threshold"]
  return report_lib.md_table(
      ["setting", "NMSE", f"Δ NMSE vs {saved['part_a_best']} [95%]",
       "best head weight on t-1", "best head weight on t-3",
       "learning rate",
       f"first eval step with NMSE < {threshold:g} (per seed)"],
      [[k, sweep_report.summary_cell(s["nmse"]),
        sweep_report.difference_cell(vs[k]) if k in vs else "(best)",
        *sweep_report.offset_cells(s), f"{s['learning_rate']:g}",
        _steps(s["first_step_below_threshold"]["per_seed"])]
       for k, s in summ.items()])


def _part_b_table(fit) -> str:
  """Per d_k: the KL over targets and the mean largest weight error."""
  return report_lib.md_table(
      ["d_k", "mean KL (nats)", "max |error|"],
      [[dk, report_lib.scientific(m, s), report_lib.fmt(err)]
       for dk, m, s, err in zip(fit["d_k"], fit["kl_mean"], fit["kl_std"],
                                fit["max_error_mean"])])


def _knee(fit) -> int:
  """The smallest d_k whose mean KL is within 10x of the d_k = n fit."""
  floor = fit["kl_mean"][-1]
  return next(dk for dk, m in zip(fit["d_k"], fit["kl_mean"])
              if m <= 10 * floor)


def _resolved(vs, multi) -> str:
  """The differences from the best setting whose intervals exclude 0."""
  resolved = [k for k in multi if k in vs and vs[k]["excludes_0"]]
  if not resolved:
    return "no difference interval excludes 0."
  return ("; ".join(f"{k} {sweep_report.difference_cell(vs[k])}"
                    for k in resolved)
          + " (intervals that exclude 0); every other interval contains 0.")


def _detectable(vs, multi, num_seeds: int) -> str:
  """What the seeds could detect (80% power); nothing without a spread."""
  detect = [vs[k]["detectable"] for k in multi
            if k in vs and vs[k]["detectable"] is not None]
  if not detect:
    return ""
  return (f" {num_seeds} seeds per setting detect (80% power) differences "
          f"from {report_lib.significant(min(detect), 2)} to "
          f"{report_lib.significant(max(detect), 2)} depending on the "
          "setting's spread, so 'no difference' here means nothing larger "
          "than that.")


def _plateau_claim(plateau, multi, num_steps: int) -> str:
  """Did doubling the steps (selection seed) still help? A bullet of its
  own, line break included, or nothing."""
  moving = [k for k in multi if k in plateau
            and plateau[k]["long_loss"] < 0.9 * plateau[k]["loss"]]
  if not moving:
    return ""
  sig = lambda x: report_lib.significant(x, 2)
  return (
      "\n* Plateau: doubling the steps on the selection seed (one run per "
      "setting, not one of the reported seeds) still lowered the NMSE of "
      + ", ".join(
          f"{k} ({sig(plateau[k]['loss'])} → {sig(plateau[k]['long_loss'])})"
          for k in moving)
      + f", so at {num_steps} steps these settings had probably not fully "
      "converged (one seed shows it); the numbers above compare them at "
      "equal steps, not at their limits.")


def _narrow_claim(saved, narrow) -> str:
  """What the narrowest heads reach, and whether they only learn slowly."""
  config, e = saved["config"], saved["config"]["experiment"]
  summ, best = saved["part_a_summary"], saved["part_a_best"]
  p = saved["part_a_plateau"].get(narrow)
  sig = report_lib.significant
  per_seed = ", ".join(sig(r) for r in summ[narrow]["nmse"]["values"])
  if p is not None and p["long_loss"] < 0.05:
    first = summ[narrow]["first_step_below_threshold"]["per_seed"]
    best_first = summ[best]["first_step_below_threshold"]["per_seed"]
    offset = lambda k: report_lib.fmt(summ[narrow][k]["mean"], digits=2)
    return (
        f"The narrowest heads ({narrow}): NMSE per seed {per_seed} at "
        f"{config['train']['num_steps']} steps with their best rate (first "
        f"eval step below {e['nmse_threshold']:g} per seed: {_steps(first)}, "
        f"against {_steps(best_first)} for {best}); their best heads put "
        f"{offset('best_offset1')} of their weight on t-1 and "
        f"{offset('best_offset3')} on t-3, less sharply than wider heads. "
        f"Trained {e['plateau_factor']}x as long, the selection seed went "
        f"from {sig(p['loss'])} to {sig(p['long_loss'])}. So 1-wide heads "
        "learn this task much more slowly, but they are not unable to: the "
        "earlier 400-step sweep at one learning rate (NMSE 0.385 at d_k = "
        "1, read as 'cannot pick one offset') had stopped early. What these "
        "runs support is slower learning at d_k = 1, not an inability.")
  return (
      f"The narrowest heads ({narrow}) reach NMSE per seed {per_seed} "
      "with their best learning rate"
      + (f"; trained {e['plateau_factor']}x as long, the selection seed "
         f"went from {sig(p['loss'])} to {sig(p['long_loss'])}" if p else "")
      + ": narrow heads do worse at this length"
      + ("." if p is not None and p["long_loss"] > 0.9 * p["loss"] else
         ", and the runs may not have reached a plateau."))


def _claims(saved) -> dict:
  """The values of the claims on part A: one head, several, the
  narrowest."""
  summ, vs = saved["part_a_summary"], saved["part_a_vs_best"]
  best, config = saved["part_a_best"], saved["config"]
  one, *multi = summ
  nmse = summ[one]["nmse"]
  mean = lambda k: summ[k]["nmse"]["mean"]
  worst = max(multi, key=mean)
  return {
      "one": one, "one_nmse": report_lib.fmt(nmse["mean"]),
      "one_interval": report_lib.interval(nmse["ci95"]),
      "one_position": "at" if abs(nmse["mean"] - 0.5) < 0.02 else "not at",
      "best": best, "best_nmse": report_lib.significant(mean(best), 2),
      "worst": worst, "worst_nmse": report_lib.significant(mean(worst), 2),
      "resolved": _resolved(vs, multi),
      "detectable": _detectable(vs, multi,
                                len(config["experiment"]["seeds"])),
      "plateau_claim": _plateau_claim(saved["part_a_plateau"], multi,
                                      config["train"]["num_steps"]),
      "narrow_claim": _narrow_claim(saved, multi[-1]),
  }


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, fit = saved["config"], saved["part_b"]
  e = config["experiment"]
  h, seed = run_lib.explorer_run(config)
  return {
      **sweep_report.values("head_dim", saved, saved["part_a_selection"],
                            saved["part_a_plateau"], command),
      "d_model": config["model"]["d_model"], "heads": list(e["heads"]),
      "part_a_table": _part_a_table(saved),
      "plateau_figure": ("![plateau_check.png](plateau_check.png)"
                         if saved["part_a_plateau"] else ""),
      "explorer_setting": run_lib.setting_label(config, h),
      "explorer_seed": seed,
      "fit_n": e["fit_n"], "fit_d_model": e["fit_d_model"],
      "fit_temperature": e["fit_temperature"], "fit_steps": e["fit_steps"],
      "fit_lr": e["fit_lr"], "num_targets": len(e["seeds"]),
      "part_b_table": _part_b_table(fit),
      **_claims(saved),
      "knee": _knee(fit), "fit_rank": e["fit_n"] - 1,
  }
