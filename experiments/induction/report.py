"""Experiment 1, reporting: tables, figures and claims from the results.

Shape letters: L layers, H heads per layer.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures; nothing here trains or runs a model.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.induction import run as run_lib
from mha_jax.measure import plots
from mha_jax.measure import report as report_lib

FIGURES = ("loss_curves.png", "attention.png", "head_metrics.png",
           "ablation.png")
# The scores of the per-head table, in its column order.
HEAD_SCORES = ["previous_token", "induction", "duplicate_token", "entropy",
               "mean_distance"]


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  _figures(config, results["runs"], workdir)
  return report_lib.write_outputs(workdir, results, _report(config, results),
                                  drop=("weights_example",), config=config)


def _ms(x, digits=3):
  """`mean ± std` of a `stats.summary` record."""
  return report_lib.fmt(x["mean"], x["std"], digits)


def _with_ci(x, digits=3):
  """`mean ± std [95% t interval]` of a `stats.summary` record (`n/a` for
  the interval of one seed)."""
  return f"{_ms(x, digits)} {report_lib.interval(x['ci95'], digits)}"


def _figures(config, runs, workdir) -> None:
  """The four PNGs of `FIGURES`, of the first seed's deep model."""
  deep, ctrl = run_lib.depths(config)
  seed = config.experiment.seeds[0]
  r = runs[f"L{deep}_seed{seed}"]
  m = r["metrics"]
  titles = [[f"{report_lib.head_name(l, h)} "
             f"prev {m['previous_token'][l, h]:.2f} "
             f"ind {m['induction'][l, h]:.2f}"
             for h in range(m["induction"].shape[1])]
            for l in range(m["induction"].shape[0])]
  curves = {f"{d}-layer seed {s}": (runs[f"L{d}_seed{s}"]["curve"]["steps"],
                                    runs[f"L{d}_seed{s}"]["curve"]["loss"])
            for d in (deep, ctrl) for s in config.experiment.seeds}
  plots.loss_curves(curves, title="Held-out loss on the repeated segment",
                    path=str(workdir / FIGURES[0]))
  tokens = [str(t) for t in np.asarray(r["tokens_example"])]
  plots.attention_grid(r["weights_example"], q_labels=tokens,
                       k_labels=tokens, head_titles=titles,
                       title=f"{deep}-layer model, seed {seed}: one "
                       "held-out sequence (rows: queries)",
                       path=str(workdir / FIGURES[1]), cell=2.6)
  plots.metric_bars({k: m[k] for k in ("previous_token", "induction",
                                       "duplicate_token", "entropy")},
                    title=f"Per-head scores ({deep}-layer, seed {seed})",
                    path=str(workdir / FIGURES[2]))
  imp = r["importance"]
  plots.metric_bars({"zero ablation": imp["zero_ablation"],
                     "mean ablation (per position)": imp["mean_ablation"],
                     "resample ablation": imp["resample_ablation"],
                     "-gradient (Taylor)": imp["taylor_estimate"],
                     "Michel |gradient|": imp["gradient_abs"]},
                    title="Loss increase when a head is removed",
                    path=str(workdir / FIGURES[3]))


def _js_sentence(x, pair, where):
  """One sentence on whether training made heads differ (paired by seed)."""
  d = x[f"js_{pair}_minus_init"]
  ci = d["ci95"]
  text = (f"{where}, the mean Jensen-Shannon distance between heads is "
          f"{_ms(x[f'js_{pair}'], 2)} after training and "
          f"{_ms(x[f'js_{pair}_init'], 2)} at initialisation (difference "
          f"{report_lib.signed(d['mean'], 2)}, paired 95% interval "
          f"{report_lib.interval(ci, 2)})")
  if ci is None:
    return text + "."
  if ci[0] > 0:
    return text + ": training made them more different."
  if ci[1] < 0:
    return text + ": training made them MORE alike."
  return text + ": no more different than before training."


def _head_row(r, l: int, h: int) -> list[str]:
  """Head `h` of layer `l`: its scores (with bootstrap intervals where
  the survey has them), its argmax offset and its ablation effects."""
  m, imp, ci = r["metrics"], r["importance"], r["intervals"]
  cells = []
  for k in HEAD_SCORES:
    cell = report_lib.fmt(m[k][l, h], digits=2)
    if k in ci:
      cell += " " + report_lib.interval(ci[k][l, h], 2)
    cells.append(cell)
  return ([report_lib.head_name(l, h)] + cells
          + [f"{int(m['positional_offset'][l, h])} "
             f"({report_lib.fmt(m['positional_share'][l, h], digits=2)})"]
          + [report_lib.signed(imp[k][l, h]) for k in
             ("zero_ablation", "mean_ablation", "resample_ablation",
              "taylor_estimate")]
          + [report_lib.fmt(imp["gradient_abs"][l, h])])


def _head_table(r):
  """Every head of one run, then the uniform and untrained floors."""
  n_layers, n_heads = r["metrics"]["induction"].shape
  rows = [_head_row(r, l, h) for l in range(n_layers) for h in range(n_heads)]
  uniform = r["floors"]["uniform"]
  init = r["floors"]["init"]["metrics"]
  blank = ["-"] * 6
  rows.append(["uniform causal"]
              + [report_lib.fmt(uniform[k], digits=2) for k in HEAD_SCORES]
              + blank)
  rows.append(["init, best head"]
              + [report_lib.fmt(init[k].max(), digits=2) for k in HEAD_SCORES]
              + blank)
  return report_lib.md_table(
      ["head"] + HEAD_SCORES + ["argmax offset (share)", "zero abl. Δloss",
                                "mean abl. Δloss", "resample abl. Δloss",
                                "-grad (Taylor)", "Michel abs grad"], rows)


def _per_run_rows(config, runs) -> list[list]:
  """One row per (depth, seed): loss, steepest drop, best heads."""
  thr = config.experiment.threshold
  rows = []
  for depth in run_lib.depths(config):
    for s in config.experiment.seeds:
      r = runs[f"L{depth}_seed{s}"]
      m, pc = r["metrics"], r["phase_change"]
      prev_l0 = m["previous_token"][0]
      ind_last = m["induction"][-1]
      rows.append([
          depth, s, report_lib.fmt(r["eval"]["loss"]),
          report_lib.fmt(r["eval"]["accuracy"]),
          f"{pc['from_step']}→{pc['to_step']}: "
          f"{report_lib.fmt(pc['loss_before'], digits=2)}→"
          f"{report_lib.fmt(pc['loss_after'], digits=2)}",
          f"{report_lib.head_name(0, prev_l0.argmax())} "
          f"{report_lib.fmt(prev_l0.max(), digits=2)}",
          f"{report_lib.head_name(depth - 1, ind_last.argmax())} "
          f"{report_lib.fmt(ind_last.max(), digits=2)}",
          int((ind_last > thr).sum()),
          report_lib.fmt(r["js_by_layer"]["within_layer"], digits=2)])
  return rows


# Rows of the floors table: (label, score, its init floor, its uniform
# floor or None).
FLOOR_ROWS = (
    ("best layer-0 previous-token score", "max_prev_token_layer0",
     "max_prev_token_layer0_init", "uniform_prev_token"),
    ("best last-layer induction score", "max_induction_last_layer",
     "max_induction_last_layer_init", "uniform_induction"),
    ("JS distance, heads within a layer", "js_within_layer",
     "js_within_layer_init", None),
    ("JS distance, heads across layers", "js_across_layer",
     "js_across_layer_init", None))


def _floor_rows(sd, sc) -> list[list[str]]:
  """Each headline score of both depths beside its init and uniform
  floors (`sd`, `sc`: the deep and control summaries)."""
  rows = []
  for label, key, init_key, uni_key in FLOOR_ROWS:
    cells = [label]
    for x in (sd, sc):
      if key not in x:
        cells += ["-", "-"]
        continue
      cells += [_with_ci(x[key], 2), _ms(x[init_key], 2)]
    cells.append(_ms(sd[uni_key], 2) if uni_key else "-")
    rows.append(cells)
  return rows


def _intro(config, summary) -> list[str]:
  """The command and what was trained and measured."""
  e = config.experiment
  deep, ctrl = run_lib.depths(config)
  chance = summary["chance_loss"]
  return [
      "# Experiment 1: induction heads",
      "",
      f"Command: {report_lib.command('experiments.induction')} "
      f"(config `configs/induction.py`). Seeds {list(e.seeds)}; {deep}-layer "
      f"and {ctrl}-layer attention-only decoders, d_model "
      f"{config.model.d_model}, {config.model.num_heads} heads, "
      f"{config.model.positions} positions, {config.train.num_steps} steps "
      f"of batch {config.task.batch_size}, sequences of "
      f"{config.task.seq_len} tokens from {config.task.vocab_size - 3} "
      f"symbols with one segment of {config.task.min_segment}-"
      f"{config.task.max_segment} tokens repeated at a random offset. Loss "
      f"counts only the predictable part of the repeat (chance: ln "
      f"{config.task.vocab_size - 3} = "
      f"{report_lib.fmt(chance, digits=2)}). Head metrics on "
      f"{e.analysis_examples} held-out sequences drawn afresh for each "
      "seed. Spreads are the sample std over seeds (ddof 1); intervals are "
      "95% t intervals over seeds unless marked as over examples.",
      ""]


def _tables(config, results) -> list[str]:
  """The summary, floors, per-run and per-head sections."""
  e = config.experiment
  runs, summary = results["runs"], results["summary"]
  deep, ctrl = run_lib.depths(config)
  sd, sc = summary[f"L{deep}"], summary[f"L{ctrl}"]
  r0 = runs[f"L{deep}_seed{e.seeds[0]}"]
  diff = summary["loss_control_minus_deep"]
  corr = summary["rank_corr_zero_vs"]
  return [
      "## Summary (mean ± std over seeds [95% interval])",
      "",
      report_lib.md_table(
          ["model", "final loss", "accuracy", "loss at initialisation"],
          [[f"{d}-layer", _with_ci(x["final_loss"]),
            _with_ci(x["final_accuracy"]), _ms(x["init_loss"])]
           for d, x in ((deep, sd), (ctrl, sc))]),
      "",
      f"Control minus {deep}-layer final loss: "
      f"{report_lib.fmt(diff['diff'])}, 95% Welch interval "
      f"{report_lib.interval(diff['ci95'])}.",
      "",
      "## Scores beside their floors",
      "",
      "Each score of the trained model next to the same architecture at "
      "initialisation (same seed, before any step) and to uniform causal "
      "attention on the same sequences (every query spreads evenly over "
      "the keys it sees). The induction score leaves out the query itself "
      "(a token repeated immediately), so a current-token head gets no "
      "credit. Jensen-Shannon distances are in [0, 1] (0 = identical "
      "patterns).",
      "",
      report_lib.md_table(
          ["score", f"{deep}-layer trained", f"{deep}-layer at init",
           f"{ctrl}-layer trained", f"{ctrl}-layer at init",
           "uniform causal"], _floor_rows(sd, sc)),
      "",
      "## Per run",
      "",
      report_lib.md_table(
          ["layers", "seed", "loss", "acc", "steepest drop (steps: loss)",
           "best layer-0 prev-token", "best last-layer induction",
           f"heads with induction > {e.threshold}", "JS within layer"],
          _per_run_rows(config, runs)),
      "",
      f"## Every head ({deep}-layer, seed {e.seeds[0]})",
      "",
      "Scores on held-out data, with 95% bootstrap intervals over the "
      f"{e.analysis_examples} examples for the two circuit scores; Δloss is "
      "the loss increase when the head is removed (clean loss "
      f"{report_lib.fmt(r0['importance']['clean_loss'])}): set to zero, to "
      "its mean over the batch at each position, or to its output on "
      "another example. '-grad' is the first-order (Taylor) estimate of the "
      "zero-ablation Δloss from the batch d loss / d gate; 'Michel "
      "abs grad' is Michel et al.'s importance, the mean over examples of "
      "|d loss / d gate|. The last two rows are floors.",
      "",
      _head_table(r0),
      "",
      "Rank correlation (Spearman, over the "
      f"{r0['metrics']['induction'].size} heads, mean ± std over seeds) of "
      "zero-ablation Δloss with: "
      + ", ".join(f"{k.replace('_', ' ')} {_ms(corr[k], 2)}"
                  for k in run_lib.RANK_AGAINST_ZERO) + ".",
      ""]


def _figures_section(config) -> list[str]:
  """The explorer link and the figures."""
  deep, _ = run_lib.depths(config)
  return [
      "## Figures",
      "",
      f"Every head of the {deep}-layer model (seed "
      f"{config.experiment.seeds[0]}) in a browser, on the same held-out "
      "batch: [explorer.html](explorer.html) (one self-contained page; "
      "`python -m experiments.explore` makes one for any run).",
      "",
  ] + [f"![{f}]({f})" for f in FIGURES] + [""]


def _formed(x, floor_keys, summ, thr) -> bool:
  """A claim needs the score above the threshold AND above both floors."""
  low = x["ci95"][0] if x["ci95"] else x["mean"]
  return low > thr and all(low > summ[k]["mean"] for k in floor_keys)


def _induction_claim(sd, deep, thr) -> str:
  """Did induction heads form in the deep model?"""
  f2 = lambda x: _ms(x, 2)
  ind_floors = ("max_induction_last_layer_init", "uniform_induction")
  if _formed(sd["max_induction_last_layer"], ind_floors, sd, thr):
    return (
        f"* {deep}-layer model: induction heads form: the best last-layer "
        f"induction score {_with_ci(sd['max_induction_last_layer'], 2)} is "
        f"above {thr} and above its floors (at init "
        f"{f2(sd['max_induction_last_layer_init'])}, uniform "
        f"{f2(sd['uniform_induction'])}), next to a layer-0 "
        "previous-token head (best score "
        f"{f2(sd['max_prev_token_layer0'])}; at init "
        f"{f2(sd['max_prev_token_layer0_init'])}, uniform "
        f"{f2(sd['uniform_prev_token'])}). The loss falls in a sharp drop "
        "(per-run table), not gradually.")
  return (
      f"* {deep}-layer model: induction heads are NOT clearly established: "
      "the best last-layer induction score "
      f"{_with_ci(sd['max_induction_last_layer'], 2)} does not clear "
      f"{thr} and its floors (at init "
      f"{f2(sd['max_induction_last_layer_init'])}, uniform "
      f"{f2(sd['uniform_induction'])}) across seeds.")


def _control_claim(sd, sc, diff, ctrl, thr) -> str:
  """What the one-layer control reaches, against the deep model."""
  ind_floors = ("max_induction_last_layer_init", "uniform_induction")
  ok = _formed(sc["max_induction_last_layer"], ind_floors, sc, thr)
  return (
      f"* {ctrl}-layer control: final loss {_ms(sc['final_loss'], 2)} vs "
      f"{_ms(sd['final_loss'], 2)} (difference "
      f"{report_lib.fmt(diff['diff'], digits=2)}, 95% interval "
      f"{report_lib.interval(diff['ci95'], 2)}); best induction score "
      f"{_ms(sc['max_induction_last_layer'], 2)}"
      + (": as expected, one layer has no earlier head whose output (the "
         "previous token) a query could match against." if not ok else
         ": the control ALSO clears the induction floors here, which "
         "contradicts the expectation; see the per-run table."))


def _ablation_claim(summary, n_seeds: int) -> str:
  """Which heads ablation picks, and how well the proxies rank them."""
  corr = summary["rank_corr_zero_vs"]
  return (
      "* Ablation: in layer 0 the head whose removal costs the most loss is "
      "the best previous-token head in "
      f"{summary['top_ablation_is_prev_head_layer0']} of {n_seeds} seeds; "
      "in the last layer it is the best induction "
      f"head in {summary['top_ablation_is_induction_head_last']} of "
      f"{n_seeds} (per-head table: which kind of head it is instead)."
      " The batch-gradient Taylor estimate ranks heads with Spearman "
      f"{_ms(corr['taylor_estimate'], 2)} against the real ablation"
      + (": it does NOT predict ablation here. Gating a head is the same as "
         "scaling its rows of W^O, which training already brought to a "
         "stationary point, so d loss / d gate is ~0 for every head "
         "(column '-grad') even when removing the head is catastrophic."
         if corr["taylor_estimate"]["mean"] < 0.5 else
         ": a usable proxy here.")
      + " Michel et al.'s expected |gradient| gives Spearman "
      f"{_ms(corr['gradient_abs'], 2)}; resample ablation "
      f"{_ms(corr['resample_ablation'], 2)}.")


def _claims(config, summary) -> list[str]:
  """What this shows, next to the source's claim."""
  thr = config.experiment.threshold
  deep, ctrl = run_lib.depths(config)
  sd, sc = summary[f"L{deep}"], summary[f"L{ctrl}"]
  return [
      "## What this shows, next to the source's claim",
      "",
      "The source says different heads learn qualitatively different "
      "patterns that one head could not represent at once.",
      "",
      _induction_claim(sd, deep, thr),
      _control_claim(sd, sc, summary["loss_control_minus_deep"], ctrl, thr),
      "* Do heads differ? " + " ".join(
          _js_sentence(sd, pair, where) for pair, where in (
              ("within_layer", "Within a layer"),
              ("across_layer", "Across layers")) if f"js_{pair}" in sd)
      + " The per-head table shows which head does what.",
      _ablation_claim(summary, len(config.experiment.seeds)),
  ]


def _report(config, results) -> str:
  """report.md: intro, tables, figures, claims."""
  return "\n".join(_intro(config, results["summary"])
                   + _tables(config, results) + _figures_section(config)
                   + _claims(config, results["summary"]))
