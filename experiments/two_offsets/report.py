"""Experiment 2, reporting: tables, figures and claims from the results.

Shape letters: H heads, T length.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model.
"""

from __future__ import annotations

import pathlib

from experiments import offset_sweep
from experiments import offset_sweep_report as sweep_report
from experiments.two_offsets import run as run_lib
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

FIGURES = ("nmse_vs_heads.png", "nmse_curves.png", "attention.png")
FLOOR = 0.5  # NMSE of the best linear read-out of one fixed blend


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(config, workdir, results["continuous"])
  return report_lib.write_outputs(workdir, results, _report(config, results),
                                  drop=("weights_example",), config=config)


def _ival(summ):
  return report_lib.interval(summ["ci95"], 3)


def _figures(config, workdir, cont) -> None:
  """NMSE per setting, NMSE curves, and attention heatmaps."""
  labels = list(cont)
  nmse = [report_lib.mean_std([r["nmse"] for r in cont[k]]) for k in labels]
  plots.setting_bars(labels, [m for m, _ in nmse],
                     [s or 0.0 for _, s in nmse],
                     ylabel="normalised MSE", logy=True,
                     title="Two-offset retrieval, one layer, d_model "
                     f"{config.model.d_model} (bars: sample std)",
                     path=str(workdir / FIGURES[0]))
  sweep_report.plot_nmse_curves(
      {k: [r["curve"] for r in cont[k]] for k in labels},
      title="Held-out NMSE against steps, every run",
      path=str(workdir / FIGURES[1]))
  # Heatmaps: the single head next to a multi-head model, same example.
  show = [labels[0]] + [k for k in labels if k in ("h=2", "h=4")][:1]
  grid, titles = [], []
  for k in show:
    r = cont[k][0]
    grid.append(r["weights_example"])
    titles.append([f"{k} head {h}: off1 {r['offset1'][h]:.2f} off3 "
                   f"{r['offset3'][h]:.2f}"
                   for h in range(len(r["offset1"]))])
  t = config.task.seq_len
  plots.attention_grid(grid, q_labels=[str(i) for i in range(t)],
                       k_labels=[str(i) for i in range(t)],
                       head_titles=titles, cell=2.8,
                       title="Continuous task, seed "
                       f"{cont[show[0]][0]['seed']}: rows = query t, "
                       "columns = key",
                       path=str(workdir / FIGURES[2]))


def _continuous_rows(results) -> list[list[str]]:
  """The NMSE table: one row per continuous setting."""
  sc = results["summary"]["continuous"]
  vs = results["summary"]["continuous_vs_h1"]
  return [[k, sweep_report.summary_cell(sc[k]["nmse"]),
           sweep_report.difference_cell(vs[k]) if k in vs else "-",
           *sweep_report.offset_cells(sc[k]),
           f"{sc[k]['split_heads']}/{len(rs)}"]
          for k, rs in results["continuous"].items()]


def _token_rows(results) -> list[list[str]]:
  """The token table: one row per token setting."""
  st = results["summary"]["token"]
  tvs = results["summary"]["token_loss_vs_h1"]

  def best(rs, key, reduce):
    return report_lib.fmt(*report_lib.mean_std([reduce(r[key]) for r in rs]),
                          digits=2)
  return [[k, report_lib.fmt(st[k]["accuracy"]["mean"],
                             st[k]["accuracy"]["std"]),
           sweep_report.summary_cell(st[k]["loss"]),
           sweep_report.difference_cell(tvs[k]) if k in tvs else "-",
           best(rs, "offset1", max), best(rs, "offset3", max),
           best(rs, "entropy", min)]
          for k, rs in results["token"].items()]


def _continuous_section(config, results) -> list[str]:
  """The continuous task: why 0.5, the NMSE and learning-rate tables."""
  e = config.experiment
  return [
      "## Continuous: target [u_{t-1}; u_{t-3}], u ~ N(0, I_"
      f"{config.task.feature_dim})",
      "",
      f"One layer, d_model {config.model.d_model}, "
      + sweep_report.tuning_text(config),
      "",
      "Why 0.5 is the reference: one softmax with weight a on t-1 and 1 - a "
      "on t-3 hands every value dimension the same blend a u_{t-1} + (1 - a) "
      "u_{t-3}; for a FIXED a, the best read-out of the two halves from it "
      "explains a^2 / (a^2 + (1-a)^2) and (1-a)^2 / (a^2 + (1-a)^2) of their "
      "variance, which sum to 1 of 2, so NMSE >= 0.5 for every fixed split "
      "(a = 1 included: fetch one position, guess the other). For the "
      "trained model this is an approximate floor, not a proven bound: the "
      "keys and queries depend on the inputs, so the split a can vary with "
      "the content, and the final LayerNorm (and the MLP of one control) is "
      "non-linear. The two controls give the single head more capacity "
      "without a second softmax: a model "
      f"{e.wide_factor}x wider (a head wider than d_model would be capped "
      "by the d_model-wide stream it reads and writes), and an MLP after the "
      "attention.",
      "",
      report_lib.md_table(["setting", "NMSE", "Δ NMSE vs h=1 [95%]",
                           "best head weight on t-1",
                           "best head weight on t-3",
                           "runs with one head per offset"],
                          _continuous_rows(results)),
      "",
      *sweep_report.selection_section(config, results["selection"],
                                      results["plateau"]),
      "",
      *[f"![{f}]({f})" for f in FIGURES],
      "",
      _explorer_text(config),
      ""]


def _token_section(config, results) -> list[str]:
  """The token version and its table."""
  v = config.task.vocab_size
  return [
      "## Token version: class of the pair (x_{t-1}, x_{t-3}), "
      f"{v} symbols, chance accuracy 1/{v ** 2}",
      "",
      f"The config's learning rate ({config.train.learning_rate:g}) for every "
      f"setting, {config.experiment.token_num_steps} steps, the same seeds.",
      "",
      report_lib.md_table(["setting", "accuracy", "loss",
                           "Δ loss vs h=1 [95%]", "best head weight on t-1",
                           "best head weight on t-3",
                           "lowest head entropy (nats)"],
                          _token_rows(results)),
      ""]


def _report(config, results) -> str:
  """report.md: the command, both tasks, the claims."""
  lines = [
      *sweep_report.report_header(
          "Experiment 2: two positions at once", "two_offsets", results),
      *_continuous_section(config, results),
      *_token_section(config, results),
      "## What this shows, next to the source's claim",
      "",
      "The source argues that one softmax cannot deliver two different "
      "positions' values in separate subspaces, and several heads can.",
      "",
  ] + _conclusions(results)
  return "\n".join(lines)


def _explorer_text(config) -> str:
  """The report's line that links explorer.html."""
  h, seed = run_lib.explorer_run(config)
  text = sweep_report.explorer_text(f"h={h}", seed)
  if h in config.experiment.token_heads:
    folder = offset_sweep.run_folder(run_lib.TOKEN, f"h={h}", seed)
    text += (f" The token version's h={h} model (seed {seed}) gets its page "
             "from `python -m experiments.explore --workdir=runs/two_offsets/"
             f"{folder} --batch_from_task`.")
  return text


def _h1_claim(sc) -> str:
  """Where the single head lands against the 0.5 reference."""
  h1 = sc["h=1"]["nmse"]
  near = abs(h1["mean"] - FLOOR) < 0.02
  return (
      f"* Continuous, one head: h = 1 reaches NMSE "
      f"{report_lib.fmt(h1['mean'])} (95% interval {_ival(h1)}), "
      + ("at the 0.5 reference of a fixed split" if near else
         f"{'above' if h1['mean'] > FLOOR else 'below'} the 0.5 reference "
         "of a fixed split")
      + f"; its head puts "
      f"{report_lib.fmt(sc['h=1']['best_offset1']['mean'], digits=2)} of its "
      f"weight on t-1 and "
      f"{report_lib.fmt(sc['h=1']['best_offset3']['mean'], digits=2)} on t-3.")


def _control_claim(k, c, d, seeds) -> str:
  """One single-head control `k`: its NMSE `c` per seed and its
  difference `d` from h = 1."""
  if d["ci95"] is not None and not d["excludes_0"]:
    rel = (f"no difference from h = 1 resolved "
           f"({sweep_report.difference_cell(d)}; the seeds would detect "
           f"about {report_lib.significant(d['detectable'])})")
  else:
    rel = f"a difference from h = 1 of {sweep_report.difference_cell(d)}"
  vals = c["values"]
  failed = [f"Seed {s_} ({report_lib.significant(v)})" for s_, v in zip(seeds, vals)
            if v > 0.9]
  text = (f"* Control {k}: NMSE per seed "
          + ", ".join(report_lib.significant(v) for v in vals)
          + f" (mean {report_lib.fmt(c['mean'])}, {_ival(c)}), {rel}.")
  if failed:
    text += (" " + ", ".join(failed) + " stayed near 1, the loss of "
             "predicting the mean: that run did not train at the chosen "
             "rate.")
  if min(vals) > 0.9 * FLOOR:
    text += (" No seed got below 0.45: the extra capacity did not let "
             "one softmax deliver both positions.")
  else:
    text += (f" Its best seed reached {report_lib.significant(min(vals))}, below the 0.5 "
             "reference: one head delivered more than one fixed blend "
             "here.")
  return text


def _multi_claim(results, multi) -> str:
  """The settings with several heads against h = 1."""
  sc = results["summary"]["continuous"]
  vs = results["summary"]["continuous_vs_h1"]
  best = min(multi, key=lambda k: sc[k]["nmse"]["mean"])
  worst = max(multi, key=lambda k: sc[k]["nmse"]["mean"])
  below = all(vs[k]["ci95"] is not None and vs[k]["ci95"][1] < 0
              for k in multi)
  return (
      f"* Several heads ({', '.join(multi)}): mean NMSE from "
      f"{report_lib.significant(sc[best]['nmse']['mean'], 2)} ({best}) to "
      f"{report_lib.significant(sc[worst]['nmse']['mean'], 2)} ({worst}); "
      + ("every one below h = 1 with a difference interval that excludes 0 "
         f"(the closest: {sweep_report.difference_cell(vs[worst])})"
         if below else
         "not every difference from h = 1 has an interval below 0 "
         f"({worst}: {sweep_report.difference_cell(vs[worst])})")
      + "; runs with one head per offset: "
      + ", ".join(f"{k} {sc[k]['split_heads']}/"
                  f"{len(results['continuous'][k])}" for k in multi) + ".")


def _token_claim(summ) -> str:
  """Whether one head solves the token version."""
  st = summ["token"]
  tok_h1 = st["h=1"]["accuracy"]
  tok_best = min((k for k in st if k != "h=1"),
                 key=lambda k: st[k]["loss"]["mean"])
  dl = summ["token_loss_vs_h1"][tok_best]
  best_acc = st[tok_best]["accuracy"]
  return (
      f"* Token version: h = 1 reaches accuracy "
      f"{report_lib.fmt(tok_h1['mean'], tok_h1['std'])} vs "
      f"{report_lib.fmt(best_acc['mean'], best_acc['std'])}"
      f" for {tok_best}; loss {report_lib.significant(st['h=1']['loss']['mean'])} vs "
      f"{report_lib.significant(st[tok_best]['loss']['mean'])} (difference "
      f"{sweep_report.difference_cell(dl)}). "
      + ("So on discrete symbols ONE head can also solve it: an unequal "
         "split of the weight between t-1 and t-3 keeps the pair (and its "
         "order) decodable from the blended value, which a continuous "
         "target cannot afford."
         if tok_h1["mean"] > 0.9 else
         "One head does not solve the token version in this budget; see "
         "the loss and entropy columns for how far it gets."))


def _conclusions(results) -> list[str]:
  """The claims, one bullet each."""
  summ = results["summary"]
  sc, vs = summ["continuous"], summ["continuous_vs_h1"]
  multi = [k for k in sc if k.startswith("h=") and k[2:].isdigit()
           and k != "h=1"]
  controls = [k for k in sc if k != "h=1" and k not in multi]
  seeds = {k: [r["seed"] for r in results["continuous"][k]] for k in controls}
  return ([_h1_claim(sc)]
          + [_control_claim(k, sc[k]["nmse"], vs[k], seeds[k])
             for k in controls]
          + [_multi_claim(results, multi), _token_claim(summ)])
