"""Experiment 6, reporting: tables, figures and claims from the results.

`write` turns the results dict of `run.measure` into report.md (its
claims from `claims.lines`), its PNG figures and results.json. Shape
letters: L layers, H heads.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.circuits import claims
from experiments.circuits import figures as circuit_plots
from experiments.circuits import survey as survey_lib
from mha_jax.measure import report as report_lib


def _figures(workdir, runs, baselines, layout):
  label = {k: k.replace("seed", "seed ") for k in runs}
  rows = {label[k]: r for k, r in runs.items()}
  names = {"composition.png": lambda p: circuit_plots.composition(
               rows, baselines["composition"], path=p),
           "path_patching.png": lambda p: circuit_plots.path_patching(
               rows, path=p),
           "head_patching.png": lambda p: circuit_plots.head_patching(
               rows, path=p),
           "position_patching.png": lambda p: circuit_plots.position_patching(
               rows, layout, path=p),
           "copying_dla.png": lambda p: circuit_plots.copying_and_dla(
               rows, baselines["copying"]["copying"], path=p),
           "dynamics.png": lambda p: circuit_plots.dynamics(rows, path=p)}
  for name, draw in names.items():
    draw(str(workdir / name))
  return list(names)


_LABELS = {
    "eval_loss": "final eval loss (nats)",
    "prev_score": "previous-token score of the layer-0 previous-token head",
    "cur_score": "current-token score of the layer-0 current-token head",
    "induction_l1_mean": "mean induction score of the layer-1 heads",
    "prev_k_noise": "noise: prev-token head -> keys of all layer-1 heads",
    "prev_k_noise_best_single": "noise: prev-token head -> keys of the "
                                "single most affected layer-1 head",
    "prev_k_denoise": "denoise: prev-token head -> keys of all layer-1 heads",
    "cur_v_noise": "noise: current-token head -> values of all layer-1 heads",
    "cur_v_denoise": "denoise: current-token head -> values of all "
                     "layer-1 heads",
    "cur_k_noise": "noise: current-token head -> keys of all layer-1 heads",
    "q_noise_max": "noise: largest path into the layer-1 queries (any "
                   "layer-0 head)",
    "denoise_path_max": "denoise: largest path (any layer-0 head, any input)",
    "prev_k_comp": "K-composition, prev-token head (mean over layer-1 heads)",
    "cur_v_comp": "V-composition, current-token head (mean over layer-1 heads)",
    "prev_act_noise": "noise: the prev-token head's whole output",
    "cur_act_noise": "noise: the current-token head's whole output",
    "copying_l1_mean": "copying score, mean of the layer-1 heads",
    "copying_l0_mean": "copying score, mean of the layer-0 heads",
    "dla_l1_sum": "direct logit attribution, sum of the layer-1 heads",
    "dla_l0_sum": "direct logit attribution, sum of the layer-0 heads",
    "dla_total": "logit difference of the model (sum of all terms)",
    "pos_denoise_resid0": "denoise: one first-copy token (resid entering "
                          "layer 0), per position",
    "pos_denoise_resid1": "denoise: resid entering layer 1 at one "
                          "first-copy position",
    "pos_noise_resid0": "noise: one first-copy token, per position",
    "pos_outside_max": "largest absolute score of resid and layer-0 rows "
                       "outside the first copy",
    "loss_half_step": "step: loss half-way down",
    "prev_half_step": "step: prev-token head's score half-way up",
    "induction_half_step": "step: layer-1 mean induction score half-way up",
}
_STEPS = ("loss_half_step", "prev_half_step", "induction_half_step")


def _head(h, layer=0):
  """A head's name, `L0H2` (layers and heads from 0)."""
  return report_lib.head_name(layer, h)


# What each corruption (`corruption.KINDS`) replaces, which paths it can
# reveal and which it cannot (module docstring of `corruption`).
_KINDS = {
    "first_copy": ("the whole first copy",
                   "keys and values together: noising one of them, "
                   "denoising both jointly",
                   "the queries (untouched); keys apart from values"),
    "second_copy": ("the second copy (the queries)",
                    "paths into the queries",
                    "keys and values (intact)"),
    "key": ("first-copy tokens at even offsets (even predictions scored)",
            "paths into the keys (their previous-token information)",
            "values and queries (intact)"),
    "value": ("first-copy tokens at odd offsets (even predictions scored)",
              "paths into the values (the token copied)",
              "keys and queries (intact)"),
    "no_match": ("every earlier occurrence of a second-copy token",
                 "whether the model is wrong with confidence even with no "
                 "match to copy (a candidate run near chance)",
                 "keys apart from values (breaks both, as first_copy)"),
}


def _kind_rows(claims):
  ref = claims["reference"]
  return [[f"`{k}`", what, can, cannot,
           report_lib.summary(ref[k]["clean"], 2),
           report_lib.summary(ref[k]["corrupted"], 2)]
          for k, (what, can, cannot) in _KINDS.items() if k in ref]


def _claim_rows(claims):
  """One row per HEADLINES key: the fraction over seeds with its t
  interval, per seed with its bootstrap interval over examples, the raw
  patched metric, the floor and the detectable difference."""
  rows = []
  for key, kind, d, spec in survey_lib.HEADLINES:
    c = claims[key]
    per_seed = "; ".join(f"{v:.2f} {report_lib.interval(b, 2)}"
                         for v, b in zip(c["values"], c["bootstrap"]))
    floor = ("-" if c["floor"] is None
             else report_lib.summary(c["floor"], 2))
    det = "-" if c["detectable"] is None else f"{c['detectable']:.2f}"
    rows.append([key, f"`{kind}`", d, f"`{spec}`",
                 report_lib.summary(c, 3), per_seed,
                 report_lib.summary(c["metric"], 2),
                 report_lib.summary(c["vs_chance"], 2), floor, det])
  return rows


def _calibration_rows(cal):
  rows = []
  for name, c in cal.items():
    if not isinstance(c, dict) or "slope" not in c:
      continue
    d, layer = name.rsplit("_l", 1)
    rows.append([d, f"layer {layer}"] + [
        "n/a" if c[k] is None else report_lib.summary(c[k], 2)
        for k in ("slope", "pearson", "top_k")])
  return rows


def _summary_rows(summary, per_seed, baselines, ci95):
  comp, copy = baselines["composition"], baselines["copying"]["copying"]
  random = {"prev_k_comp": comp["k"], "cur_v_comp": comp["v"],
            "copying_l1_mean": copy, "copying_l0_mean": copy}
  rows = []
  for k in summary:
    digits = 0 if k in _STEPS else 3
    label = _LABELS[k]
    if k in random:
      label += f" (random: {report_lib.fmt(*random[k])})"
    rows.append([k, report_lib.fmt(*summary[k], digits=digits), label,
                 ", ".join(f"{v:.{digits}f}" for v in per_seed[k]),
                 report_lib.interval(ci95[k], digits)])
  return rows


def _model_row(s, r):
  """One seed's model: loss, accuracy, its role heads, the layer-1 scores."""
  d, sc = r["derived"], r["scores"]
  return [s, f"{d['eval_loss']:.3f}", f"{r['curve']['accuracy'][-1]:.3f}",
          f"{_head(d['prev_head'])} ({d['prev_score']:.2f})",
          f"{_head(d['cur_head'])} ({d['cur_score']:.2f})",
          ", ".join(f"{v:.2f}" for v in sc["induction"][-1]),
          r["same_as_experiment_1"]]


def _path_rows(runs, seeds):
  rows = []
  for s in seeds:
    r = runs[f"seed{s}"]
    sc, n, dn = r["scores"], r["heads"]["noise"], r["heads"]["denoise"]
    for h in range(sc["previous_token"].shape[1]):
      rows.append(
          [f"{s} {_head(h)}", f"{sc['previous_token'][0, h]:.2f}",
           f"{sc['current_token'][0, h]:.2f}"]
          + [f"{n['path'][f'{k}_all'][h]:.2f}" for k in "qkv"]
          + [f"{n['path']['logits'][h]:.2f}"]
          + [f"{dn['path'][f'{k}_all'][h]:.2f}" for k in "qkv"]
          + [f"{n['activation'][0, h]:.2f}", f"{dn['activation'][0, h]:.2f}"])
  return rows


def _composition_rows(runs, seeds, baselines):
  b = baselines["composition"]
  rows = [["random", "-"] + [report_lib.fmt(*b[k]) for k in "qkv"] + ["-"]]
  for s in seeds:
    r = runs[f"seed{s}"]
    c, cr = r["composition"], r["composition_rotary"]
    for h in range(c["q"].shape[0]):
      sc = r["scores"]
      rows.append([f"{s} {_head(h)}", f"{sc['previous_token'][0, h]:.2f} / "
                   f"{sc['current_token'][0, h]:.2f}"]
                  + [f"{np.mean(c[k][h]):.3f}" for k in "qkv"]
                  + [f"{np.mean(cr['k'][h]):.3f}"])
  return rows


def _attribution_rows(runs, seeds):
  rows = []
  for s in seeds:
    h = runs[f"seed{s}"]["heads"]
    n_l, n_h = h["noise"]["activation"].shape
    for l in range(n_l):
      for i in range(n_h):
        rows.append([f"{s} {_head(i, l)}"]
                    + [f"{h[d][k][l, i]:+.2f}" for d in ("denoise", "noise")
                       for k in ("activation", "attribution")])
  return rows


def _copying_rows(runs, seeds, baselines):
  b = baselines["copying"]
  rows = [["random", report_lib.fmt(*b["copying"]),
           report_lib.fmt(*b["positive_share"]), "-"]]
  for s in seeds:
    r = runs[f"seed{s}"]
    cp, dla = r["copying"], r["dla"]["heads"]
    for l in range(dla.shape[0]):
      for i in range(dla.shape[1]):
        rows.append([f"{s} {_head(i, l)}", f"{cp['copying'][l, i]:.2f}",
                     f"{cp['positive_share'][l, i]:.2f}",
                     f"{dla[l, i]:+.2f}"])
  return rows


def _dynamics_row(s, r):
  """One seed's training: the steepest drop and the landmark steps."""
  d, pc = r["derived"], r["phase_change"]
  return [s, f"{pc['from_step']}→{pc['to_step']}: "
          f"{pc['loss_before']:.2f}→{pc['loss_after']:.2f}",
          d["loss_half_step"], d["prev_half_step"], d["induction_half_step"],
          d["prev_formed_step"], d["induction_formed_step"]]


def _seed_rows(runs, seeds, row):
  """`row(seed, result)` of every seed, in the config's order."""
  return [row(s, runs[f"seed{s}"]) for s in seeds]


def _heads_over(values, threshold):
  """'L1H2 (0.84), L1H4 (0.35)' for the heads whose value passes."""
  hits = [f"{_head(h)} ({v:.2f})" for h, v in enumerate(values)
          if v >= threshold]
  return ", ".join(hits) if hits else "none"


def _circuit_lines(runs, seeds, matters):
  """One line per seed: which layer-0 heads feed which layer-1 input
  (noising)."""
  lines = []
  for s in seeds:
    r = runs[f"seed{s}"]
    d, p = r["derived"], r["heads"]["noise"]["path"]
    lines.append(
        f"* Seed {s}: keys read {_heads_over(p['k_all'], matters)}; values "
        f"read {_heads_over(p['v_all'], matters)}; queries read "
        f"{_heads_over(p['q_all'], matters)}. Previous-token head "
        f"{_head(d['prev_head'])} (score {d['prev_score']:.2f}), "
        f"current-token head {_head(d['cur_head'])} (score "
        f"{d['cur_score']:.2f}).")
  return lines


def _intro_lines(config, results):
  """The title, the models, the inputs and the metric."""
  e, c = config.experiment, config
  runs, matters = results["runs"], results["setup"]["matters"]
  seeds = list(e.seeds)
  return [
      "# Experiment 6: the induction circuit",
      "",
      f"Command: {report_lib.command('experiments.circuits')} "
      f"(config `configs/circuits.py`). Seeds {seeds}: experiment 1's "
      f"2-layer attention-only decoder ({c.model.num_heads} heads, d_model "
      f"{c.model.d_model}, {c.model.positions} positions, final LayerNorm) "
      f"trained {c.train.num_steps} steps with a checkpoint every "
      f"{c.train.checkpoint_every}. Checkpointing does not change a run, "
      "so these are experiment 1's models when its seeds are the same "
      "(column 'same as exp. 1').",
      "",
      f"**Inputs.** {e.analysis_examples} held-out clean sequences of the "
      "task (each with its own segment length and positions) and their "
      "corrupted twins: the same sequence with every token of the FIRST "
      "copy of the repeated segment replaced by another symbol. Both are "
      "uniform random symbols with the same layout (same token and position"
      " statistics); only the earlier occurrence an induction head looks "
      "up is gone, and the second copy, where the loss counts, is "
      f"unchanged. Per-position patching uses {e.position_examples} pairs "
      f"of one layout (a {e.segment}-token segment at {e.first}, repeated "
      f"at {e.second}).",
      "",
      "**Metric.** The mean log-probability of the correct next tokens of "
      "the second copy (minus the task's loss); clean "
      + ", ".join(f"{runs[f'seed{s}']['heads']['noise']['reference'][0]:.2f}"
                  for s in seeds)
      + " and corrupted "
      + ", ".join(f"{runs[f'seed{s}']['heads']['noise']['reference'][1]:.2f}"
                  for s in seeds)
      + " (per seed). A patch's score is the share of the clean-minus-"
      "corrupted difference it moves: **denoise** = clean activations "
      "patched into the corrupted run, (m - m_corrupt) / (m_clean - "
      "m_corrupt) (is it sufficient?); **noise** = corrupted activations "
      "patched into the clean run, (m_clean - m) / (m_clean - m_corrupt) "
      f"(is it necessary?). A path 'feeds' an input when its score is at "
      f"least {matters}.",
      "",
  ]


def _report(config, results, figures):
  """report.md: the tables of every seed, then the claims."""
  e = config.experiment
  runs, summary, baselines = (results["runs"], results["summary"],
                              results["baselines"])
  per_seed, matters = results["per_seed"], results["setup"]["matters"]
  seeds = list(e.seeds)
  md = report_lib.md_table
  lines = _intro_lines(config, results) + [
      "## Corruptions: which path each can see",
      "",
      "Each corruption replaces some tokens of the clean sequence by other "
      "symbols drawn uniformly (`mha_jax/interp/corruption.py`); the raw "
      "metric (mean log-prob of the scored targets, mean ± std [95% t "
      f"interval] over the {len(seeds)} seeds) of the clean and the "
      f"corrupted run; chance is {results['claims']['chance']:.2f} "
      "(uniform over the symbols). Fractions are shares of clean minus "
      "corrupted, so a corrupted run far below chance (confidently wrong) "
      "makes every fraction a share of a larger gap.",
      "",
      md(["corruption", "replaces", "can reveal", "cannot reveal",
          "clean metric", "corrupted metric"],
         _kind_rows(results["claims"])),
      "",
      "## The circuit's numbers, with intervals",
      "",
      "Each row: a set of paths (`joint_sets` in "
      "`experiments/circuits/survey.py`: `prev` / `cur` the seed's "
      "previous- and current-token head, `embed` the embedding, `all` "
      "every sender, `max` the strongest layer-0 head, `and:all_v` the "
      "previous-token head into the keys with every sender into the "
      "values), patched into the q, k or v of all layer-1 heads at once "
      "under one corruption. Fraction: mean ± std [95% t interval] over "
      f"seeds; per seed with a 95% bootstrap interval over its "
      f"{e.analysis_examples} examples ({e.bootstrap_resamples} "
      "resamples); the raw patched metric; 'vs chance', the same patch "
      "read against chance instead of the corrupted run (noise: (m_clean "
      "- m) / (m_clean - chance), the share of the above-chance log-prob "
      "lost, above 1 where the patch leaves the model below chance; "
      "denoise: (m - chance) / (m_clean - chance)); the floor, the same "
      "route from the best OTHER layer-0 head; the smallest difference "
      "these seeds detect with 80% power (`stats.detectable_difference`).",
      "",
      md(["key", "corruption", "way", "set", "fraction", "per seed "
          "[bootstrap]", "patched metric", "vs chance", "floor",
          "detectable"],
         _claim_rows(results["claims"])),
      "",
      "## Attribution patching calibrated against activation patching",
      "",
      "Per layer and direction, over the heads' z under every corruption "
      f"({len(_KINDS)} x {config.model.num_heads} points per seed): the "
      "least-squares slope of attribution on activation patching (1: "
      "sizes right), Pearson r, and top-1 agreement (the head with the "
      "largest |effect| is the same, per corruption). Over seeds: mean ± "
      "std [95% t interval]. The pooled r over both layers (the old "
      "statistic): denoise "
      f"{report_lib.summary(results['calibration']['denoise_pooled_r'], 2)}"
      ", noise "
      f"{report_lib.summary(results['calibration']['noise_pooled_r'], 2)}.",
      "",
      md(["way", "layer", "slope", "Pearson r", "top-1 agreement"],
         _calibration_rows(results["calibration"])),
      "",
      "## Summary (mean ± std over seeds)",
      "",
      "The first-copy corruption's numbers (the earlier analysis), each "
      "seed on its own pairs; last column: the 95% t interval.",
      "",
      md(["key", "mean ± std", "quantity", "per seed", "95% t interval"],
         _summary_rows(summary, per_seed, baselines,
                       results["summary_ci95"])),
      "",
      "## The models",
      "",
      md(["seed", "eval loss", "accuracy", "layer-0 previous-token head",
          "layer-0 current-token head", "layer-1 induction scores",
          "same as exp. 1"],
         _seed_rows(runs, seeds, _model_row)),
      "",
      "## Path patching: which layer-0 head feeds which layer-1 input",
      "",
      "Each layer-0 head's output change reaches only the q, k or v of all "
      "layer-1 heads at once (per receiver head: figure), or only the "
      "readout ('direct'); the last two columns patch the head's whole "
      "output `z`.",
      "",
      md(["seed, head", "prev-token", "current-token", "noise via q",
          "noise via k", "noise via v", "noise direct", "denoise via q",
          "denoise via k", "denoise via v", "noise z", "denoise z"],
         _path_rows(runs, seeds)),
      "",
  ] + _circuit_lines(runs, seeds, matters) + [
      "",
      "## Composition scores (mean over the layer-1 heads)",
      "",
      f"Frobenius-norm ratios (Elhage et al. 2021), against "
      f"{baselines['draws']} pairs of Gaussian heads of the same shapes "
      "(mean ± std). LayerNorm scales folded in, written outputs centred; "
      "rotary positions ignored, except in the last column (averaged over "
      "query-key offsets 1..T-1).",
      "",
      md(["seed, head", "prev / current score", "Q-comp", "K-comp", "V-comp",
          "K-comp, rotary"], _composition_rows(runs, seeds, baselines)),
      "",
      "## Activation vs attribution patching, per head",
      "",
      md(["seed, head", "activation denoise", "attribution denoise",
          "activation noise", "attribution noise"],
         _attribution_rows(runs, seeds)),
      "",
      "## Copying scores and direct logit attribution",
      "",
      "Copying score: sum(Re λ) / sum(|λ|) of the full OV circuit W_E W_V "
      "W_O W_U over the symbols (Olsson et al. 2022; 1 = copies), and the "
      "positive share sum(max(Re λ, 0)) / sum(|λ|). Direct logit "
      "attribution: the head's term read out through the final LayerNorm "
      "with its scale frozen from the clean run, as the correct token's "
      "logit minus the mean symbol logit, on the second copy.",
      "",
      md(["seed, head", "copying score", "positive share",
          "direct logit attribution"],
         _copying_rows(runs, seeds, baselines)),
      "",
      "## Training dynamics",
      "",
      f"Scores on the clean pairs at every checkpoint (step 0: the initial "
      f"weights); a score 'forms' when it passes {e.threshold}.",
      "",
      md(["seed", "steepest loss drop (steps: loss)", "loss half-way",
          "prev-token half-way", "induction half-way",
          f"prev-token > {e.threshold}", f"induction > {e.threshold}"],
         _seed_rows(runs, seeds, _dynamics_row)),
      "",
      "## Figures",
      "",
  ] + [f"![{f}]({f})" for f in figures] + [
      "",
      f"Every head of seed {seeds[0]}'s model in a browser, on the "
      f"{e.analysis_examples} clean sequences of the per-head patching, "
      "with each head's activation and attribution patching scores (both "
      "directions) beside its attention scores: "
      "[explorer.html](explorer.html).",
      "",
      "## What this shows",
      "",
  ] + claims.lines(config, runs, summary, baselines, matters,
                   results["claims"], results["calibration"])
  return "\n".join(lines)


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  figures = _figures(workdir, results["runs"], results["baselines"],
                     tuple(results["setup"]["layout"]))
  return report_lib.write_outputs(workdir, results,
                                  _report(config, results, figures),
                                  config=config)
