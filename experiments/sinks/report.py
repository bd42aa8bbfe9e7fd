"""Attention sinks, reporting: tables, figures and findings from the results.

`write` turns the results dict of `run.measure` into report.md, its PNG
figures (`figures.draw`) and results.json. Shape letters: S seeds, L
layers, H heads, T length.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from experiments.sinks import figures as sink_figures
from experiments.sinks import run as run_lib
from mha_jax.measure import report as report_lib


def _ms(x, digits=3):
  return report_lib.fmt(x["mean"], x["std"], digits)


def _ci(x, digits=3):
  return f"{_ms(x, digits)} {report_lib.interval(x['ci95'], digits)}"


def _diff(d, digits=3):
  return report_lib.difference(d, digits, interval_spec=f".{digits}f",
                               missing="n/a")


def _values(x, digits=3):
  return ", ".join(f"{v:.{digits}f}" for v in x["values"])


def _rho(p):
  return "-" if p["rho"] is None else f"{p['rho']:+.2f} (n = {p['n_heads']})"


def _shares_table(config, runs, summary, comparisons, pooled, floors):
  """Shares of attention per setting, beside uniform attention."""
  e = config.experiment
  seeds = list(e.seeds)
  names = list(runs)
  uni, uni_late = _uniform(floors)
  has_sinks = [n for n in names if "sink_logits" in runs[n][seeds[0]]]
  rows = []
  for n in names:
    x = summary[n]
    s = n in has_sinks
    rows.append([n, _ci(x["key0_max"]), _ms(x["key0_mean"]),
                 _ci(x["key0_late_max"]),
                 _ms(x["sink_max"]) if s else "-",
                 _ms(x["sink_mean"]) if s else "-",
                 _ms(x["parked_max"]) if s else "-",
                 _ms(x["parked_late_max"]) if s else "-",
                 _ms(x["init_key0_max"]), _ms(x["init_key0_late_max"])])
  rows.append(["uniform causal", f"{uni:.3f}", f"{uni:.3f}",
               f"{uni_late:.3f}", "0", "0", "-", "-", "-", "-"])
  return report_lib.md_table(
      ["setting", "position 0, largest head", "position 0, mean head",
       "late queries: position 0, largest head", "sink, largest head",
       "sink, mean head", "parked, largest head",
       "late queries: parked, largest head", "init: position 0, largest",
       "init: late, largest"], rows)


def _layers_table(config, runs, summary, comparisons, pooled, floors):
  """Each layer's mean shares per setting."""
  e = config.experiment
  seeds = list(e.seeds)
  names = list(runs)
  nl = config.model.num_layers
  has_sinks = [n for n in names if "sink_logits" in runs[n][seeds[0]]]
  rows = []
  for n in names:
    x = summary[n]
    cells = [n]
    for key in ("key0", "key0_late", "sink"):
      for l in range(nl):
        k = f"{key}_layer{l}_mean"
        cells.append(_ms(x[k]) if key != "sink" or n in has_sinks else "-")
    rows.append(cells)
  return report_lib.md_table(
      ["setting"] + [f"{what}, layer {l}" for what in
                     ("position 0", "position 0 late", "sink")
                     for l in range(nl)], rows)


def _loss_table(config, runs, summary, comparisons, pooled, floors):
  """Held-out loss and zero-ablation effects per setting."""
  names = list(runs)
  return report_lib.md_table(
      ["setting", "loss", "loss per seed", "init loss",
       "ablation Δloss, mean head", "smallest", "largest"],
      [[n, _ci(summary[n]["loss"]), _values(summary[n]["loss"]),
        _ms(summary[n]["init_loss"]), _ci(summary[n]["ablation_mean"]),
        _ms(summary[n]["ablation_min"]), _ms(summary[n]["ablation_max"])]
       for n in names])


def _per_run_table(config, runs, summary, comparisons, pooled, floors):
  """One row per (setting, seed)."""
  e = config.experiment
  seeds = list(e.seeds)
  names = list(runs)
  nl, nh = config.model.num_layers, config.model.num_heads
  has_sinks = [n for n in names if "sink_logits" in runs[n][seeds[0]]]
  rows = []
  for n in names:
    for s in seeds:
      sc = runs[n][s]["scalars"]
      rows.append([n, s, f"{sc['loss']:.3f}",
                   "never" if sc["drop_step"] is None else sc["drop_step"],
                   f"{sc['key0_max']:.3f}",
                   f"{sc['key0_late_max']:.3f}",
                   f"{sc['sink_max']:.3f}" if n in has_sinks else "-",
                   f"{sc['parked_late_max']:.3f}",
                   f"L{sc['top_parker_layer']}, "
                   f"{sc['top_parker_self']:.2f} / "
                   f"{sc['top_parker_prev']:.2f}, "
                   f"{sc['top_parker_ablation']:+.3f} "
                   f"({sc['top_parker_ablation_rank']} of {nl * nh})",
                   f"{sc['ablation_mean']:+.3f}",
                   f"{sc['ablation_min']:+.3f}"])
  return report_lib.md_table(
      ["setting", "seed", "loss",
       f"first eval step with loss < {e.drop_level:g}", "pos 0 largest",
       "pos 0 late largest", "sink largest", "parked late largest",
       "that head: layer, self / previous-token share, abl. Δloss (rank)",
       "abl. Δloss mean", "abl. Δloss smallest"], rows)


def _differences_table(config, runs, summary, comparisons, pooled, floors):
  """Welch differences of the compared numbers."""
  return report_lib.md_table(
      ["difference"] + list(run_lib.COMPARED),
      [[pair] + [_diff(d[k]) for k in run_lib.COMPARED]
       for pair, d in comparisons.items()])


def _rho_table(config, runs, summary, comparisons, pooled, floors):
  """Spearman of shares with ablation, per model and pooled."""
  names = list(runs)
  nl = config.model.num_layers
  rows = []
  for n in names:
    cells = [n]
    for k in ("key0", "parked"):
      key = f"rho_{k}_ablation"
      cells.append(_ci(summary[n][key], 2) if key in summary[n] else "-")
      cells += [_rho(pooled[n][k][g]) for g in
                ["all"] + [f"layer{l}" for l in range(nl)]]
    rows.append(cells)
  groups = ["pooled"] + [f"pooled, layer {l}" for l in range(nl)]
  return report_lib.md_table(
      ["setting", "position 0 vs Δloss, per model"] + groups
      + ["parked vs Δloss, per model"] + groups, rows)


def _idle_table(config, runs, summary, comparisons, pooled, floors):
  """Last-layer shares on idle and on target queries."""
  e = config.experiment
  seeds = list(e.seeds)
  names = list(runs)
  su = runs[names[0]][seeds[0]]["uniform"]
  has_sinks = [n for n in names if "sink_logits" in runs[n][seeds[0]]]
  rows = []
  for n in names:
    x = summary[n]
    rows.append([
        n, _ms(x["key0_idle_last"]), _ms(x["key0_task_last"]),
        _ms(x["key0_idle_last_vs_uniform"], 2),
        _ms(x["key0_task_last_vs_uniform"], 2),
        _ci(x["key0_idle_minus_task_last_vs_uniform"], 2),
        _ms(x["init_key0_idle_last_vs_uniform"], 2),
        _ms(x["init_key0_task_last_vs_uniform"], 2),
        _ms(x["sink_idle_last"]) if n in has_sinks else "-",
        _ms(x["sink_task_last"]) if n in has_sinks else "-"])
  rows.append(["uniform causal", f"{su['key0_idle']:.3f}",
               f"{su['key0_task']:.3f}", "1", "1", "0", "-", "-", "0", "0"])
  return report_lib.md_table(
      ["setting", "position 0, idle queries", "position 0, with a target",
       "idle / uniform", "with target / uniform",
       "difference of the two [95%]", "init: idle / uniform",
       "init: with target / uniform", "sink, idle", "sink, with target"],
      rows)


def _logits_table(config, runs, summary, comparisons, pooled, floors):
  """The size of the attention logits per layer."""
  e = config.experiment
  seeds = list(e.seeds)
  names = list(runs)
  nl = config.model.num_layers
  rows = []
  for n in names:
    for l in range(nl):
      lr = [runs[n][s]["logit_range"] for s in seeds]
      m = lambda k: float(np.mean([r[k][l] for r in lr]))  # noqa: E731
      rows.append([n, l + 1, f"{m('abs_median'):.2f}", f"{m('abs_q99'):.2f}",
                   f"{m('abs_max'):.2f}", f"{m('row_max_median'):.2f}",
                   f"{m('frac_above_cap'):.3f}"])
  return report_lib.md_table(
      ["setting", "layer", "median |s|", "99% |s|", "max |s|",
       "median row max", f"share |s| > {e.soft_cap:g}"], rows)


def _heads_table(config, runs, summary, comparisons, pooled, floors):
  """Every head of the first seed's models."""
  e = config.experiment
  seeds = list(e.seeds)
  names = list(runs)
  nl, nh = config.model.num_layers, config.model.num_heads
  rows = []
  s0 = seeds[0]
  for l in range(nl):
    for h in range(nh):
      cells = [report_lib.head_name(l, h)]
      for n in names:
        r = runs[n][s0]
        c = (f"{r['shares']['key0'][l, h]:.3f} / "
             f"{r['shares']['key0_late'][l, h]:.3f}")
        if "sink_logits" in r:
          c += (f" / {r['shares']['sink'][l, h]:.3f} "
                f"({r['sink_logits'][l, h]:+.2f})")
        c += f" / {r['ablation'][l, h]:+.3f}"
        cells.append(c)
      rows.append(cells)
  return report_lib.md_table(["head"] + names, rows)


def _uniform(floors):
  """Uniform causal attention's share on key 0: over all counted queries
  and over the late ones."""
  return floors["uniform_key0_closed_form"], floors["uniform_key0_late"]


def _tables(config, runs, summary, comparisons, pooled, floors):
  """The report's tables, by name (Markdown)."""
  args = (config, runs, summary, comparisons, pooled, floors)
  return {name: table(*args) for name, table in (
      ("shares", _shares_table),
      ("layers", _layers_table),
      ("loss", _loss_table),
      ("per_run", _per_run_table),
      ("differences", _differences_table),
      ("rho", _rho_table),
      ("idle", _idle_table),
      ("logits", _logits_table),
      ("heads", _heads_table))}


def _time_text(tm):
  load = (f"Load average at the end {tm['load_average'][0]:.1f} on "
          f"{os.cpu_count()} cores shared with other jobs.")
  if tm["runs_trained_now"] == tm["runs"]:
    return (f"{tm['wall_s'] / 60:.1f} min wall for the whole command: "
            f"training the {tm['runs']} runs took "
            f"{tm['train_s'] / 60:.1f} min, measuring them "
            f"{tm['analysis_s'] / 60:.1f} min. " + load)
  return (
      f"{tm['wall_s'] / 60:.1f} min wall for this command "
      f"({tm['runs_trained_now']} of {tm['runs']} runs trained by it, the "
      "others reused from an earlier run of the same config), of which "
      f"measuring took {tm['analysis_s'] / 60:.1f} min; training all "
      f"{tm['runs']} runs took {tm['train_s_all_runs'] / 60:.1f} min wall "
      "(each run timed when it was trained), so the whole experiment from "
      f"scratch takes about "
      f"{(tm['train_s_all_runs'] + tm['analysis_s']) / 60:.1f} min. " + load)


def _intro_lines(config, floors, timing):
  """The title, the setup, the time taken and the definitions."""
  e = config.experiment
  seeds = list(e.seeds)
  t = config.task.seq_len
  nl, nh = config.model.num_layers, config.model.num_heads
  uni, uni_late = _uniform(floors)
  return [
      "# Attention sinks in tiny induction models",
      "",
      f"Command: {report_lib.command('experiments.sinks')} (config "
      f"`configs/sinks.py`). {nl}-layer attention-only decoders (d_model "
      f"{config.model.d_model}, {nh} heads, {config.model.positions} "
      f"positions, {config.train.num_steps} steps of batch "
      f"{config.task.batch_size}) on the induction task of "
      f"configs/induction.py ({t} tokens, one segment of "
      f"{config.task.min_segment}-{config.task.max_segment} tokens "
      f"repeated). Settings: BOS token at position 0 off/on x attention "
      f"rule: plain softmax, a learned sink logit per head (starts at 0), "
      f"soft cap c = {e.soft_cap:g}; seeds {seeds}. Measured on "
      f"{e.analysis_examples} held-out sequences per seed. With BOS the "
      f"random pattern fills the {t} tokens after BOS instead of {t + 1}.",
      "",
      f"Time: {_time_text(timing)}",
      "",
      "Definitions (`experiments/sinks/survey.py`). A head's **share on "
      "position 0** "
      "is its mean attention weight on key 0 over the batch and the "
      f"queries at positions 1..{t - 1} (query 0 sees only key 0 and is "
      "left out). With BOS, position 0 is the BOS token, so this is the "
      "share on BOS. **Late queries**: the same over queries "
      f"{t // 2}..{t - 1}, where uniform attention gives key 0 little, so a "
      "head that parks a fixed share at every query stands out. The **sink "
      "share** is 1 minus the row sum of the pattern (the weight the "
      "learned sink takes), over the same queries. **Parked** = position 0 "
      "+ sink. Floors: uniform causal attention (1/(i+1) at query i: "
      f"{uni:.3f} over queries 1..{t - 1}, {uni_late:.3f} over the late "
      "ones) and the same model untrained (init). Spreads: sample std over "
      "seeds (ddof 1); intervals: 95% t over seeds, Welch for differences. "
      f"Per-model maxima and means are over its {nl * nh} heads.",
      "",
  ]


def _share_lines(config, floors, tab):
  """Shares, loss, per-run numbers and differences; `tab`: `_tables`."""
  nl, nh = config.model.num_layers, config.model.num_heads
  return [
      "## Shares of attention (mean ± std over seeds [95% interval])",
      "",
      tab["shares"],
      "",
      "By layer (mean over the layer's heads, mean ± std over seeds):",
      "",
      tab["layers"],
      "",
      "## Loss and ablation",
      "",
      f"Held-out loss on the predictable part of the repeat (chance ln "
      f"{config.task.vocab_size - 3} = {floors['chance_loss']:.2f}); "
      "zero-ablation Δloss: the loss increase when one head's output is set "
      f"to 0, mean / smallest / largest over the {nl * nh} heads.",
      "",
      tab["loss"],
      "",
      "## Per run",
      "",
      tab["per_run"],
      "",
      "## Differences (Welch 95% intervals over seeds)",
      "",
      tab["differences"],
      "",
  ]


def _report(config, runs, summary, comparisons, pooled, floors, figures,
            timing):
  e = config.experiment
  seeds = list(e.seeds)
  nl, nh = config.model.num_layers, config.model.num_heads
  tab = _tables(config, runs, summary, comparisons, pooled, floors)
  lines = (_intro_lines(config, floors, timing)
           + _share_lines(config, floors, tab)) + [
      "## Do heads with nothing to do park on position 0?",
      "",
      "Across heads: Spearman correlation of each head's share with its "
      "zero-ablation Δloss (the idea predicts a negative one: heads that "
      f"park matter less). Per model over its {nl * nh} heads (mean ± std "
      "over seeds [95%]), and pooled over the heads of all seeds of a "
      "setting, all layers together and within each layer (n heads; the "
      "layers differ in both quantities, so the all-layer number can be a "
      "difference between layers rather than between heads). For n "
      "independent heads with no relation, |ρ| exceeds "
      + ", ".join(f"{run_lib.rho_critical(n):.2f} (n = {n})" for n in sorted(
          {p["n_heads"] for x in pooled.values() for g in x.values()
           for p in g.values()}))
      + " in 5% of cases; heads of one model are not independent, so "
      "read these as descriptions.",
      "",
      tab["rho"],
      "",
      f"Across queries, last-layer heads (mean over its {nh} heads): "
      "queries without an induction target (no earlier copy of their "
      "token: nothing for an induction head to fetch) against queries "
      "with one. Idle queries sit earlier, where uniform attention gives "
      "key 0 more, so each share is also divided by uniform attention's on "
      "the same queries; the difference of the two ratios has a paired t "
      "interval over seeds.",
      "",
      tab["idle"],
      "",
      f"## Logit range (why c = {e.soft_cap:g})",
      "",
      "scale * q.k before any cap over the keys each query sees, mean over "
      "seeds: median and 99th percentile of |s|, largest |s|, median over "
      f"rows of the row's largest logit, and the fraction with |s| > "
      f"{e.soft_cap:g} (where tanh bends a logit by more than a quarter). "
      "The plain rows are what c was chosen from; the soft_cap rows are "
      "the capped models' logits before their cap.",
      "",
      tab["logits"],
      "",
      f"## Every head (seed {seeds[0]})",
      "",
      "Position-0 share / late-query position-0 share / sink share (sink "
      "logit) / zero-ablation Δloss.",
      "",
      tab["heads"],
      "",
      "## Figures",
      "",
      f"Every head of the {e.explorer} model (seed {seeds[0]}) in a "
      "browser, on the held-out batch: [explorer.html](explorer.html). Rows "
      "of a model with sinks sum to 1 minus the sink share.",
      "",
  ] + [f"![{f}]({f})" for f in figures] + [
      "",
      "## What the numbers show",
      "",
  ] + _findings(config, summary, comparisons, pooled, floors)
  return "\n".join(lines)


def _side(ci):
  """'above 0' / 'below 0' / 'not resolved' for an interval."""
  if ci is None:
    return "not resolved (one seed)"
  if ci[0] > 0:
    return "above 0"
  if ci[1] < 0:
    return "below 0"
  return "not resolved from 0"


def _against(x, floor):
  """Where a t interval of a share lies against a floor."""
  ci = x["ci95"]
  if ci is None:
    return "(one seed: no interval)"
  if ci[0] > floor:
    return f"above uniform attention's {floor:.3f}"
  if ci[1] < floor:
    return f"below uniform attention's {floor:.3f}"
  return f"not resolved from uniform attention's {floor:.3f}"


def _findings(config, summary, comparisons, pooled, floors):
  """Sentences generated from the intervals, no stronger than they are."""
  uni, uni_late = _uniform(floors)
  out = []
  for n, x in summary.items():
    text = (f"* {n}: the head with the most attention on position 0 gives "
            f"it {_ci(x['key0_max'])}, {_against(x['key0_max'], uni)}; on "
            f"late queries {_ci(x['key0_late_max'])}, "
            f"{_against(x['key0_late_max'], uni_late)}")
    if n.split("+")[0] == "sinks":
      text += (f". The learned sink takes {_ms(x['sink_layer0_mean'])} of "
               f"a layer-0 head's attention on average and "
               f"{_ms(x[f'sink_layer{config.model.num_layers - 1}_mean'])} "
               "of a "
               f"last-layer head's (largest head {_ci(x['sink_max'])}; "
               f"{_ms(x['init_sink_mean'])} at init, sink logit 0)")
    out.append(text + ".")
  for n, x in summary.items():
    layers = [int(v) for v in x["top_parker_layer"]["values"]]
    ranks = [int(v) for v in x["top_parker_ablation_rank"]["values"]]
    nh = config.model.num_layers * config.model.num_heads
    out.append(
        f"* {n}: the head that parks most on late queries sits in layer "
        f"{', '.join(map(str, layers))} (per seed); its zero-ablation "
        f"Δloss ranks {', '.join(map(str, ranks))} of {nh} (1 = the "
        "head whose removal costs most).")
  for pair, d in comparisons.items():
    parts = [f"{k} {_diff(d[k])} ({_side(d[k]['ci95'])})"
             for k in ("key0_late_max", "parked_late_max", "loss",
                       "ablation_mean")]
    a, b = (summary[n]["loss"]["values"] for n in pair.split(" - "))
    if min(a) > max(b) or max(a) < min(b):
      parts.append("every seed's loss is "
                   + ("above" if min(a) > max(b) else "below")
                   + " every seed's of the other setting")
    out.append(f"* {pair}: " + "; ".join(parts) + ".")
  for n, x in summary.items():
    d = x.get("key0_idle_minus_task_last_vs_uniform")
    if d is not None:
      out.append(
          f"* {n}, last layer, idle minus target queries (position-0 share "
          f"over uniform's): {_ci(d, 2)} ({_side(d['ci95'])}).")
  return out



def _seed_keyed(runs):
  """{setting: {seed (int): survey}}: results.json keys seeds by text."""
  return {n: {int(s): v for s, v in ps.items()} for n, ps in runs.items()}


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  runs = _seed_keyed(results["runs"])
  summary = results["summary"]
  figures = sink_figures.draw(workdir, config, runs, summary)
  report = _report(config, runs, summary, results["comparisons"],
                   results["pooled_rank_correlation"], results["floors"],
                   figures, results["timing"])
  # Per-query profiles feed one figure; the shares keep their means.
  return report_lib.write_outputs(workdir, results, report, drop=("profile",),
                                  config=config)
