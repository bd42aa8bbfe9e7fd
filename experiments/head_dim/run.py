"""Experiment 3, measuring: the head-count sweep and the low-rank fit.

Shape letters: H heads, d_k head width.

`measure` runs part A (the two-offset layer for every h at d_k = d_model /
h, each at its own learning rate, with a plateau check:
`offset_sweep.tuned_sweep`), summarises it over seeds against the best
multi-head setting, fits part B (`low_rank.width_sweep`), writes
explorer.html of the narrowest heads, and returns the results dict.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from experiments import offset_sweep
from experiments.head_dim import low_rank
from mha_jax.measure import curves
from mha_jax.measure import stats

TASK = "two_offset_continuous"


def setting_label(config, h: int) -> str:
  """Part A's name of the setting with `h` heads (`config`: the
  ConfigDict, or the dict results.json holds)."""
  return f"h={h} (d_k={config['model']['d_model'] // h})"


def explorer_run(config) -> tuple[int, int]:
  """`(h, seed)` of the part A run the explorer page shows: the most
  heads, so the narrowest ones (the width the report asks about), first
  seed. `config`: the ConfigDict, or the dict results.json holds."""
  e = config["experiment"]
  return max(e["heads"]), e["seeds"][0]


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train part A, fit part B; returns the results dict ("part_a": runs
  per setting, "part_a_summary", "part_a_best", "part_a_vs_best", the
  sweep's selection and plateau, "part_b", "wall_seconds", ...)."""
  start = time.time()
  e = config.experiment
  if len(e.heads) < 2:
    raise ValueError("head_dim: experiment.heads needs two or more head "
                     f"counts to compare, got {tuple(e.heads)}")
  workdir = pathlib.Path(workdir)
  tuned = offset_sweep.tuned_sweep(
      config, workdir, TASK,
      offset_sweep.settings(config, e.heads, controls=False,
                            label=lambda h: setting_label(config, h)),
      reuse=reuse)
  cont = tuned["runs"]
  summary = {k: _setting_summary(rs, tuned["selection"][k]["chosen"],
                                 e.nmse_threshold)
             for k, rs in cont.items()}
  # Each setting against the best multi-head one (lowest mean NMSE).
  labels = list(cont)
  best = min(labels[1:] or labels, key=lambda k: summary[k]["nmse"]["mean"])
  vs_best = offset_sweep.compare_settings(cont, "nmse", best)
  fit = summarise_fit(low_rank.width_sweep(
      len(e.seeds), n=e.fit_n, d_model=e.fit_d_model, steps=e.fit_steps,
      lr=e.fit_lr, temperature=e.fit_temperature))
  h, seed = explorer_run(config)
  offset_sweep.write_explorer(
      config, workdir, TASK, setting_label(config, h), seed,
      title=f"Head width: one layer, {setting_label(config, h)}, "
      f"seed {seed}")
  return {"part_a": cont, "part_a_summary": summary,
          "part_a_best": best, "part_a_vs_best": vs_best,
          "part_a_selection": tuned["selection"],
          "part_a_plateau": tuned["plateau"],
          "part_a_target_variance": offset_sweep.TARGET_VARIANCE,
          "part_b": fit, "wall_seconds": time.time() - start,
          "reused_runs": reuse}


def _setting_summary(rs, learning_rate: float, threshold: float) -> dict:
  """One part A setting over seeds: NMSE and offsets, its chosen rate,
  and the first eval step whose NMSE is below `threshold`."""
  first = [curves.first_below(r["curve"]["steps"],
                              [x / offset_sweep.TARGET_VARIANCE
                               for x in r["curve"]["loss"]], threshold)
           for r in rs]
  return {**offset_sweep.setting_summary(rs),
          "learning_rate": learning_rate,
          "first_step_below_threshold": {
              "per_seed": first, "median": curves.median_step(first),
              "reached": sum(f is not None for f in first)}}


def summarise_fit(fit) -> dict:
  """Part B over its random targets, added to `low_rank.width_sweep`'s
  dict: per d_k the mean and sample std of the KL ("kl_mean", "kl_std";
  None for one target) and the mean largest weight error
  ("max_error_mean")."""
  kl = [stats.mean_std(v) for v in fit["kl"]]
  return {**fit, "kl_mean": [m for m, _ in kl], "kl_std": [s for _, s in kl],
          "max_error_mean": [float(np.mean(v)) for v in fit["max_error"]]}
