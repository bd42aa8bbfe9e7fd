"""Experiment 6, reporting: tables, figures and claims from the results.

`write` turns the results dict of `run.measure` into report.md, its PNG
figures and results.json. Shape letters: L layers, H heads.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.circuits import figures as circuit_plots
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
    "prev_score": "previous-token score of the L1 previous-token head",
    "cur_score": "current-token score of the L1 current-token head",
    "induction_l2_mean": "mean induction score of the L2 heads",
    "prev_k_noise": "noise: prev-token head -> keys of all L2 heads",
    "prev_k_noise_best_single": "noise: prev-token head -> keys of the "
                                "single most affected L2 head",
    "prev_k_denoise": "denoise: prev-token head -> keys of all L2 heads",
    "cur_v_noise": "noise: current-token head -> values of all L2 heads",
    "cur_v_denoise": "denoise: current-token head -> values of all L2 heads",
    "cur_k_noise": "noise: current-token head -> keys of all L2 heads",
    "q_noise_max": "noise: largest path into the L2 queries (any L1 head)",
    "denoise_path_max": "denoise: largest path (any L1 head, any input)",
    "prev_k_comp": "K-composition, prev-token head (mean over L2 heads)",
    "cur_v_comp": "V-composition, current-token head (mean over L2 heads)",
    "prev_act_noise": "noise: the prev-token head's whole output",
    "cur_act_noise": "noise: the current-token head's whole output",
    "copying_l2_mean": "copying score, mean of the L2 heads",
    "copying_l1_mean": "copying score, mean of the L1 heads",
    "dla_l2_sum": "direct logit attribution, sum of the L2 heads",
    "dla_l1_sum": "direct logit attribution, sum of the L1 heads",
    "dla_total": "logit difference of the model (sum of all terms)",
    "pos_denoise_resid1": "denoise: one first-copy token (resid entering "
                          "layer 1), per position",
    "pos_denoise_resid2": "denoise: resid entering layer 2 at one "
                          "first-copy position",
    "pos_noise_resid1": "noise: one first-copy token, per position",
    "pos_outside_max": "largest absolute score of resid and layer-1 rows "
                       "outside the first copy",
    "loss_half_step": "step: loss half-way down",
    "prev_half_step": "step: prev-token head's score half-way up",
    "induction_half_step": "step: L2 mean induction score half-way up",
}
_STEPS = ("loss_half_step", "prev_half_step", "induction_half_step")


def _f(x, digits=2):
  return "n/a" if x is None else f"{x:.{digits}f}"


def _head(h, layer=1):
  return f"L{layer}H{h + 1}"


def _summary_rows(summary, per_seed, baselines):
  comp, copy = baselines["composition"], baselines["copying"]["copying"]
  random = {"prev_k_comp": comp["k"], "cur_v_comp": comp["v"],
            "copying_l2_mean": copy, "copying_l1_mean": copy}
  rows = []
  for k in summary:
    digits = 0 if k in _STEPS else 3
    label = _LABELS[k]
    if k in random:
      label += f" (random: {report_lib.fmt(*random[k])})"
    rows.append([k, report_lib.fmt(*summary[k], digits=digits), label,
                 ", ".join(f"{v:.{digits}f}" for v in per_seed[k])])
  return rows


def _model_row(s, r):
  """One seed's model: loss, accuracy, its role heads, the L2 scores."""
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
        rows.append([f"{s} {_head(i, l + 1)}"]
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
        rows.append([f"{s} {_head(i, l + 1)}", f"{cp['copying'][l, i]:.2f}",
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
  """One line per seed: which L1 heads feed which L2 input (noising)."""
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


def _versus(value, baseline):
  """'+12.3 random std above' style: how far `value` is from chance."""
  z = (value - baseline[0]) / baseline[1]
  side = "above" if z >= 0 else "below"
  return f"{abs(z):.1f} random std {side}"


def _seeds_where(seeds, flags):
  hits = [str(s) for s, f in zip(seeds, flags) if f]
  return ", ".join(hits) if hits else "none"


def _claim_basics(config, runs, summary):
  """What every claim quotes: the seeds, their number, each seed's derived
  numbers, a summary key as a 2-digit mean ± std (`f2`) and a derived
  key's largest value over the seeds (`top`)."""
  seeds = list(config.experiment.seeds)
  ds = [runs[f"seed{s}"]["derived"] for s in seeds]
  return (seeds, len(seeds), ds,
          lambda k: report_lib.fmt(*summary[k], digits=2),
          lambda k: max(d[k] for d in ds))


def _path_claims(config, runs, summary, baselines, matters):
  """Keys, values and queries: what path patching says feeds layer 2."""
  seeds, n, ds, f2, top = _claim_basics(config, runs, summary)
  paths = [runs[f"seed{s}"]["heads"]["noise"]["path"] for s in seeds]
  k_match = sum(d["k_feeder"] == d["prev_head"] for d in ds)
  v_match = sum(d["v_feeder"] == d["cur_head"] for d in ds)
  split_keys = [np.sum(np.asarray(p["k_all"]) >= matters) >= 2 for p in paths]
  cur_reads = ["values" if d["cur_v_noise"] >= max(d["cur_k_noise"],
                                                   d["cur_q_noise"], matters)
               else "keys" if d["cur_k_noise"] >= max(d["cur_q_noise"],
                                                      matters)
               else "queries" if d["cur_q_noise"] >= matters
               else f"nothing (all paths < {matters})" for d in ds]
  redundant = summary["prev_k_noise"][0] > summary[
      "prev_k_noise_best_single"][0] + matters
  and_circuit = (top("prev_k_denoise") < matters
                 and summary["prev_k_noise"][0] >= 0.5)
  return [
      f"* **Keys (K-composition).** The layer-1 head whose noised path into "
      f"the layer-2 keys costs most is the previous-token head in {k_match} "
      f"of {n} seeds. Cutting the previous-token head's path into the keys "
      f"of all layer-2 heads at once removes {f2('prev_k_noise')} of the "
      f"clean-minus-corrupted log-prob; into the single most affected head "
      f"{f2('prev_k_noise_best_single')}"
      + (": the layer-2 heads back each other up, so one receiver at a time "
         "understates the path." if redundant else ".")
      + f" Seeds where two or more layer-1 heads feed the keys (the "
      f"previous-token role split between heads): "
      f"{_seeds_where(seeds, split_keys)}.",
      f"* **Values: what the current-token head does.** The layer-2 heads "
      f"read the current-token head's output as "
      f"{'; '.join(f'{w} (seed {s})' for s, w in zip(seeds, cur_reads))}: "
      f"noising its path into all layer-2 values removes "
      f"{f2('cur_v_noise')}, into the keys {f2('cur_k_noise')}. The "
      f"layer-1 head whose path into the values costs most is the "
      f"current-token head in {v_match} of {n} seeds."
      + (" This goes beyond the textbook circuit, in which the induction "
         "head's value reads the token embedding directly: here the values "
         "also read a layer-1 current-token head (V-composition)."
         if "values" in cur_reads else ""),
      "* **Queries.** "
      + (f"No layer-1 head feeds the layer-2 queries: the largest noised "
         f"query path in any seed is {top('q_noise_max'):.2f} (the query "
         "reads the current token from the embedding directly)."
         if top("q_noise_max") < matters else
         f"Some layer-1 head feeds the queries: the largest noised query "
         f"path is {top('q_noise_max'):.2f} (per-seed lines above)."),
      f"* **Denoising vs noising.** Restoring the previous-token head's "
      f"clean path into the keys alone (denoising) restores "
      f"{f2('prev_k_denoise')} of the log-prob, where cutting it (noising) "
      f"removes {f2('prev_k_noise')}; the largest denoised single path in "
      f"any seed restores {top('denoise_path_max'):.2f}"
      + (". An AND: the corrupted first copy supplies both the keys' "
         "previous-token information and the tokens the induction heads "
         "copy, so restoring the keys alone finds the earlier occurrence "
         "but copies a wrong token, while cutting the key path alone "
         "removes much of the behaviour." if and_circuit else "."),
  ]


def _weight_claims(config, runs, summary, baselines, matters):
  """Weights, attribution patching, copying and direct effects."""
  seeds, n, ds, f2, top = _claim_basics(config, runs, summary)
  comp, copy = baselines["composition"], baselines["copying"]["copying"]
  k_comp_match = sum(d["k_comp_top"] == d["k_feeder"] for d in ds)
  v_comp_match = sum(d["v_comp_top"] == d["v_feeder"] for d in ds)
  aa = {k: report_lib.mean_std([d["activation_vs_attribution"][k]["pearson"]
                            for d in ds]) for k in ("denoise", "noise")}
  copies = summary["copying_l2_mean"][0] > copy[0] + 2 * copy[1]
  direct_l1 = abs(summary["dla_l1_sum"][0]) < 0.1 * abs(
      summary["dla_total"][0])
  return [
      f"* **Weights.** K-composition of the previous-token head with the "
      f"layer-2 heads {f2('prev_k_comp')} against random "
      f"{report_lib.fmt(*comp['k'])} "
      f"({_versus(summary['prev_k_comp'][0], comp['k'])}); V-composition "
      f"of the current-token head {f2('cur_v_comp')} against "
      f"{report_lib.fmt(*comp['v'])} "
      f"({_versus(summary['cur_v_comp'][0], comp['v'])}). The highest "
      f"K-composition picks the layer-1 head whose noised key path costs "
      f"most in {k_comp_match} of {n} seeds, the highest V-composition the "
      f"one whose value path costs most in {v_comp_match} of {n}. These "
      "scores ignore rotary positions and each LayerNorm's 1/sigma (last "
      "column of the composition table: the K-composition with the "
      "rotation averaged over offsets 1..T-1).",
      f"* **Attribution patching** (first order) against activation "
      f"patching over the heads: Pearson r "
      f"{report_lib.fmt(*aa['denoise'], digits=2)} when denoising, "
      f"{report_lib.fmt(*aa['noise'], digits=2)} when noising"
      + (". It misses what noising a layer-1 head does (per-head table): "
         "that change is not small, the induction heads' attention moves "
         "from one key to another, where a first-order estimate fails."
         if aa["noise"][0] < 0.8 else "."),
      f"* **Copying and direct effects.** The layer-2 heads' full OV "
      f"circuits {'copy' if copies else 'do NOT clearly copy'} (mean "
      f"copying score {f2('copying_l2_mean')}, random "
      f"{report_lib.fmt(*copy)}); the layer-1 heads' score "
      f"{f2('copying_l1_mean')}"
      + (" is below chance (read straight through to the logits, their OV "
         "circuits would lower the token they attend to)."
         if summary["copying_l1_mean"][0] < copy[0] - 2 * copy[1] else ".")
      + " Directly, the layer-2 heads add "
      f"{f2('dla_l2_sum')} to the correct token's logit difference of "
      f"{f2('dla_total')}, the layer-1 heads {f2('dla_l1_sum')}"
      + (": the layer-1 heads act through layer 2, not on the logits."
         if direct_l1 else "."),
  ]


def _claims(config, runs, summary, baselines, matters):
  """The report's conclusions, each worded from the numbers it quotes."""
  e = config.experiment
  seeds, n, ds, f2, top = _claim_basics(config, runs, summary)
  f0 = lambda k: report_lib.fmt(*summary[k], digits=0)
  interval = config.train.eval_every
  together = sum(abs(d["induction_half_step"] - d["loss_half_step"])
                 <= interval and abs(d["prev_half_step"]
                                     - d["loss_half_step"]) <= interval
                 for d in ds)
  prev_first = sum(d["prev_half_step"] < d["induction_half_step"]
                   for d in ds)
  args = (config, runs, summary, baselines, matters)
  lines = _path_claims(*args) + _weight_claims(*args) + [
      f"* **Positions** (one layout, {e.segment}-token segment: "
      f"{e.segment - 1} predictions). Restoring one first-copy token "
      f"restores {f2('pos_denoise_resid1')} per position (the mechanism "
      f"above predicts 0: a token helps only with its neighbour); restoring "
      f"the residual stream entering layer 2 at one first-copy position "
      f"restores {f2('pos_denoise_resid2')} (predicted 1/{e.segment - 1} = "
      f"{1 / (e.segment - 1):.2f}: that position's key and value, one "
      f"prediction); corrupting one token removes {f2('pos_noise_resid1')} "
      f"(predicted (2 x {e.segment} - 3)/{e.segment - 1}^2 = "
      f"{(2 * e.segment - 3) / (e.segment - 1) ** 2:.2f}: most tokens are "
      f"one key's previous token and another's value). Outside the first "
      f"copy no patch of the residual stream or a layer-1 head moves more "
      f"than {top('pos_outside_max'):.2f} in any seed.",
      f"* **Training dynamics.** In {together} of {n} seeds both the "
      f"previous-token head's score and the layer-2 mean induction score "
      f"are half-way up within one evaluation interval ({interval} steps) "
      f"of the loss being half-way down"
      + (": the heads form at the loss drop" if together == n else
         ": the heads do NOT form at the loss drop" if together == 0 else
         "")
      + f" (half-way steps, mean ± std: loss {f0('loss_half_step')}, "
      f"previous-token {f0('prev_half_step')}, induction "
      f"{f0('induction_half_step')}). The previous-token head is half-way "
      f"before the induction heads in {prev_first} of {n} seeds"
      + (": at this resolution the two form together, not one after the "
         "other." if prev_first == 0 else "."),
  ]
  return lines


def _intro_lines(config, results):
  """The title, the models, the inputs and the metric."""
  e, c = config.experiment, config
  runs, matters = results["runs"], results["setup"]["matters"]
  seeds = list(e.seeds)
  return [
      "# Experiment 6: the induction circuit",
      "",
      "Command: `python -m experiments.circuits --workdir=runs/circuits` "
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
      "## Summary (mean ± std over seeds)",
      "",
      md(["key", "mean ± std", "quantity", "per seed"],
         _summary_rows(summary, per_seed, baselines)),
      "",
      "## The models",
      "",
      md(["seed", "eval loss", "accuracy", "L1 previous-token head",
          "L1 current-token head", "L2 induction scores", "same as exp. 1"],
         _seed_rows(runs, seeds, _model_row)),
      "",
      "## Path patching: which layer-1 head feeds which layer-2 input",
      "",
      "Each layer-1 head's output change reaches only the q, k or v of all "
      "layer-2 heads at once (per receiver head: figure), or only the "
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
      "## Composition scores (mean over the layer-2 heads)",
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
  ] + _claims(config, runs, summary, baselines, matters)
  return "\n".join(lines)


def write(config, results, workdir) -> dict:
  """Figures, report.md and results.json in `workdir`; returns what
  results.json holds."""
  workdir = pathlib.Path(workdir)
  figures = _figures(workdir, results["runs"], results["baselines"],
                     tuple(results["setup"]["layout"]))
  return report_lib.write_outputs(workdir, results,
                                  _report(config, results, figures))
