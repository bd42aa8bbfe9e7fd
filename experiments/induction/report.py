"""Experiment 1, reporting: tables and claims from the results.

Shape letters: L layers, H heads per layer.

`write` turns what `run.measure` returned into report.md, results.json
and the PNG figures (drawn by figures.py); nothing here trains or runs a
model. The prose is report.md.tmpl beside this file; `render` fills it
from results.json alone, so a committed report regenerates from its
results.json.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from experiments.induction import figures
from mha_jax.measure import report as report_lib

# Per-example arrays kept for the figures only.
DROP = ("weights_example",)
# The scores of the per-head table, in its column order.
HEAD_SCORES = ["previous_token", "induction", "duplicate_token", "entropy",
               "mean_distance"]
ABLATIONS = ("zero_ablation", "mean_ablation", "resample_ablation",
             "taylor_estimate")
TEMPLATE = pathlib.Path(__file__).with_name("report.md.tmpl")


def write(config, results, workdir, command: str | None = None) -> dict:
  """Figures, report.md and results.json; returns what results.json holds."""
  workdir = pathlib.Path(workdir)
  figures.write(config, results["runs"], workdir)
  return report_lib.write_rendered(
      workdir, results, functools.partial(render, command=command), DROP,
      config=config)


def render(saved: dict, command: str | None = None) -> str:
  """report.md from results.json's contents (`saved`, config included),
  naming `command` (`report_lib.command_line`'s) as the command that ran."""
  return report_lib.fill(TEMPLATE, values(saved, command))


def _depths(config) -> tuple[int, int]:
  """`(deep, control)`: the layer counts of the model and its control."""
  return (config["model"]["num_layers"],
          config["experiment"]["control_layers"])


def _ms(x, digits=3):
  """`mean ± std` of a `stats.summary` record."""
  return report_lib.fmt(x["mean"], x["std"], digits)


def _with_ci(x, digits=3):
  """`mean ± std [95% t interval]` (`n/a`: one seed) of a summary."""
  return f"{_ms(x, digits)} {report_lib.interval(x['ci95'], digits)}"


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
    cell = report_lib.fmt(m[k][l][h], digits=2)
    if k in ci:
      cell += " " + report_lib.interval(ci[k][l][h], 2)
    cells.append(cell)
  return ([report_lib.head_name(l, h)] + cells
          + [f"{int(m['positional_offset'][l][h])} "
             f"({report_lib.fmt(m['positional_share'][l][h], digits=2)})"]
          + [report_lib.signed(imp[k][l][h]) for k in ABLATIONS]
          + [report_lib.fmt(imp["gradient_abs"][l][h])])


def _head_table(r) -> str:
  """Every head of one run, then the uniform and untrained floors."""
  n_layers, n_heads = np.shape(r["metrics"]["induction"])
  rows = [_head_row(r, l, h) for l in range(n_layers) for h in range(n_heads)]
  uniform, init = r["floors"]["uniform"], r["floors"]["init"]["metrics"]
  blank = ["-"] * 6
  rows.append(["uniform causal"]
              + [report_lib.fmt(uniform[k], digits=2) for k in HEAD_SCORES]
              + blank)
  rows.append(["init, best head"] + [report_lib.fmt(np.max(init[k]), digits=2)
                                     for k in HEAD_SCORES] + blank)
  return report_lib.md_table(
      ["head"] + HEAD_SCORES + ["argmax offset (share)", "zero abl. Δloss",
                                "mean abl. Δloss", "resample abl. Δloss",
                                "-grad (Taylor)", "Michel abs grad"], rows)


def _best(scores, layer: int) -> str:
  """`L0H1 0.73`: the best head of `layer` by `scores` [L, H]."""
  s = np.asarray(scores[layer])
  return (f"{report_lib.head_name(layer, s.argmax())} "
          f"{report_lib.fmt(s.max(), digits=2)}")


def _per_run_row(r, depth: int, seed: int, thr: float) -> list:
  """One (depth, seed): loss, steepest drop, best heads."""
  m, pc = r["metrics"], r["phase_change"]
  return [
      depth, seed, report_lib.fmt(r["eval"]["loss"]),
      report_lib.fmt(r["eval"]["accuracy"]),
      f"{pc['from_step']}→{pc['to_step']}: "
      f"{report_lib.fmt(pc['loss_before'], digits=2)}→"
      f"{report_lib.fmt(pc['loss_after'], digits=2)}",
      _best(m["previous_token"], 0), _best(m["induction"], depth - 1),
      int((np.asarray(m["induction"][-1]) > thr).sum()),
      report_lib.fmt(r["js_by_layer"]["within_layer"], digits=2)]


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


def _formed(summ, thr) -> bool:
  """Induction heads formed: the best last-layer induction score's lower
  interval end above the threshold AND above both its floors' means."""
  x = summ["max_induction_last_layer"]
  low = x["ci95"][0] if x["ci95"] else x["mean"]
  return low > thr and all(
      low > summ[k]["mean"]
      for k in ("max_induction_last_layer_init", "uniform_induction"))


def _induction_claim(sd, thr) -> str:
  """Did induction heads form in the deep model?"""
  f2 = lambda k: _ms(sd[k], 2)
  floors = (f"(at init {f2('max_induction_last_layer_init')}, uniform "
            f"{f2('uniform_induction')})")
  best = _with_ci(sd["max_induction_last_layer"], 2)
  if _formed(sd, thr):
    return (
        f"induction heads form: the best last-layer induction score {best} "
        f"is above {thr} and above its floors {floors}, next to a layer-0 "
        f"previous-token head (best score {f2('max_prev_token_layer0')}; at "
        f"init {f2('max_prev_token_layer0_init')}, uniform "
        f"{f2('uniform_prev_token')}). The loss falls in a sharp drop "
        "(per-run table), not gradually.")
  return ("induction heads are NOT clearly established: the best last-layer "
          f"induction score {best} does not clear {thr} and its floors "
          f"{floors} across seeds.")


def _control_claim(sc, thr) -> str:
  """What the control's induction score means."""
  if _formed(sc, thr):
    return ("the control ALSO clears the induction floors here, which "
            "contradicts the expectation; see the per-run table.")
  return ("as expected, one layer has no earlier head whose output (the "
          "previous token) a query could match against.")


def _taylor_claim(corr) -> str:
  """Whether the batch-gradient estimate predicts the real ablation."""
  if corr["mean"] < 0.5:
    return ("it does NOT predict ablation here. Gating a head is the same "
            "as scaling its rows of W^O, which training already brought to "
            "a stationary point, so d loss / d gate is ~0 for every head "
            "(column '-grad') even when removing the head is catastrophic.")
  return "a usable proxy here."


def _tables(config, runs, sd, sc) -> dict:
  """The summary, floors, per-run and per-head tables."""
  deep, ctrl = _depths(config)
  e = config["experiment"]
  return {
      "summary_table": report_lib.md_table(
          ["model", "final loss", "accuracy", "loss at initialisation"],
          [[f"{d}-layer", _with_ci(x["final_loss"]),
            _with_ci(x["final_accuracy"]), _ms(x["init_loss"])]
           for d, x in ((deep, sd), (ctrl, sc))]),
      "floors_table": report_lib.md_table(
          ["score", f"{deep}-layer trained", f"{deep}-layer at init",
           f"{ctrl}-layer trained", f"{ctrl}-layer at init",
           "uniform causal"], _floor_rows(sd, sc)),
      "per_run_table": report_lib.md_table(
          ["layers", "seed", "loss", "acc", "steepest drop (steps: loss)",
           "best layer-0 prev-token", "best last-layer induction",
           f"heads with induction > {e['threshold']}", "JS within layer"],
          [_per_run_row(runs[f"L{d}_seed{s}"], d, s, e["threshold"])
           for d in (deep, ctrl) for s in e["seeds"]]),
      "head_table": _head_table(runs[f"L{deep}_seed{e['seeds'][0]}"]),
  }


def values(saved: dict, command: str | None = None) -> dict:
  """The template's values, each written as the report shows it."""
  config, summary, runs = saved["config"], saved["summary"], saved["runs"]
  model, task, e = config["model"], config["task"], config["experiment"]
  deep, ctrl = _depths(config)
  sd, sc = summary[f"L{deep}"], summary[f"L{ctrl}"]
  r0 = runs[f"L{deep}_seed{e['seeds'][0]}"]
  gap, corr = summary["loss_control_minus_deep"], summary["rank_corr_zero_vs"]
  return {
      "command": report_lib.command("experiments.induction", command),
      "seeds": list(e["seeds"]), "deep": deep, "ctrl": ctrl,
      "d_model": model["d_model"], "num_heads": model["num_heads"],
      "positions": model["positions"],
      "num_steps": config["train"]["num_steps"],
      "batch_size": task["batch_size"], "seq_len": task["seq_len"],
      "symbols": task["vocab_size"] - 3, "min_segment": task["min_segment"],
      "max_segment": task["max_segment"],
      "chance_loss": report_lib.fmt(summary["chance_loss"], digits=2),
      "analysis_examples": e["analysis_examples"],
      **_tables(config, runs, sd, sc),
      "loss_gap": report_lib.fmt(gap["diff"]),
      "loss_gap_interval": report_lib.interval(gap["ci95"]),
      "first_seed": e["seeds"][0],
      "clean_loss": report_lib.fmt(r0["importance"]["clean_loss"]),
      "num_deep_heads": np.size(r0["metrics"]["induction"]),
      "rank_correlations": ", ".join(
          f"{k.replace('_', ' ')} {_ms(c, 2)}" for k, c in corr.items()),
      "induction_claim": _induction_claim(sd, e["threshold"]),
      "control_loss": _ms(sc["final_loss"], 2),
      "deep_loss": _ms(sd["final_loss"], 2),
      "loss_gap_2": report_lib.fmt(gap["diff"], digits=2),
      "loss_gap_interval_2": report_lib.interval(gap["ci95"], 2),
      "control_induction": _ms(sc["max_induction_last_layer"], 2),
      "control_claim": _control_claim(sc, e["threshold"]),
      "heads_differ": " ".join(
          _js_sentence(sd, pair, where) for pair, where in (
              ("within_layer", "Within a layer"),
              ("across_layer", "Across layers")) if f"js_{pair}" in sd),
      "num_seeds": len(e["seeds"]),
      "top_is_prev": summary["top_ablation_is_prev_head_layer0"],
      "top_is_induction": summary["top_ablation_is_induction_head_last"],
      "taylor_corr": _ms(corr["taylor_estimate"], 2),
      "taylor_claim": _taylor_claim(corr["taylor_estimate"]),
      "michel_corr": _ms(corr["gradient_abs"], 2),
      "resample_corr": _ms(corr["resample_ablation"], 2),
  }
