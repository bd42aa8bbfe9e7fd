"""Experiment 2, measuring: the two-offset sweeps over head counts.

Shape letters: H heads.

`measure` runs the continuous sweep (each setting at its own learning rate,
with a plateau check: `offset_sweep.tuned_sweep`) and the token sweep at
the config's rate, summarises both over seeds, writes explorer.html of one
continuous run, and returns the results dict.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from experiments import offset_sweep
from mha_jax.measure import stats

CONTINUOUS = "two_offset_continuous"
TOKEN = "two_offset_token"


def explorer_run(config) -> tuple[int, int]:
  """`(h, seed)` of the continuous run the explorer page shows: the
  fewest heads above one (each head can own one offset), first seed.
  `config`: the ConfigDict, or the dict results.json holds."""
  heads, seeds = config["experiment"]["heads"], config["experiment"]["seeds"]
  return next((h for h in heads if h > 1), heads[0]), seeds[0]


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train both sweeps and measure every run; returns the results dict
  ("continuous", "token": per-setting runs; "summary"; the continuous
  sweep's "selection" and "plateau"; "wall_seconds", ...)."""
  start = time.time()
  e = config.experiment
  workdir = pathlib.Path(workdir)
  tuned = offset_sweep.tuned_sweep(
      config, workdir, CONTINUOUS,
      offset_sweep.settings(config, e.heads, controls=True), reuse=reuse)
  cont = tuned["runs"]
  tok = offset_sweep.sweep(
      config, workdir, TOKEN,
      [(label, {**o, "train.num_steps": e.token_num_steps})
       for label, o in offset_sweep.settings(config, e.token_heads,
                                            controls=False)],
      reuse=reuse)
  summary = summarise(cont, tok)
  h, seed = explorer_run(config)
  offset_sweep.write_explorer(
      config, workdir, CONTINUOUS, f"h={h}", seed,
      title=f"Two offsets, continuous task: one layer, h={h}, seed {seed}")
  return {"continuous": cont, "token": tok, "summary": summary,
          "selection": tuned["selection"], "plateau": tuned["plateau"],
          "target_variance": offset_sweep.TARGET_VARIANCE,
          "wall_seconds": time.time() - start, "reused_runs": reuse}


def summarise(cont, tok) -> dict:
  """Per setting over seeds, and every setting against h = 1."""
  return {
      "continuous": {k: {**offset_sweep.setting_summary(rs),
                         "split_heads": sum(r["split_heads"] for r in rs)}
                     for k, rs in cont.items()},
      "token": {k: _token_summary(rs) for k, rs in tok.items()},
      "continuous_vs_h1": offset_sweep.compare_settings(cont, "nmse", "h=1"),
      "token_loss_vs_h1": offset_sweep.compare_settings(tok, "loss", "h=1"),
      "token_accuracy_vs_h1": offset_sweep.compare_settings(tok, "accuracy",
                                                           "h=1"),
  }


def _token_summary(rs) -> dict:
  """One token setting over seeds: accuracy, loss, the best head's weight
  on t-1 and t-3, and the lowest head entropy (`stats.summary` each)."""
  return {"accuracy": stats.summary([r["accuracy"] for r in rs]),
          "loss": stats.summary([r["loss"] for r in rs]),
          **offset_sweep.head_summary(rs),
          "lowest_entropy": stats.summary([np.min(r["entropy"])
                                           for r in rs])}
