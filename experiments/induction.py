r"""Experiment 1: do induction heads form, and does each head do its own job?

  python -m experiments.induction --workdir=runs/induction

Trains the 2-layer attention-only decoder of `configs/induction.py` and a
1-layer control over several seeds, then measures every head on held-out
sequences (previous-token and induction scores, entropy, Jensen-Shannon
distance between heads) and ablates each head. Writes report.md,
results.json and PNG figures into --workdir.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from experiments import common
from mha_jax import curves as curves_lib
from mha_jax import head_survey
from mha_jax import held_out
from mha_jax import interventions
from mha_jax import plots
from mha_jax import runs as runs_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/induction.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/induction", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train, measure and write the report; returns what results.json holds."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  depths = (config.model.num_layers, e.control_layers)
  batch = held_out.analysis_batch(config, e.analysis_examples)
  runs, curves = {}, {}
  for depth in depths:
    for r in runs_lib.seed_runs(config, workdir, e.seeds,
                                f"L{depth}_seed{{seed}}", reuse=reuse_runs,
                                **{"model.num_layers": depth}):
      name = r.run_dir.name
      steps, losses = curves_lib.read(r.run_dir)
      curves[f"{depth}-layer seed {r.seed}"] = (steps, losses)
      runs[name] = head_survey.survey(r.state.model(), batch, r.state.loss,
                                      ablate=depth == depths[0])
      runs[name]["phase_change"] = curves_lib.phase_change(steps, losses)
      runs[name]["curve"] = {"steps": steps, "loss": losses}

  deep, ctrl = depths
  thr = e.threshold
  summary = {}
  for depth in depths:
    rs = [runs[f"L{depth}_seed{s}"] for s in e.seeds]
    summary[f"L{depth}"] = {
        "final_loss": common.mean_std([r["eval"]["loss"] for r in rs]),
        "final_accuracy": common.mean_std([r["eval"]["accuracy"]
                                           for r in rs]),
        "max_prev_token_layer1": common.mean_std(
            [r["metrics"]["previous_token"][0].max() for r in rs]),
        "max_induction_last_layer": common.mean_std(
            [r["metrics"]["induction"][-1].max() for r in rs]),
        "js_mean_off_diagonal": common.mean_std(
            [r["js_mean_off_diagonal"] for r in rs]),
    }
  rank_corr = {k: [interventions.rank_correlation(
      runs[f"L{deep}_seed{s}"]["importance"]["zero_ablation"],
      runs[f"L{deep}_seed{s}"]["importance"][k]) for s in e.seeds]
               for k in ("taylor_estimate", "gradient_abs", "mean_ablation")}
  summary["rank_corr_zero_vs_taylor"] = common.mean_std(
      rank_corr["taylor_estimate"])
  summary["rank_corr_zero_vs_gradient_abs"] = common.mean_std(
      rank_corr["gradient_abs"])
  summary["rank_corr_zero_vs_mean_ablation"] = common.mean_std(
      rank_corr["mean_ablation"])
  # Is the head whose removal hurts most in layer 1 the previous-token head,
  # and in the last layer the induction head?
  match = []
  for s in e.seeds:
    r = runs[f"L{deep}_seed{s}"]
    zero = r["importance"]["zero_ablation"]
    match.append([int(zero[0].argmax() == r["metrics"]["previous_token"][0]
                      .argmax()),
                  int(zero[-1].argmax() == r["metrics"]["induction"][-1]
                      .argmax())])
  summary["top_ablation_is_prev_head_L1"] = int(sum(m[0] for m in match))
  summary["top_ablation_is_induction_head_last"] = int(sum(m[1] for m in match))

  figures = _figures(workdir, runs, curves, deep, e.seeds[0])
  report = _report(config, runs, summary, figures, deep, ctrl, thr)
  results = {"summary": summary, "runs": runs,
             "rank_corr_per_seed": rank_corr}
  return common.write_outputs(workdir, results, report,
                              drop=("weights_example",))


def _figures(workdir, runs, curves, deep, seed):
  r = runs[f"L{deep}_seed{seed}"]
  m = r["metrics"]
  titles = [[f"L{l + 1}H{h + 1} prev {m['previous_token'][l, h]:.2f} "
             f"ind {m['induction'][l, h]:.2f}"
             for h in range(m["induction"].shape[1])]
            for l in range(m["induction"].shape[0])]
  plots.loss_curves(curves, title="Held-out loss on the repeated segment",
                    path=str(workdir / "loss_curves.png"))
  tokens = [str(t) for t in np.asarray(r["tokens_example"])]
  plots.attention_grid(r["weights_example"], q_labels=tokens,
                       k_labels=tokens, head_titles=titles,
                       title=f"{deep}-layer model, seed {seed}: one "
                       "held-out sequence (rows: queries)",
                       path=str(workdir / "attention.png"), cell=2.6)
  plots.metric_bars({k: m[k] for k in ("previous_token", "induction",
                                       "duplicate_token", "entropy")},
                    title=f"Per-head scores ({deep}-layer, seed {seed})",
                    path=str(workdir / "head_metrics.png"))
  imp = r["importance"]
  plots.metric_bars({"zero ablation": imp["zero_ablation"],
                     "mean ablation": imp["mean_ablation"],
                     "-gradient (Taylor)": imp["taylor_estimate"],
                     "mean |per-example gradient|": imp["gradient_abs"]},
                    title="Loss increase when a head is removed",
                    path=str(workdir / "ablation.png"))
  return ["loss_curves.png", "attention.png", "head_metrics.png",
          "ablation.png"]


def _head_table(r, names):
  m, imp = r["metrics"], r["importance"]
  rows = []
  n_layers, n_heads = m["induction"].shape
  for l in range(n_layers):
    for h in range(n_heads):
      rows.append([f"L{l + 1} H{h + 1}"]
                  + [f"{m[k][l, h]:.2f}" for k in names]
                  + [f"{int(m['positional_offset'][l, h])} "
                     f"({m['positional_share'][l, h]:.2f})"]
                  + [f"{imp[k][l, h]:+.3f}" for k in
                     ("zero_ablation", "mean_ablation", "taylor_estimate")]
                  + [f"{imp['gradient_abs'][l, h]:.3f}"])
  return common.md_table(
      ["head"] + names + ["argmax offset (share)", "zero abl. Δloss",
                          "mean abl. Δloss", "-grad (Taylor)",
                          "mean abs per-example grad"], rows)


def _report(config, runs, summary, figures, deep, ctrl, thr):
  e = config.experiment
  seeds = list(e.seeds)
  sd, sc = summary[f"L{deep}"], summary[f"L{ctrl}"]
  per_seed = []
  for depth in (deep, ctrl):
    for s in seeds:
      r = runs[f"L{depth}_seed{s}"]
      m, pc = r["metrics"], r["phase_change"]
      prev_l1 = m["previous_token"][0]
      ind_last = m["induction"][-1]
      per_seed.append([
          depth, s, f"{r['eval']['loss']:.3f}", f"{r['eval']['accuracy']:.3f}",
          f"{pc['from_step']}→{pc['to_step']}: {pc['loss_before']:.2f}→"
          f"{pc['loss_after']:.2f}",
          f"H{int(prev_l1.argmax()) + 1} {prev_l1.max():.2f}",
          f"H{int(ind_last.argmax()) + 1} {ind_last.max():.2f}",
          int((ind_last > thr).sum()), f"{r['js_mean_off_diagonal']:.2f}"])
  r0 = runs[f"L{deep}_seed{seeds[0]}"]
  names = ["previous_token", "induction", "duplicate_token", "entropy",
           "mean_distance"]
  chance = np.log(config.task.vocab_size - 3)
  f2 = lambda ms: common.fmt(*ms, digits=2)
  deep_ok = sd["max_induction_last_layer"][0] > thr
  ctrl_ok = sc["max_induction_last_layer"][0] > thr
  lines = [
      "# Experiment 1: induction heads",
      "",
      "Command: `python -m experiments.induction --workdir=runs/induction` "
      f"(config `configs/induction.py`). Seeds {seeds}; {deep}-layer and "
      f"{ctrl}-layer attention-only decoders, d_model "
      f"{config.model.d_model}, {config.model.num_heads} heads, "
      f"{config.model.positions} positions, {config.train.num_steps} steps "
      f"of batch {config.task.batch_size}, sequences of "
      f"{config.task.seq_len} tokens from {config.task.vocab_size - 3} "
      f"symbols with one segment of {config.task.min_segment}-"
      f"{config.task.max_segment} tokens repeated at a random offset. Loss "
      f"counts only the predictable part of the repeat (chance: ln "
      f"{config.task.vocab_size - 3} = {chance:.2f}). Head metrics on "
      f"{e.analysis_examples} held-out sequences.",
      "",
      "## Summary (mean ± std over seeds)",
      "",
      common.md_table(
          ["model", "final loss", "accuracy", "best L1 prev-token score",
           "best last-layer induction score", "mean JS distance of heads"],
          [[f"{d}-layer", common.fmt(*x["final_loss"]),
            common.fmt(*x["final_accuracy"]),
            common.fmt(*x["max_prev_token_layer1"]),
            common.fmt(*x["max_induction_last_layer"]),
            common.fmt(*x["js_mean_off_diagonal"])]
           for d, x in ((deep, sd), (ctrl, sc))]),
      "",
      "## Per run",
      "",
      common.md_table(
          ["layers", "seed", "loss", "acc", "steepest drop (steps: loss)",
           "best L1 prev-token", "best last-layer induction",
           f"heads with induction > {thr}", "mean JS"], per_seed),
      "",
      f"## Every head ({deep}-layer, seed {seeds[0]})",
      "",
      "Scores on held-out data; Δloss is the loss increase when the head is "
      "removed (clean loss "
      f"{r0['importance']['clean_loss']:.3f}); '-grad' is the first-order "
      "estimate of the zero-ablation Δloss from d loss / d gate.",
      "",
      _head_table(r0, names),
      "",
      "Rank correlation (Spearman, over the "
      f"{r0['metrics']['induction'].size} heads, mean ± std over seeds) of "
      "zero-ablation Δloss with: mean ablation "
      f"{common.fmt(*summary['rank_corr_zero_vs_mean_ablation'], digits=2)}"
      ", the batch-gradient Taylor estimate "
      f"{common.fmt(*summary['rank_corr_zero_vs_taylor'], digits=2)}, the "
      "mean absolute per-example gradient "
      f"{common.fmt(*summary['rank_corr_zero_vs_gradient_abs'], digits=2)}"
      ".",
      "",
      "## Figures",
      "",
  ] + [f"![{f}]({f})" for f in figures] + [
      "",
      "## What this shows, next to the source's claim",
      "",
      "The source says different heads learn qualitatively different "
      "patterns that one head could not represent at once.",
      "",
      f"* {deep}-layer model: "
      + ("induction heads form (best last-layer induction score "
         f"{common.fmt(*sd['max_induction_last_layer'], digits=2)}) next to a "
         "layer-1 previous-token head (best score "
         f"{common.fmt(*sd['max_prev_token_layer1'], digits=2)}); the loss "
         "falls in a sharp drop (table above), not gradually."
         if deep_ok else
         "induction heads did NOT clearly form in this budget (best "
         f"induction score {f2(sd['max_induction_last_layer'])}"
         f" <= {thr})."),
      f"* {ctrl}-layer control: final loss "
      f"{common.fmt(*sc['final_loss'], digits=2)} vs "
      f"{common.fmt(*sd['final_loss'], digits=2)}; best induction score "
      f"{common.fmt(*sc['max_induction_last_layer'], digits=2)}"
      + (" — as expected: one layer has no earlier head whose output "
         "(the previous token) a query could match against." if not ctrl_ok
         else
         " — the control ALSO reaches a high induction score here, which "
         "contradicts the expectation; see the per-run table."),
      "* Heads differ: mean Jensen-Shannon distance between the heads of "
      f"the {deep}-layer model {f2(sd['js_mean_off_diagonal'])}"
      " (0 = identical patterns, 1 = disjoint); the per-head table shows "
      "which head does what.",
      "* Ablation: in layer 1 the head whose removal costs the most loss is "
      "the best previous-token head in "
      f"{summary['top_ablation_is_prev_head_L1']} of {len(seeds)} seeds; "
      "in the last layer it is the best induction "
      f"head in {summary['top_ablation_is_induction_head_last']} of "
      f"{len(seeds)} (per-head table: which kind of head it is instead)."
      " The batch-gradient Taylor estimate ranks heads with Spearman "
      f"{common.fmt(*summary['rank_corr_zero_vs_taylor'], digits=2)} against"
      " the real ablation"
      + (": it does NOT predict ablation here. Gating a head is the same as "
         "scaling its rows of W^O, which training already brought to a "
         "stationary point, so d loss / d gate is ~0 for every head "
         "(column '-grad') even when removing the head is catastrophic."
         if summary["rank_corr_zero_vs_taylor"][0] < 0.5 else
         ": a usable proxy here.")
      + " Averaging |gradient| per example instead gives Spearman "
      f"{common.fmt(*summary['rank_corr_zero_vs_gradient_abs'], digits=2)}.",
  ]
  return "\n".join(lines)


def main(argv):
  common.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
