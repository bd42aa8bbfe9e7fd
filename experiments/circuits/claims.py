"""Experiment 6's claims: each sentence worded from the numbers it quotes.

`lines` returns the bullets of the report's "What this shows" from the
per-seed results of `run.measure`, its summary (key -> (mean, sample
std)), the random baselines and the share of the metric that "matters".
"""

from __future__ import annotations

import numpy as np

from mha_jax.measure import report as report_lib


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
  """Keys, values and queries: what path patching says feeds layer 1."""
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
      f"* **Keys (K-composition).** The layer-0 head whose noised path into "
      f"the layer-1 keys costs most is the previous-token head in {k_match} "
      f"of {n} seeds. Cutting the previous-token head's path into the keys "
      f"of all layer-1 heads at once removes {f2('prev_k_noise')} of the "
      f"clean-minus-corrupted log-prob; into the single most affected head "
      f"{f2('prev_k_noise_best_single')}"
      + (": the layer-1 heads back each other up, so one receiver at a time "
         "understates the path." if redundant else ".")
      + f" Seeds where two or more layer-0 heads feed the keys (the "
      f"previous-token role split between heads): "
      f"{_seeds_where(seeds, split_keys)}.",
      f"* **Values: what the current-token head does.** The layer-1 heads "
      f"read the current-token head's output as "
      f"{'; '.join(f'{w} (seed {s})' for s, w in zip(seeds, cur_reads))}: "
      f"noising its path into all layer-1 values removes "
      f"{f2('cur_v_noise')}, into the keys {f2('cur_k_noise')}. The "
      f"layer-0 head whose path into the values costs most is the "
      f"current-token head in {v_match} of {n} seeds."
      + (" This goes beyond the textbook circuit, in which the induction "
         "head's value reads the token embedding directly: here the values "
         "also read a layer-0 current-token head (V-composition)."
         if "values" in cur_reads else ""),
      "* **Queries.** "
      + (f"No layer-0 head feeds the layer-1 queries: the largest noised "
         f"query path in any seed is {top('q_noise_max'):.2f} (the query "
         "reads the current token from the embedding directly)."
         if top("q_noise_max") < matters else
         f"Some layer-0 head feeds the queries: the largest noised query "
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
  copies = summary["copying_l1_mean"][0] > copy[0] + 2 * copy[1]
  direct_l1 = abs(summary["dla_l0_sum"][0]) < 0.1 * abs(
      summary["dla_total"][0])
  return [
      f"* **Weights.** K-composition of the previous-token head with the "
      f"layer-1 heads {f2('prev_k_comp')} against random "
      f"{report_lib.fmt(*comp['k'])} "
      f"({_versus(summary['prev_k_comp'][0], comp['k'])}); V-composition "
      f"of the current-token head {f2('cur_v_comp')} against "
      f"{report_lib.fmt(*comp['v'])} "
      f"({_versus(summary['cur_v_comp'][0], comp['v'])}). The highest "
      f"K-composition picks the layer-0 head whose noised key path costs "
      f"most in {k_comp_match} of {n} seeds, the highest V-composition the "
      f"one whose value path costs most in {v_comp_match} of {n}. These "
      "scores ignore rotary positions and each LayerNorm's 1/sigma (last "
      "column of the composition table: the K-composition with the "
      "rotation averaged over offsets 1..T-1).",
      f"* **Attribution patching** (first order) against activation "
      f"patching over the heads: Pearson r "
      f"{report_lib.fmt(*aa['denoise'], digits=2)} when denoising, "
      f"{report_lib.fmt(*aa['noise'], digits=2)} when noising"
      + (". It misses what noising a layer-0 head does (per-head table): "
         "that change is not small, the induction heads' attention moves "
         "from one key to another, where a first-order estimate fails."
         if aa["noise"][0] < 0.8 else "."),
      f"* **Copying and direct effects.** The layer-1 heads' full OV "
      f"circuits {'copy' if copies else 'do NOT clearly copy'} (mean "
      f"copying score {f2('copying_l1_mean')}, random "
      f"{report_lib.fmt(*copy)}); the layer-0 heads' score "
      f"{f2('copying_l0_mean')}"
      + (" is below chance (read straight through to the logits, their OV "
         "circuits would lower the token they attend to)."
         if summary["copying_l0_mean"][0] < copy[0] - 2 * copy[1] else ".")
      + " Directly, the layer-1 heads add "
      f"{f2('dla_l1_sum')} to the correct token's logit difference of "
      f"{f2('dla_total')}, the layer-0 heads {f2('dla_l0_sum')}"
      + (": the layer-0 heads act through layer 1, not on the logits."
         if direct_l1 else "."),
  ]


def lines(config, runs, summary, baselines, matters) -> list[str]:
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
      f"restores {f2('pos_denoise_resid0')} per position (the mechanism "
      f"above predicts 0: a token helps only with its neighbour); restoring "
      f"the residual stream entering layer 1 at one first-copy position "
      f"restores {f2('pos_denoise_resid1')} (predicted 1/{e.segment - 1} = "
      f"{1 / (e.segment - 1):.2f}: that position's key and value, one "
      f"prediction); corrupting one token removes {f2('pos_noise_resid0')} "
      f"(predicted (2 x {e.segment} - 3)/{e.segment - 1}^2 = "
      f"{(2 * e.segment - 3) / (e.segment - 1) ** 2:.2f}: most tokens are "
      f"one key's previous token and another's value). Outside the first "
      f"copy no patch of the residual stream or a layer-0 head moves more "
      f"than {top('pos_outside_max'):.2f} in any seed.",
      f"* **Training dynamics.** In {together} of {n} seeds both the "
      f"previous-token head's score and the layer-1 mean induction score "
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
