"""Attention sinks, reporting: tables, figures and findings from the results.

`write` turns the results dict of `run.measure` into report.md, its PNG
figures (`figures.draw`) and results.json. The prose is report.md.tmpl
beside this file; `render` fills it from results.json alone, so a
committed report regenerates from its results.json. Shape letters: S
seeds, L layers, H heads, T length.
"""

from __future__ import annotations

import functools
import pathlib

from experiments.sinks import figures as sink_figures
from experiments.sinks import findings
from experiments.sinks import run as run_lib
from mha_jax.measure import report as report_lib

TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")
# Per-query profiles feed one figure; the shares keep their means.
DROP = ("profile",)
# The cells of a summary over seeds, as the findings write them too.
_ms, _ci, _diff = findings.ms, findings.ci, findings.diff


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  runs = {n: {int(s): v for s, v in ps.items()}
          for n, ps in results["runs"].items()}
  sink_figures.draw(workdir, config, runs, results["summary"])
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _rho(p) -> str:
  """A pooled Spearman correlation with its number of heads."""
  return "-" if p["rho"] is None else f"{p['rho']:+.2f} (n = {p['n_heads']})"


def _first_runs(saved) -> dict:
  """setting -> its first seed's survey."""
  s0 = str(saved["config"]["experiment"]["seeds"][0])
  return {n: ps[s0] for n, ps in saved["runs"].items()}


def _has_sinks(saved) -> set:
  """The settings whose models have learned sinks."""
  return {n for n, r in _first_runs(saved).items() if "sink_logits" in r}


def _shares_table(saved, sinks) -> str:
  """Shares of attention per setting, beside uniform attention."""
  uni, uni_late = (saved["floors"]["uniform_key0_closed_form"],
                   saved["floors"]["uniform_key0_late"])
  rows = []
  for n, x in saved["summary"].items():
    sink = lambda k: _ms(x[k]) if n in sinks else "-"  # noqa: E731
    rows.append([n, _ci(x["key0_max"]), _ms(x["key0_mean"]),
                 _ci(x["key0_late_max"]), sink("sink_max"),
                 sink("sink_mean"), sink("parked_max"),
                 sink("parked_late_max"), _ms(x["init_key0_max"]),
                 _ms(x["init_key0_late_max"])])
  rows.append(["uniform causal", f"{uni:.3f}", f"{uni:.3f}",
               f"{uni_late:.3f}", "0", "0", "-", "-", "-", "-"])
  return report_lib.md_table(
      ["setting", "position 0, largest head", "position 0, mean head",
       "late queries: position 0, largest head", "sink, largest head",
       "sink, mean head", "parked, largest head",
       "late queries: parked, largest head", "init: position 0, largest",
       "init: late, largest"], rows)


def _layers_table(saved, sinks, nl) -> str:
  """Each layer's mean shares per setting."""
  keys = ("key0", "key0_late", "sink")
  rows = [[n] + [_ms(x[f"{key}_layer{l}_mean"])
                 if key != "sink" or n in sinks else "-"
                 for key in keys for l in range(nl)]
          for n, x in saved["summary"].items()]
  return report_lib.md_table(
      ["setting"] + [f"{what}, layer {l}" for what in
                     ("position 0", "position 0 late", "sink")
                     for l in range(nl)], rows)


def _loss_table(summary) -> str:
  """Held-out loss and zero-ablation effects per setting."""
  return report_lib.md_table(
      ["setting", "loss", "loss per seed", "init loss",
       "ablation Δloss, mean head", "smallest", "largest"],
      [[n, _ci(x["loss"]), ", ".join(f"{v:.3f}" for v in x["loss"]["values"]),
        _ms(x["init_loss"]), _ci(x["ablation_mean"]),
        _ms(x["ablation_min"]), _ms(x["ablation_max"])]
       for n, x in summary.items()])


def _per_run_row(n, s, sc, sinks, model_heads) -> list:
  """One run's headline numbers."""
  return [n, s, f"{sc['loss']:.3f}",
          "never" if sc["drop_step"] is None else sc["drop_step"],
          f"{sc['key0_max']:.3f}", f"{sc['key0_late_max']:.3f}",
          f"{sc['sink_max']:.3f}" if n in sinks else "-",
          f"{sc['parked_late_max']:.3f}",
          f"L{sc['top_parker_layer']}, {sc['top_parker_self']:.2f} / "
          f"{sc['top_parker_prev']:.2f}, {sc['top_parker_ablation']:+.3f} "
          f"({sc['top_parker_ablation_rank']} of {model_heads})",
          f"{sc['ablation_mean']:+.3f}", f"{sc['ablation_min']:+.3f}"]


def _per_run_table(saved, sinks, model_heads) -> str:
  """One row per (setting, seed)."""
  e = saved["config"]["experiment"]
  rows = [_per_run_row(n, s, ps[str(s)]["scalars"], sinks, model_heads)
          for n, ps in saved["runs"].items() for s in e["seeds"]]
  return report_lib.md_table(
      ["setting", "seed", "loss",
       f"first eval step with loss < {e['drop_level']:g}", "pos 0 largest",
       "pos 0 late largest", "sink largest", "parked late largest",
       "that head: layer, self / previous-token share, abl. Δloss (rank)",
       "abl. Δloss mean", "abl. Δloss smallest"], rows)


def _rho_table(saved, nl) -> str:
  """Spearman of shares with ablation, per model and pooled."""
  rows = []
  for n, x in saved["summary"].items():
    pooled, cells = saved["pooled_rank_correlation"][n], [n]
    for k in ("key0", "parked"):
      key = f"rho_{k}_ablation"
      cells.append(_ci(x[key], 2) if key in x else "-")
      cells += [_rho(pooled[k][g]) for g in
                ["all"] + [f"layer{l}" for l in range(nl)]]
    rows.append(cells)
  groups = ["pooled"] + [f"pooled, layer {l}" for l in range(nl)]
  return report_lib.md_table(
      ["setting", "position 0 vs Δloss, per model"] + groups
      + ["parked vs Δloss, per model"] + groups, rows)


def _idle_table(saved, sinks) -> str:
  """Last-layer shares on idle and on target queries."""
  su = next(iter(_first_runs(saved).values()))["uniform"]
  rows = [[n, _ms(x["key0_idle_last"]), _ms(x["key0_task_last"]),
           _ms(x["key0_idle_last_vs_uniform"], 2),
           _ms(x["key0_task_last_vs_uniform"], 2),
           _ci(x["key0_idle_minus_task_last_vs_uniform"], 2),
           _ms(x["init_key0_idle_last_vs_uniform"], 2),
           _ms(x["init_key0_task_last_vs_uniform"], 2),
           _ms(x["sink_idle_last"]) if n in sinks else "-",
           _ms(x["sink_task_last"]) if n in sinks else "-"]
          for n, x in saved["summary"].items()]
  rows.append(["uniform causal", f"{su['key0_idle']:.3f}",
               f"{su['key0_task']:.3f}", "1", "1", "0", "-", "-", "0", "0"])
  return report_lib.md_table(
      ["setting", "position 0, idle queries", "position 0, with a target",
       "idle / uniform", "with target / uniform",
       "difference of the two [95%]", "init: idle / uniform",
       "init: with target / uniform", "sink, idle", "sink, with target"],
      rows)


def _logits_table(saved, nl) -> str:
  """The size of the attention logits per layer (means over seeds)."""
  keys = ("abs_median", "abs_q99", "abs_max", "row_max_median")
  rows = [[n, l + 1] + [f"{lr[k][l]:.2f}" for k in keys]
          + [f"{lr['frac_above_cap'][l]:.3f}"]
          for n, lr in saved["logit_range"].items() for l in range(nl)]
  return report_lib.md_table(
      ["setting", "layer", "median |s|", "99% |s|", "max |s|",
       "median row max",
       f"share |s| > {saved['config']['experiment']['soft_cap']:g}"], rows)


def _head_cell(r, l, h) -> str:
  """One head of one model: shares, sink (logit) and ablation effect."""
  sh = r["shares"]
  c = f"{sh['key0'][l][h]:.3f} / {sh['key0_late'][l][h]:.3f}"
  if "sink_logits" in r:
    c += f" / {sh['sink'][l][h]:.3f} ({r['sink_logits'][l][h]:+.2f})"
  return c + f" / {r['ablation'][l][h]:+.3f}"


def _heads_table(saved, nl, nh) -> str:
  """Every head of the first seed's models."""
  first = _first_runs(saved)
  return report_lib.md_table(
      ["head"] + list(first),
      [[report_lib.head_name(l, h)] + [_head_cell(r, l, h)
                                       for r in first.values()]
       for l in range(nl) for h in range(nh)])


def _time_text(tm) -> str:
  """How long the command took, and training and measuring in it."""
  if tm["runs_trained_now"] == tm["runs"]:
    return (f"{tm['wall_s'] / 60:.1f} min wall for the whole command: "
            f"training the {tm['runs']} runs took "
            f"{tm['train_s'] / 60:.1f} min, measuring them "
            f"{tm['analysis_s'] / 60:.1f} min.")
  return (
      f"{tm['wall_s'] / 60:.1f} min wall for this command "
      f"({tm['runs_trained_now']} of {tm['runs']} runs trained by it, the "
      "others reused from an earlier run of the same config), of which "
      f"measuring took {tm['analysis_s'] / 60:.1f} min; training all "
      f"{tm['runs']} runs took {tm['train_s_all_runs'] / 60:.1f} min wall "
      "(each run timed when it was trained), so the whole experiment from "
      f"scratch takes about "
      f"{(tm['train_s_all_runs'] + tm['analysis_s']) / 60:.1f} min.")


def _setup(config) -> dict:
  """The values of the command's paragraph and the definitions."""
  m, t, e = config["model"], config["task"], config["experiment"]
  return {
      "num_layers": m["num_layers"], "d_model": m["d_model"],
      "num_heads": m["num_heads"], "positions": m["positions"],
      "num_steps": config["train"]["num_steps"],
      "batch_size": t["batch_size"], "seq_len": t["seq_len"],
      "min_segment": t["min_segment"], "max_segment": t["max_segment"],
      "soft_cap": f"{e['soft_cap']:g}", "seeds": list(e["seeds"]),
      "analysis_examples": e["analysis_examples"],
      "seq_len_without_bos": t["seq_len"] + 1,
      "last_query": t["seq_len"] - 1, "first_late": t["seq_len"] // 2,
      "model_heads": m["num_layers"] * m["num_heads"],
      "chance_vocab": t["vocab_size"] - 3, "first_seed": e["seeds"][0],
      "explorer": e["explorer"]}


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, tm, floors = saved["config"], saved["timing"], saved["floors"]
  nl, nh = config["model"]["num_layers"], config["model"]["num_heads"]
  sinks = _has_sinks(saved)
  return {
      "command": report_lib.command("experiments.sinks", command),
      **_setup(config),
      "time": _time_text(tm),
      "load_average": f"{tm['load_average'][0]:.1f}",
      # Results written before the count was saved: this machine's, as
      # the report written with them used.
      "cpu_count": tm["cpu_count"],
      "uniform": f"{floors['uniform_key0_closed_form']:.3f}",
      "uniform_late": f"{floors['uniform_key0_late']:.3f}",
      "shares_table": _shares_table(saved, sinks),
      "layers_table": _layers_table(saved, sinks, nl),
      "chance_loss": f"{floors['chance_loss']:.2f}",
      "loss_table": _loss_table(saved["summary"]),
      "per_run_table": _per_run_table(saved, sinks, nl * nh),
      "differences_table": report_lib.md_table(
          ["difference"] + list(run_lib.COMPARED),
          [[pair] + [_diff(d[k]) for k in run_lib.COMPARED]
           for pair, d in saved["comparisons"].items()]),
      "rho_critical": ", ".join(f"{v:.2f} (n = {n})"
                                for n, v in saved["rho_critical"].items()),
      "rho_table": _rho_table(saved, nl),
      "idle_table": _idle_table(saved, sinks),
      "logits_table": _logits_table(saved, nl),
      "heads_table": _heads_table(saved, nl, nh),
      "sink_figure": "![sink_share.png](sink_share.png)\n" if sinks else "",
      "findings": findings.text(saved),
  }
