"""Experiment 1, measuring: train the deep model and its control, survey
every head.

Shape letters: L layers, H heads per layer.

`measure` trains `model.num_layers` and `experiment.control_layers` deep
models over `experiment.seeds`, surveys every head of each on a held-out
batch drawn per seed (scores beside their untrained and uniform floors,
and, for the deep model, the ablations), writes explorer.html of the first
deep model, and returns `{"summary", "runs"}`: the headline numbers over
seeds and every run's survey.
"""

from __future__ import annotations

import pathlib

import numpy as np

from mha_jax.interp import explorer
from mha_jax.interp import interventions
from mha_jax.interp import survey
from mha_jax.measure import curves as curves_lib
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import train_state

# Rankings compared with zero ablation (Spearman over heads, per seed).
RANK_AGAINST_ZERO = ("mean_ablation", "resample_ablation", "taylor_estimate",
                     "gradient_abs", "michel")


def depths(config) -> tuple[int, int]:
  """`(deep, control)`: the layer counts of the model and its control."""
  return config.model.num_layers, config.experiment.control_layers


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train every (depth, seed), survey its heads; `{"summary", "runs"}`.

  `runs["L<depth>_seed<seed>"]` is `survey.survey`'s record of that run
  plus its "phase_change" and eval-loss "curve" (`{"steps", "loss"}`).
  """
  e = config.experiment
  workdir = pathlib.Path(workdir)
  deep, _ = depths(config)
  runs = {}
  for depth in depths(config):
    for r in runs_lib.seed_runs(config, workdir, e.seeds,
                                f"L{depth}_seed{{seed}}", reuse=reuse,
                                **{"model.num_layers": depth}):
      # One held-out batch per seed, the same for both depths.
      batch = held_out.analysis_batch(
          config, e.analysis_examples, seed=held_out.ANALYSIS_SEED + r.seed)
      runs[r.run_dir.name] = _measure_run(r, batch, ablate=depth == deep)
      if depth == deep and r.seed == e.seeds[0]:
        # Every head of one trained model, explorable in a browser, on the
        # batch the tables use.
        explorer.write_explorer(
            r.state.model(), batch, workdir / "explorer.html",
            loss=r.state.loss, init_model=train_state.create_train_state(
                r.config).model(),
            title=f"Induction heads: {depth}-layer model, seed {r.seed}")
  return {"summary": summarise(config, runs), "runs": runs}


def _measure_run(r, batch, *, ablate: bool) -> dict:
  """One `runs_lib.SeedRun`'s survey, its steepest drop and its curve."""
  steps, losses = curves_lib.read(r.run_dir)
  out = survey.survey(
      r.state.model(), batch, r.state.loss, ablate=ablate,
      init_model=train_state.create_train_state(r.config).model())
  out["phase_change"] = curves_lib.phase_change(steps, losses)
  out["curve"] = {"steps": steps, "loss": losses}
  return out


def summarise(config, runs) -> dict:
  """The headline numbers over seeds (`stats.summary` records)."""
  e = config.experiment
  deep, ctrl = depths(config)
  summary = {f"L{d}": _depth_summary([runs[f"L{d}_seed{s}"] for s in e.seeds])
             for d in (deep, ctrl)}
  # The comparison the control exists for: Welch's interval over seeds.
  summary["loss_control_minus_deep"] = stats.difference(
      summary[f"L{ctrl}"]["final_loss"]["values"],
      summary[f"L{deep}"]["final_loss"]["values"])
  summary["chance_loss"] = float(np.log(config.task.vocab_size - 3))
  for d in (deep, ctrl):
    _add_js_minus_init(summary[f"L{d}"])
  deep_runs = [runs[f"L{deep}_seed{s}"] for s in e.seeds]
  summary["rank_corr_zero_vs"] = {
      k: stats.summary([interventions.rank_correlation(
          r["importance"]["zero_ablation"], r["importance"][k])
                        for r in deep_runs]) for k in RANK_AGAINST_ZERO}
  # Is the head whose removal hurts most in layer 1 the previous-token head,
  # and in the last layer the induction head?
  summary["top_ablation_is_prev_head_layer0"] = sum(
      _top_ablation_is(r, "previous_token", 0) for r in deep_runs)
  summary["top_ablation_is_induction_head_last"] = sum(
      _top_ablation_is(r, "induction", -1) for r in deep_runs)
  return summary


def _add_js_minus_init(x) -> None:
  """Do heads differ more after training than at initialisation? Paired by
  seed: the t interval of the per-seed differences, added to `x`."""
  for pair in ("within_layer", "across_layer"):
    if f"js_{pair}" in x:
      diff = np.subtract(x[f"js_{pair}"]["values"],
                         x[f"js_{pair}_init"]["values"])
      x[f"js_{pair}_minus_init"] = stats.summary(diff)


def _top_ablation_is(r, metric: str, layer: int) -> int:
  """1 if the head of `layer` whose zero ablation costs most is the head
  with the best `metric` score there, else 0."""
  zero = r["importance"]["zero_ablation"][layer]  # [H]
  return int(zero.argmax() == r["metrics"][metric][layer].argmax())


def _depth_summary(rs) -> dict:
  """Per-seed values, mean, sample std and t interval of each headline."""
  def best(r, key, layer):
    return float(r["metrics"][key][layer].max())

  def best_init(r, key, layer):
    return float(r["floors"]["init"]["metrics"][key][layer].max())

  out = {
      "final_loss": [r["eval"]["loss"] for r in rs],
      "final_accuracy": [r["eval"]["accuracy"] for r in rs],
      "init_loss": [r["floors"]["init"]["eval"]["loss"] for r in rs],
      "max_prev_token_layer0": [best(r, "previous_token", 0) for r in rs],
      "max_prev_token_layer0_init": [best_init(r, "previous_token", 0)
                                     for r in rs],
      "max_induction_last_layer": [best(r, "induction", -1) for r in rs],
      "max_induction_last_layer_init": [best_init(r, "induction", -1)
                                        for r in rs],
      "uniform_prev_token": [r["floors"]["uniform"]["previous_token"]
                             for r in rs],
      "uniform_induction": [r["floors"]["uniform"]["induction"] for r in rs],
      "js_within_layer": [r["js_by_layer"]["within_layer"] for r in rs],
      "js_within_layer_init": [
          r["floors"]["init"]["js_by_layer"]["within_layer"] for r in rs],
  }
  if rs[0]["js_by_layer"]["across_layer"] is not None:
    out["js_across_layer"] = [r["js_by_layer"]["across_layer"] for r in rs]
    out["js_across_layer_init"] = [
        r["floors"]["init"]["js_by_layer"]["across_layer"] for r in rs]
  return {k: stats.summary(v) for k, v in out.items()}
