"""Experiment 2, reporting: tables, figures and claims from the results.

Shape letters: H heads, T length.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model. The prose is
report.md.tmpl beside this file, with the sweep's methods paragraph in
experiments/offset_sweep_report.md.tmpl (shared with head_dim); `render`
fills them from results.json alone, so a committed report regenerates
from its results.json.
"""

from __future__ import annotations

import functools
import pathlib

from experiments import offset_sweep
from experiments import offset_sweep_report as sweep_report
from experiments.two_offsets import run as run_lib
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

FIGURES = ("nmse_vs_heads.png", "nmse_curves.png", "attention.png")
# Per-example arrays kept for the figures only.
DROP = ("weights_example",)
FLOOR = 0.5  # NMSE of the best linear read-out of one fixed blend
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(config, workdir, results["continuous"],
           results["summary"]["continuous"])
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _figures(config, workdir, cont, summary) -> None:
  """NMSE per setting, NMSE curves, and attention heatmaps."""
  labels = list(cont)
  nmse = [summary[k]["nmse"] for k in labels]
  plots.setting_bars(labels, [s["mean"] for s in nmse],
                     [s["std"] or 0.0 for s in nmse],
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


def _continuous_table(saved) -> str:
  """The NMSE table: one row per continuous setting."""
  sc = saved["summary"]["continuous"]
  vs = saved["summary"]["continuous_vs_h1"]
  return report_lib.md_table(
      ["setting", "NMSE", "Δ NMSE vs h=1 [95%]", "best head weight on t-1",
       "best head weight on t-3", "runs with one head per offset"],
      [[k, sweep_report.summary_cell(sc[k]["nmse"]),
        sweep_report.difference_cell(vs[k]) if k in vs else "-",
        *sweep_report.offset_cells(sc[k]), f"{sc[k]['split_heads']}/{len(rs)}"]
       for k, rs in saved["continuous"].items()])


def _token_table(summary) -> str:
  """The token table: one row per token setting."""
  st, tvs = summary["token"], summary["token_loss_vs_h1"]
  ms = lambda x: report_lib.fmt(x["mean"], x["std"], digits=2)
  return report_lib.md_table(
      ["setting", "accuracy", "loss", "Δ loss vs h=1 [95%]",
       "best head weight on t-1", "best head weight on t-3",
       "lowest head entropy (nats)"],
      [[k, report_lib.fmt(s["accuracy"]["mean"], s["accuracy"]["std"]),
        sweep_report.summary_cell(s["loss"]),
        sweep_report.difference_cell(tvs[k]) if k in tvs else "-",
        ms(s["best_offset1"]), ms(s["best_offset3"]),
        ms(s["lowest_entropy"])] for k, s in st.items()])


def _token_explorer(config) -> str:
  """Where the token version's page of the explorer's setting comes from;
  nothing when the token sweep has no such setting."""
  h, seed = run_lib.explorer_run(config)
  if h not in config["experiment"]["token_heads"]:
    return ""
  folder = offset_sweep.run_folder(run_lib.TOKEN, f"h={h}", seed)
  return (f" The token version's h={h} model (seed {seed}) gets its page "
          "from `python -m experiments.explore --workdir=runs/two_offsets/"
          f"{folder} --batch_from_task`.")


def _versus_h1(d) -> str:
  """A control's difference from h = 1, and whether the seeds resolve it."""
  if d["ci95"] is not None and not d["excludes_0"]:
    return (f"no difference from h = 1 resolved "
            f"({sweep_report.difference_cell(d)}; the seeds would detect "
            f"about {report_lib.significant(d['detectable'])})")
  return f"a difference from h = 1 of {sweep_report.difference_cell(d)}"


def _failed(seeds, vals) -> str:
  """The seeds whose NMSE stayed near 1 (did not train); nothing if
  none."""
  failed = [f"Seed {s} ({report_lib.significant(v)})"
            for s, v in zip(seeds, vals) if v > 0.9]
  if not failed:
    return ""
  return (" " + ", ".join(failed) + " stayed near 1, the loss of "
          "predicting the mean: that run did not train at the chosen rate.")


def _control_verdict(vals) -> str:
  """Whether any seed of a single-head control beat one fixed blend."""
  if min(vals) > 0.9 * FLOOR:
    return ("No seed got below 0.45: the extra capacity did not let one "
            "softmax deliver both positions.")
  return (f"Its best seed reached {report_lib.significant(min(vals))}, "
          "below the 0.5 reference: one head delivered more than one fixed "
          "blend here.")


def _control(prefix, k, saved) -> dict:
  """The values of the bullet on one single-head control `k`, each key
  starting with `prefix`."""
  c = saved["summary"]["continuous"][k]["nmse"]
  vals = c["values"]
  seeds = [r["seed"] for r in saved["continuous"][k]]
  return {prefix: k,
          f"{prefix}_per_seed": ", ".join(report_lib.significant(v)
                                          for v in vals),
          f"{prefix}_mean": report_lib.fmt(c["mean"]),
          f"{prefix}_interval": report_lib.interval(c["ci95"]),
          f"{prefix}_versus_h1": _versus_h1(
              saved["summary"]["continuous_vs_h1"][k]),
          f"{prefix}_failed": _failed(seeds, vals),
          f"{prefix}_verdict": _control_verdict(vals)}


def _h1_position(nmse) -> str:
  """`at`, `above` or `below` the 0.5 reference."""
  if abs(nmse - FLOOR) < 0.02:
    return "at"
  return "above" if nmse > FLOOR else "below"


def _multi(saved, multi) -> dict:
  """The values of the bullet on the settings with several heads."""
  sc = saved["summary"]["continuous"]
  vs = saved["summary"]["continuous_vs_h1"]
  best = min(multi, key=lambda k: sc[k]["nmse"]["mean"])
  worst = max(multi, key=lambda k: sc[k]["nmse"]["mean"])
  if all(vs[k]["ci95"] is not None and vs[k]["ci95"][1] < 0 for k in multi):
    versus = ("every one below h = 1 with a difference interval that "
              "excludes 0 (the closest: "
              f"{sweep_report.difference_cell(vs[worst])})")
  else:
    versus = ("not every difference from h = 1 has an interval below 0 "
              f"({worst}: {sweep_report.difference_cell(vs[worst])})")
  return {
      "multi": ", ".join(multi), "multi_best": best, "multi_worst": worst,
      "multi_best_nmse": report_lib.significant(sc[best]["nmse"]["mean"], 2),
      "multi_worst_nmse": report_lib.significant(sc[worst]["nmse"]["mean"],
                                                 2),
      "multi_versus_h1": versus,
      "multi_split": ", ".join(f"{k} {sc[k]['split_heads']}/"
                               f"{len(saved['continuous'][k])}"
                               for k in multi)}


def _token_verdict(accuracy) -> str:
  """Whether one head solves the token version."""
  if accuracy > 0.9:
    return ("So on discrete symbols ONE head can also solve it: an unequal "
            "split of the weight between t-1 and t-3 keeps the pair (and its "
            "order) decodable from the blended value, which a continuous "
            "target does not allow at a fixed split.")
  return ("One head does not solve the token version in this budget; see "
          "the loss and entropy columns for how far it gets.")


def _token(summary) -> dict:
  """The values of the bullet on the token version: h = 1 against the
  setting with the lowest mean loss."""
  st = summary["token"]
  best = min((k for k in st if k != "h=1"),
             key=lambda k: st[k]["loss"]["mean"])
  acc = lambda k: report_lib.fmt(st[k]["accuracy"]["mean"],
                                 st[k]["accuracy"]["std"])
  return {
      "token_best": best, "token_h1_accuracy": acc("h=1"),
      "token_best_accuracy": acc(best),
      "token_h1_loss": report_lib.significant(st["h=1"]["loss"]["mean"]),
      "token_best_loss": report_lib.significant(st[best]["loss"]["mean"]),
      "token_difference": sweep_report.difference_cell(
          summary["token_loss_vs_h1"][best]),
      "token_verdict": _token_verdict(st["h=1"]["accuracy"]["mean"])}


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, summary = saved["config"], saved["summary"]
  e, task, sc = config["experiment"], config["task"], summary["continuous"]
  multi = [k for k in sc if k.startswith("h=") and k[2:].isdigit()
           and k != "h=1"]
  # The two single-head controls of `offset_sweep.settings`, in its order.
  wide, mlp = [k for k in sc if k != "h=1" and k not in multi]
  h, seed = run_lib.explorer_run(config)
  h1 = sc["h=1"]
  return {
      **sweep_report.values("two_offsets", saved, saved["selection"],
                            saved["plateau"], command),
      "feature_dim": task["feature_dim"],
      "d_model": config["model"]["d_model"], "wide_factor": e["wide_factor"],
      "continuous_table": _continuous_table(saved),
      "explorer_setting": f"h={h}", "explorer_seed": seed,
      "token_explorer": _token_explorer(config),
      "vocab_size": task["vocab_size"], "classes": task["vocab_size"] ** 2,
      "learning_rate": f"{config['train']['learning_rate']:g}",
      "token_num_steps": e["token_num_steps"],
      "token_table": _token_table(summary),
      "h1_nmse": report_lib.fmt(h1["nmse"]["mean"]),
      "h1_interval": report_lib.interval(h1["nmse"]["ci95"]),
      "h1_position": _h1_position(h1["nmse"]["mean"]),
      "h1_offset1": report_lib.fmt(h1["best_offset1"]["mean"], digits=2),
      "h1_offset3": report_lib.fmt(h1["best_offset3"]["mean"], digits=2),
      **_control("wide", wide, saved), **_control("mlp", mlp, saved),
      **_multi(saved, multi), **_token(summary),
  }
