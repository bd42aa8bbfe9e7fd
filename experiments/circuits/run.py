"""Experiment 6, measuring: train the seeds, patch, score and track them.

`measure` trains the 2-layer models of `configs/circuits.py` (a checkpoint
at every evaluation), measures each on held-out clean/corrupted pairs with
`survey.survey` and at every checkpoint, and writes the explorer
page of the first seed's model. Shape letters: L layers, H heads.
"""

from __future__ import annotations

import json
import pathlib

import jax
import ml_collections
import numpy as np

from experiments import saved_patching
from experiments.circuits import survey
from mha_jax.interp import composition
from mha_jax.interp import corruption
from mha_jax.interp import explorer
from mha_jax.measure import curves
from mha_jax.measure import report as report_lib
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import tasks
from mha_jax.training import train_state

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
  of one first-copy position of the residual stream entering the first or
  layer 1 (first copy without its first token: the positions whose token is a
  value the loss needs), and the largest |score| of the residual streams
  and layer-0 heads anywhere outside the first copy."""
  inner = slice(e.first + 1, e.first + e.segment)
  out = {}
  for d in ("denoise", "noise"):
    act = r["positions"][d]["activation"]
    for l in range(act["resid_pre"].shape[0]):
      out[f"pos_{d}_resid{l}"] = float(np.mean(act["resid_pre"][l, inner]))
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
    "eval_loss", "prev_score", "cur_score", "induction_l1_mean",
    "prev_k_noise", "prev_k_denoise", "prev_k_noise_best_single",
    "cur_v_noise", "cur_v_denoise", "cur_k_noise", "q_noise_max",
    "denoise_path_max", "prev_k_comp", "cur_v_comp", "prev_act_noise",
    "cur_act_noise", "copying_l1_mean", "copying_l0_mean", "dla_l1_sum",
    "dla_l0_sum", "dla_total", "pos_denoise_resid0", "pos_denoise_resid1",
    "pos_noise_resid0", "pos_outside_max", "loss_half_step",
    "prev_half_step", "induction_half_step")



def _pairs(config, seed):
  """`{kind: pairs}` of every corruption on one batch of clean sequences,
  and the per-position pairs of one fixed layout: drawn for each training
  seed, so that an interval over seeds covers the evaluation draw too."""
  e = config.experiment
  key = jax.random.fold_in(jax.random.PRNGKey(e.data_seed), seed)
  layout = (e.segment, e.first, e.second)
  task = _task(config, e.analysis_examples)
  # Jitted: one program each instead of every sampling op compiled alone.
  kinds = jax.jit(lambda k: {kind: corruption.induction_pairs(k, task,
                                                              kind=kind)
                             for kind in corruption.KINDS})(key)
  position_pairs = jax.jit(lambda k: corruption.induction_pairs(
      k, _task(config, e.position_examples), layout=layout))(
          jax.random.fold_in(key, 1))
  return kinds, position_pairs


def _measure_run(r, config, kinds, position_pairs) -> dict:
  """Everything measured on one trained run (a `runs_lib.SeedRun`)."""
  e = config.experiment
  tokens = np.arange(tasks.NUM_SPECIAL, config.task.vocab_size)
  pairs = kinds["first_copy"]
  res = survey.survey(r.state.model(), pairs, position_pairs,
                      tokens=tokens, corrupted=kinds,
                      resamples=e.bootstrap_resamples)
  res["dynamics"] = survey.checkpoint_scores(r.run_dir, pairs)
  steps, losses = curves.read(r.run_dir)
  res["curve"] = {"steps": steps, "loss": losses,
                  "accuracy": curves.read(r.run_dir, key="accuracy")[1]}
  res["phase_change"] = curves.phase_change(steps, losses)
  res["same_as_experiment_1"] = _same_as_experiment_1(r.config, r.seed,
                                                      steps, losses)
  res["derived"] = dict(survey.summarise(res, e.threshold),
                        **_position_numbers(res, e))
  res["claims"] = survey.corruption_numbers(res)
  res["calibration"] = survey.attribution_calibration(res)
  return res


def _claim_summaries(runs, chance) -> dict:
  """Over seeds, per HEADLINES key: `stats.summary` of the per-seed
  values (t interval), of their floors, of the raw patched metric and
  of the same patch read against chance ("vs_chance"),
  each seed's bootstrap interval over examples, and the smallest
  difference these seeds would detect (80% power); per corruption the
  raw clean and corrupted metric beside `chance`."""
  rs = list(runs.values())
  out = {}
  for key, kind, d, _ in survey.HEADLINES:
    c = [r["claims"][key] for r in rs]
    s = stats.summary([x["value"] for x in c])
    clean = [r["claims"]["reference"][kind][0] for r in rs]
    # The same patch read against chance instead of the corrupted run:
    # the share of the clean run's above-chance log-prob lost (noising)
    # or present (denoising).
    vs_chance = [((m_c - x["metric"]) if d == "noise"
                  else (x["metric"] - chance)) / (m_c - chance)
                 for x, m_c in zip(c, clean)]
    floors = [x["floor"] for x in c]
    out[key] = dict(
        s, bootstrap=[x["interval"] for x in c],
        metric=stats.summary([x["metric"] for x in c]),
        vs_chance=stats.summary(vs_chance),
        floor=None if None in floors else stats.summary(floors),
        **({} if None in floors else _lead(c, rs, kind, chance)),
        sets=[x["set"] for x in c],
        detectable=(None if s["std"] is None else
                    stats.detectable_difference(s["std"], s["n"])))
  out["reference"] = {
      kind: {which: stats.summary([r["claims"]["reference"][kind][i]
                                   for r in rs])
             for i, which in enumerate(("clean", "corrupted"))}
      for kind in rs[0]["claims"]["reference"]}
  out["chance"] = chance
  return out


def _lead(c, rs, kind, chance) -> dict:
  """A role head against the best OTHER layer-0 head on the same route,
  paired within each seed: `stats.summary` of value - floor ("lead"), and
  of the same difference read against chance ("lead_vs_chance": times
  (m_clean - m_corrupt) / (m_clean - chance), which turns a share of the
  corrupted gap into a share of the above-chance log-prob). A role claim
  needs the lead's interval above 0: the floor's mean alone ignores that
  both vary with the seed."""
  lead = [x["value"] - x["floor"] for x in c]
  gaps = [(m_c - m_x) / (m_c - chance)
          for m_c, m_x in (r["claims"]["reference"][kind] for r in rs)]
  return {"lead": stats.summary(lead),
          "lead_vs_chance": stats.summary(np.multiply(lead, gaps))}


def _calibration_summaries(runs) -> dict:
  """Per `attribution_calibration` entry and number: `stats.summary` over
  the seeds (None where a seed has no value)."""
  rs = [r["calibration"] for r in runs.values()]
  out = {}
  for name, first in rs[0].items():
    if isinstance(first, dict):
      out[name] = {k: (None if any(r[name][k] is None for r in rs) else
                       stats.summary([r[name][k] for r in rs]))
                   for k in ("slope", "pearson", "top_k")}
      out[name]["k"] = first["k"]
    else:
      out[name] = stats.summary([r[name] for r in rs])
  return out


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train (or reuse) every seed, measure it, write explorer.html; returns
  the results dict ("summary", "per_seed", "baselines", "runs",
  "setup")."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  baselines = _baselines(config)
  runs = {}
  for r in runs_lib.seed_runs(config, workdir, e.seeds, "seed{seed}",
                              reuse=reuse):
    kinds, position_pairs = _pairs(config, r.seed)
    if r.seed == e.seeds[0]:
      shown, shown_pairs = r, kinds["first_copy"]  # for the explorer page
    runs[f"seed{r.seed}"] = _measure_run(r, config, kinds, position_pairs)
  summary = {k: report_lib.mean_std([r["derived"][k] for r in runs.values()])
             for k in _SUMMARY_KEYS}
  per_seed = {k: [r["derived"][k] for r in runs.values()]
              for k in _SUMMARY_KEYS}
  _write_explorer(shown, runs[f"seed{shown.seed}"], workdir, shown_pairs)
  chance = -float(np.log(config.task.vocab_size - tasks.NUM_SPECIAL))
  return {"summary": summary, "per_seed": per_seed,
          "summary_ci95": {k: stats.t_interval(v) for k, v in
                           per_seed.items()},
          "claims": _claim_summaries(runs, chance),
          "calibration": _calibration_summaries(runs),
          "baselines": baselines, "runs": runs,
          "setup": {"layout": [e.segment, e.first, e.second],
                    "metric": "mean log-prob of the targets in the second "
                    "copy (minus the loss)", "matters": MATTERS}}


def _write_explorer(run, result, workdir, pairs):
  """explorer.html of `run` (a `runs_lib.SeedRun`) on the clean half of
  the per-head patching pairs, with each head's activation and
  attribution patching scores (from its measured `result`) as columns of
  its table."""
  model = run.state.model()
  c = model.config
  cols = saved_patching.patching_columns(result, c.num_layers, c.num_heads)
  # The page is published beside its results.json: name that file.
  circuits = {"source": "results.json", "columns": cols} if cols else None
  clean = {k: pairs[k] for k in ("inputs", "targets", "loss_mask")}
  return explorer.write_explorer(
      model, clean, workdir / "explorer.html", loss=run.state.loss,
      init_model=train_state.create_train_state(run.config).model(),
      circuits=circuits,
      title=f"Induction circuit: {c.num_layers}-layer model, seed "
      f"{run.seed}")
