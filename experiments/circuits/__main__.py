r"""Experiment 6: the induction circuit, by patching, weights and training.

  python -m experiments.circuits --workdir=runs/circuits

Trains the 2-layer models of experiment 1 (`configs/circuits.py`: its
config, with a checkpoint at every evaluation), then measures each one on
held-out clean/corrupted pairs (the first copy of the repeated segment
resampled): activation, attribution and path patching, composition and
copying scores against random matrices, direct logit attribution, and the
heads' scores at every checkpoint. Writes report.md, results.json, PNG
figures and explorer.html (every head of the first seed's model, its
patching numbers beside its attention scores) into --workdir.
"""

from __future__ import annotations

import json
import pathlib

from absl import app
from absl import flags
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from mha_jax.measure import report as report_lib
from experiments.circuits import figures as circuit_plots
from mha_jax.interp import circuit_survey
from mha_jax.interp import composition
from mha_jax.interp import corruption
from mha_jax.measure import curves
from mha_jax.interp import explorer
from mha_jax.measure import runs as runs_lib
from mha_jax.training import tasks
from mha_jax.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/circuits.py", "The experiment's config file; "
    "override fields as --config.train.num_steps=...", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/circuits", "Output folder: report.md, results.json, "
    "PNGs and one sub-folder per training run.")
_REUSE_RUNS = flags.DEFINE_bool(
    "reuse_runs", False, "Load a finished run whose config.json matches "
    "instead of training it again (to redo only the analysis).")

# A path or patch "matters" when it moves at least this share of the
# clean-minus-corrupted metric (the report says which pass it).
MATTERS = 0.1


def _task(config, batch_size):
  t = ml_collections.ConfigDict(config.task.to_dict())
  t.batch_size = batch_size
  return t


def _baselines(config) -> dict:
  """Random-matrix chance levels (mean, sample std) and their draws."""
  e, m = config.experiment, config.model
  dh = m.head_dim or m.d_model // m.num_heads
  comp = composition.composition_baseline(e.data_seed, m.d_model, dh, dh,
                                          e.baseline_draws)
  copy = composition.copying_baseline(
      e.data_seed + 1, config.task.vocab_size - tasks.NUM_SPECIAL,
      m.d_model, dh, e.baseline_draws)
  stats = lambda x: [float(np.mean(x)), float(np.std(x, ddof=1))]
  return {"composition": {k: stats(v) for k, v in comp.items()},
          "copying": {k: stats(v) for k, v in copy.items()},
          "draws": e.baseline_draws}


def _same_as_experiment_1(config, seed, steps, losses):
  """Compares a run (its own `config`) with experiment 1's run of the same
  seed: "same" (same model, task and training apart from checkpointing,
  and the same eval curve), "DIFFERENT CURVE", "other config", or "not on
  disk"."""
  path = pathlib.Path(config.experiment.induction_workdir) / f"L2_seed{seed}"
  if not config.experiment.induction_workdir or not (
      path / "metrics.jsonl").exists():
    return "not on disk"
  strip = lambda c: {g: {k: v for k, v in c[g].items()
                         if k not in ("checkpoint_every", "max_checkpoints")}
                     for g in ("model", "task", "train")}
  theirs = json.loads((path / "config.json").read_text())
  if strip(theirs) != strip(json.loads(config.to_json_best_effort())):
    return "other config"
  return "same" if curves.read(path) == (steps, losses) else "DIFFERENT CURVE"


def _position_numbers(r, e) -> dict:
  """Per-position patching on the fixed layout, summarised: the mean score
  of one first-copy position of the residual stream entering layer 1 or
  2 (first copy without its first token: the positions whose token is a
  value the loss needs), and the largest |score| of the residual streams
  and layer-1 heads anywhere outside the first copy."""
  inner = slice(e.first + 1, e.first + e.segment)
  out = {}
  for d in ("denoise", "noise"):
    act = r["positions"][d]["activation"]
    for l in range(act["resid_pre"].shape[0]):
      out[f"pos_{d}_resid{l + 1}"] = float(np.mean(act["resid_pre"][l, inner]))
  outside = np.ones(r["positions"]["noise"]["activation"]["resid_pre"]
                    .shape[-1], bool)
  outside[e.first:e.first + e.segment] = False
  out["pos_outside_max"] = float(max(
      np.max(np.abs(r["positions"][d]["activation"][k][..., outside]))
      if k == "resid_pre" else
      np.max(np.abs(r["positions"][d]["activation"][k][0][..., outside]))
      for d in ("denoise", "noise") for k in ("resid_pre", "z")))
  return out


_SUMMARY_KEYS = (
    "eval_loss", "prev_score", "cur_score", "induction_l2_mean",
    "prev_k_noise", "prev_k_denoise", "prev_k_noise_best_single",
    "cur_v_noise", "cur_v_denoise", "cur_k_noise", "q_noise_max",
    "denoise_path_max", "prev_k_comp", "cur_v_comp", "prev_act_noise",
    "cur_act_noise", "copying_l2_mean", "copying_l1_mean", "dla_l2_sum",
    "dla_l1_sum", "dla_total", "pos_denoise_resid1", "pos_denoise_resid2",
    "pos_noise_resid1", "pos_outside_max", "loss_half_step",
    "prev_half_step", "induction_half_step")


def run(config, workdir, *, reuse_runs: bool = False) -> dict:
  """Train, measure and write the report; returns what results.json holds."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  tokens = np.arange(tasks.NUM_SPECIAL, config.task.vocab_size)
  key = jax.random.PRNGKey(e.data_seed)
  layout = (e.segment, e.first, e.second)
  # Jitted: one program each instead of every sampling op compiled alone.
  pairs = jax.jit(lambda k: corruption.induction_pairs(
      k, _task(config, e.analysis_examples)))(key)
  position_pairs = jax.jit(lambda k: corruption.induction_pairs(
      k, _task(config, e.position_examples), layout=layout))(
          jax.random.fold_in(key, 1))
  baselines = _baselines(config)
  runs = {}
  for r in runs_lib.seed_runs(config, workdir, e.seeds, "seed{seed}",
                              reuse=reuse_runs):
    if r.seed == e.seeds[0]:
      shown = r  # kept for the explorer page
    res = circuit_survey.survey(r.state.model(), pairs, position_pairs,
                                tokens=tokens)
    res["dynamics"] = circuit_survey.checkpoint_scores(r.run_dir, pairs)
    steps, losses = curves.read(r.run_dir)
    res["curve"] = {"steps": steps, "loss": losses,
                    "accuracy": curves.read(r.run_dir, key="accuracy")[1]}
    res["phase_change"] = curves.phase_change(steps, losses)
    res["same_as_experiment_1"] = _same_as_experiment_1(r.config, r.seed,
                                                        steps, losses)
    res["derived"] = dict(circuit_survey.summarise(res, e.threshold),
                          **_position_numbers(res, e))
    runs[f"seed{r.seed}"] = res
  summary = {k: report_lib.mean_std([r["derived"][k] for r in runs.values()])
             for k in _SUMMARY_KEYS}
  per_seed = {k: [r["derived"][k] for r in runs.values()]
              for k in _SUMMARY_KEYS}
  figures = _figures(workdir, runs, baselines, layout)
  report = _report(config, runs, summary, per_seed, baselines, figures)
  results = {"summary": summary, "per_seed": per_seed,
             "baselines": baselines, "runs": runs,
             "setup": {"layout": list(layout), "metric": "mean log-prob of "
                       "the targets in the second copy (minus the loss)",
                       "matters": MATTERS}}
  written = report_lib.write_outputs(workdir, results, report)
  # After results.json: the page reads the patching numbers from it, as
  # `experiments.explore` does for a seed's folder.
  _write_explorer(shown, workdir, pairs)
  return written


def _write_explorer(run, workdir, pairs):
  """explorer.html of `run` (a `runs_lib.SeedRun`) on the clean half of
  the per-head patching pairs, with each head's activation and
  attribution patching scores as columns of its table."""
  model = run.state.model()
  c = model.config
  circuits = explorer.circuit_numbers(run.run_dir, c.num_layers, c.num_heads)
  if circuits is not None:
    # The page is published beside its results.json: name that file, not
    # the folder it was read from.
    circuits = dict(circuits, source="results.json")
  clean = {k: pairs[k] for k in ("inputs", "targets", "loss_mask")}
  return explorer.write_explorer(
      model, clean, workdir / "explorer.html", loss=run.state.loss,
      init_model=train.create_train_state(run.config).model(),
      circuits=circuits,
      title=f"Induction circuit: {c.num_layers}-layer model, seed "
      f"{run.seed}")


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
  for k in _SUMMARY_KEYS:
    digits = 0 if k in _STEPS else 3
    label = _LABELS[k]
    if k in random:
      label += f" (random: {report_lib.fmt(*random[k])})"
    rows.append([k, report_lib.fmt(*summary[k], digits=digits), label,
                 ", ".join(f"{v:.{digits}f}" for v in per_seed[k])])
  return rows


def _model_rows(runs, seeds):
  rows = []
  for s in seeds:
    r = runs[f"seed{s}"]
    d, sc = r["derived"], r["scores"]
    rows.append([s, f"{d['eval_loss']:.3f}",
                 f"{r['curve']['accuracy'][-1]:.3f}",
                 f"{_head(d['prev_head'])} ({d['prev_score']:.2f})",
                 f"{_head(d['cur_head'])} ({d['cur_score']:.2f})",
                 ", ".join(f"{v:.2f}" for v in sc["induction"][-1]),
                 r["same_as_experiment_1"]])
  return rows


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


def _dynamics_rows(runs, seeds):
  rows = []
  for s in seeds:
    r = runs[f"seed{s}"]
    d, pc = r["derived"], r["phase_change"]
    rows.append([s, f"{pc['from_step']}→{pc['to_step']}: "
                 f"{pc['loss_before']:.2f}→{pc['loss_after']:.2f}",
                 d["loss_half_step"], d["prev_half_step"],
                 d["induction_half_step"], d["prev_formed_step"],
                 d["induction_formed_step"]])
  return rows


def _heads_over(values, threshold):
  """'L1H2 (0.84), L1H4 (0.35)' for the heads whose value passes."""
  hits = [f"{_head(h)} ({v:.2f})" for h, v in enumerate(values)
          if v >= threshold]
  return ", ".join(hits) if hits else "none"


def _circuit_lines(runs, seeds):
  """One line per seed: which L1 heads feed which L2 input (noising)."""
  lines = []
  for s in seeds:
    r = runs[f"seed{s}"]
    d, p = r["derived"], r["heads"]["noise"]["path"]
    lines.append(
        f"* Seed {s}: keys read {_heads_over(p['k_all'], MATTERS)}; values "
        f"read {_heads_over(p['v_all'], MATTERS)}; queries read "
        f"{_heads_over(p['q_all'], MATTERS)}. Previous-token head "
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


def _claims(config, runs, summary, baselines):
  """The report's conclusions, each worded from the numbers it quotes."""
  e = config.experiment
  seeds = list(e.seeds)
  n = len(seeds)
  ds = [runs[f"seed{s}"]["derived"] for s in seeds]
  paths = [runs[f"seed{s}"]["heads"]["noise"]["path"] for s in seeds]
  f2 = lambda k: report_lib.fmt(*summary[k], digits=2)
  f0 = lambda k: report_lib.fmt(*summary[k], digits=0)
  top = lambda k: max(d[k] for d in ds)
  comp, copy = baselines["composition"], baselines["copying"]["copying"]
  k_match = sum(d["k_feeder"] == d["prev_head"] for d in ds)
  v_match = sum(d["v_feeder"] == d["cur_head"] for d in ds)
  k_comp_match = sum(d["k_comp_top"] == d["k_feeder"] for d in ds)
  v_comp_match = sum(d["v_comp_top"] == d["v_feeder"] for d in ds)
  split_keys = [np.sum(np.asarray(p["k_all"]) >= MATTERS) >= 2 for p in paths]
  cur_reads = ["values" if d["cur_v_noise"] >= max(d["cur_k_noise"],
                                                   d["cur_q_noise"], MATTERS)
               else "keys" if d["cur_k_noise"] >= max(d["cur_q_noise"],
                                                      MATTERS)
               else "queries" if d["cur_q_noise"] >= MATTERS
               else f"nothing (all paths < {MATTERS})" for d in ds]
  aa = {k: report_lib.mean_std([d["activation_vs_attribution"][k]["pearson"]
                            for d in ds]) for k in ("denoise", "noise")}
  interval = config.train.eval_every
  together = sum(abs(d["induction_half_step"] - d["loss_half_step"])
                 <= interval and abs(d["prev_half_step"]
                                     - d["loss_half_step"]) <= interval
                 for d in ds)
  prev_first = sum(d["prev_half_step"] < d["induction_half_step"]
                   for d in ds)
  redundant = summary["prev_k_noise"][0] > summary[
      "prev_k_noise_best_single"][0] + MATTERS
  copies = summary["copying_l2_mean"][0] > copy[0] + 2 * copy[1]
  direct_l1 = abs(summary["dla_l1_sum"][0]) < 0.1 * abs(
      summary["dla_total"][0])
  and_circuit = (top("prev_k_denoise") < MATTERS
                 and summary["prev_k_noise"][0] >= 0.5)
  lines = [
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
         if top("q_noise_max") < MATTERS else
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


def _report(config, runs, summary, per_seed, baselines, figures):
  e, c = config.experiment, config
  seeds = list(e.seeds)
  md = report_lib.md_table
  lines = [
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
      f"least {MATTERS}.",
      "",
      "## Summary (mean ± std over seeds)",
      "",
      md(["key", "mean ± std", "quantity", "per seed"],
         _summary_rows(summary, per_seed, baselines)),
      "",
      "## The models",
      "",
      md(["seed", "eval loss", "accuracy", "L1 previous-token head",
          "L1 current-token head", "L2 induction scores", "same as exp. 1"],
         _model_rows(runs, seeds)),
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
  ] + _circuit_lines(runs, seeds) + [
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
         _dynamics_rows(runs, seeds)),
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
  ] + _claims(config, runs, summary, baselines)
  return "\n".join(lines)


def main(argv):
  report_lib.check_no_arguments(argv)
  run(_CONFIG.value, _WORKDIR.value, reuse_runs=_REUSE_RUNS.value)
  print(f"Report: {pathlib.Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
  app.run(main)
