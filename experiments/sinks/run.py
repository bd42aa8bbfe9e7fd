"""Attention sinks, measuring: train every setting's seeds and survey them.

`measure` trains the settings of `configs/sinks.py` (BOS off/on x plain,
learned sinks, soft cap) over several seeds, measures every head on
held-out sequences with `experiments.sinks.survey.survey`, writes the
explorer page of one model and returns the results dict. Shape letters:
S seeds, L layers, H heads.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time

import numpy as np
from scipy import stats as sp_stats

from experiments.sinks import survey
from mha_jax.interp import explorer
from mha_jax.interp import interventions
from mha_jax.measure import curves as curves_lib
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import train_state

# Each variant's config overrides (the soft cap's value comes from the
# config: experiment.soft_cap).
_VARIANTS = ("plain", "sinks", "soft_cap")
# Beside each run's checkpoints: the wall seconds its training took.
TIMING_FILE = "train_time.json"
# Numbers compared between settings with Welch intervals.
COMPARED = ("key0_max", "key0_late_max", "parked_max", "parked_late_max",
            "loss", "ablation_mean", "ablation_min")



def settings(config) -> list[dict]:
  """name, variant, bos and config overrides of every setting."""
  e = config.experiment
  out = []
  for variant in e.variants:
    if variant not in _VARIANTS:
      raise ValueError(f"config.experiment.variants: unknown {variant!r}; "
                       f"expected some of {_VARIANTS}")
    for bos in e.bos:
      over = {"task.bos": bool(bos)}
      if variant == "sinks":
        over["model.attention_sinks"] = True
      elif variant == "soft_cap":
        over["model.logit_soft_cap"] = float(e.soft_cap)
      out.append({"name": variant + ("+BOS" if bos else ""),
                  "variant": variant, "bos": bool(bos), "overrides": over,
                  "dir": f"{variant}_{'bos' if bos else 'nobos'}"})
  return out



def _timed(it):
  """`(run, seconds)` of each run `it` yields, then `(None, seconds)`:
  the time each `next` took (training, or loading a reused run)."""
  while True:
    t0 = time.monotonic()
    r = next(it, None)
    yield r, time.monotonic() - t0
    if r is None:
      return


def _train_time(r, dt) -> tuple[float, bool]:
  """(seconds the run's training took, whether it was trained now)."""
  # A run trained now starts from an empty folder, so it has no timing
  # file yet; a reused run keeps the time it took when it was trained.
  timing_file = r.run_dir / TIMING_FILE
  trained_now = not timing_file.exists()
  if trained_now:
    timing_file.write_text(json.dumps({"train_s": dt}) + "\n")
  return json.loads(timing_file.read_text())["train_s"], trained_now


def _measure_run(config, r, workdir, name):
  """One run's `survey` with its "scalars"; writes explorer.html when the
  run is the one the config shows."""
  e = config.experiment
  batch = held_out.analysis_batch(
      r.config, e.analysis_examples, seed=held_out.ANALYSIS_SEED + r.seed)
  model = r.state.model()
  init_model = train_state.create_train_state(r.config).model()
  s = survey.survey(model, batch, r.state.loss, init_model=init_model,
                    cap=float(e.soft_cap))
  s["scalars"] = _scalars(s)
  # When the loss drop happened: the first evaluation below the level.
  steps, losses = curves_lib.read(r.run_dir)
  s["scalars"]["drop_step"] = curves_lib.first_below(steps, losses,
                                                     e.drop_level)
  if name == e.explorer and r.seed == e.seeds[0]:
    _write_explorer(model, init_model, batch, r, s, workdir, name)
  return s


def _write_explorer(model, init_model, batch, r, s, workdir, name):
  """explorer.html of one model, with its learned sink logits (if any)."""
  logits = s.get("sink_logits")
  info = [("setting", name), ("seed", str(r.seed))]
  if logits is not None:
    info.append(("sink logits (layer: heads)", "; ".join(
        f"L{l}: " + " ".join(f"{x:+.2f}" for x in row)
        for l, row in enumerate(logits))))
  explorer.write_explorer(
      model, batch, workdir / "explorer.html", loss=r.state.loss,
      init_model=init_model, info=info,
      title=f"Attention sinks: {name}, seed {r.seed}")


def _train_and_measure(config, workdir, reuse):
  """(runs {setting: {seed: survey}}, training seconds of this command,
  runs trained now, each run's training seconds)."""
  e = config.experiment
  runs, train_s, trained, run_train_s = {}, 0.0, 0, []
  for st in settings(config):
    runs[st["name"]] = per_seed = {}
    it = runs_lib.seed_runs(config, workdir, e.seeds, st["dir"] + "_seed{seed}",
                            reuse=reuse, **st["overrides"])
    for r, dt in _timed(it):
      train_s += dt
      if r is None:
        break
      seconds, now = _train_time(r, dt)
      trained += now
      run_train_s.append(seconds)
      per_seed[r.seed] = _measure_run(config, r, workdir, st["name"])
  return runs, train_s, trained, run_train_s


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train (or reuse) and measure every setting's seeds; returns the
  results dict ("summary", "comparisons", "pooled_rank_correlation",
  "rho_critical", "logit_range", "floors", "timing", "runs")."""
  start = time.monotonic()
  workdir = pathlib.Path(workdir)
  runs, train_s, trained, run_train_s = _train_and_measure(config, workdir,
                                                           reuse)
  summary = {name: _setting_summary(per_seed) for name, per_seed in
             runs.items()}
  comparisons = _comparisons(config, runs)
  pooled = {name: _pooled_rho(per_seed) for name, per_seed in runs.items()}
  first = next(iter(next(iter(runs.values())).values()))
  floors = {"uniform_key0_closed_form":
            survey.uniform_key0_share(config.task.seq_len),
            "uniform_key0_late": first["uniform"]["key0_late"],
            "chance_loss": float(np.log(config.task.vocab_size - 3))}
  wall = time.monotonic() - start
  timing = {"wall_s": wall, "train_s": train_s,
            "analysis_s": wall - train_s, "runs": len(run_train_s),
            "runs_trained_now": trained,
            "train_s_all_runs": float(sum(run_train_s)),
            "load_average": list(os.getloadavg()),
            "cpu_count": os.cpu_count()}
  return {"summary": summary, "comparisons": comparisons,
          "pooled_rank_correlation": pooled,
          "rho_critical": rho_critical_values(pooled),
          "logit_range": logit_range_means(runs), "floors": floors,
          "timing": timing,
          "runs": {n: {str(s): v for s, v in ps.items()}
                   for n, ps in runs.items()}}


def _scalars(s: dict) -> dict:
  """One model's headline numbers from its `survey` (name -> float).

  Over the model's L * H heads: the largest and the mean of each share
  ("_max", "_mean"; "_layer{l}_mean" per layer); the held-out loss; zero
  ablation's mean, smallest and largest loss increase; the Spearman
  correlation over heads of the key-0 and the parked share with the
  ablation effect (None where a share is the same for every head); the
  layer, ablation effect, its rank and the self / previous-token shares
  of the head with the largest late parked share ("top_parker_").
  "*_idle_last" / "*_task_last": last-layer heads' mean share on queries
  without / with an induction target, the key-0 ones also divided by
  uniform attention's on the same queries ("_vs_uniform"). "init_" and
  "uniform_" entries are floors of the same numbers.
  """
  sh, uni = s["shares"], s["uniform"]
  out = {"loss": s["eval"]["loss"]}
  for name in ("key0", "sink", "parked", "key1", "key0_late", "sink_late",
               "parked_late"):
    out[f"{name}_max"] = float(sh[name].max())
    out[f"{name}_mean"] = float(sh[name].mean())
  for l in range(sh["key0"].shape[0]):
    for name in ("key0", "sink", "key0_late", "sink_late"):
      out[f"{name}_layer{l}_mean"] = float(sh[name][l].mean())
  for name in ("key0_idle", "key0_task", "sink_idle", "sink_task"):
    out[f"{name}_last"] = float(sh[name][-1].mean())
  # Against uniform attention on the same queries (idle queries sit
  # earlier, where uniform attention gives key 0 more).
  def vs_uniform(x, name):  # None where the batch has no such query
    return x / uni[name] if uni[name] > 0 else None

  for name in ("key0_idle", "key0_task"):
    out[f"{name}_last_vs_uniform"] = vs_uniform(out[f"{name}_last"], name)
  idle, task = (out["key0_idle_last_vs_uniform"],
                out["key0_task_last_vs_uniform"])
  out["key0_idle_minus_task_last_vs_uniform"] = (
      None if idle is None or task is None else idle - task)
  out["parked_idle_last"] = out["key0_idle_last"] + out["sink_idle_last"]
  out["parked_task_last"] = out["key0_task_last"] + out["sink_task_last"]
  if "init" in s:
    init = s["init"]["shares"]
    out["init_loss"] = s["init"]["eval"]["loss"]
    for name in ("key0", "sink", "parked", "key0_late", "parked_late"):
      out[f"init_{name}_max"] = float(init[name].max())
      out[f"init_{name}_mean"] = float(init[name].mean())
    for name in ("key0_idle", "key0_task"):
      out[f"init_{name}_last"] = float(init[name][-1].mean())
      out[f"init_{name}_last_vs_uniform"] = vs_uniform(
          out[f"init_{name}_last"], name)
  for name in ("key0", "key1", "key0_late", "key0_idle", "key0_task"):
    out[f"uniform_{name}"] = uni[name]
  if s.get("ablation") is not None:
    abl = np.asarray(s["ablation"])
    out.update(ablation_mean=float(abl.mean()), ablation_min=float(abl.min()),
               ablation_max=float(abl.max()))
    for name in ("key0", "parked"):
      rho = interventions.rank_correlation(sh[name], abl)
      out[f"rho_{name}_ablation"] = None if np.isnan(rho) else rho
    # The head that parks most on late queries: its layer, its ablation
    # effect and that effect's rank among the heads (1 = largest).
    top = np.unravel_index(np.argmax(sh["parked_late"]), abl.shape)
    out["top_parker_layer"] = int(top[0]) + 1
    out["top_parker_ablation"] = float(abl[top])
    out["top_parker_ablation_rank"] = int((abl > abl[top]).sum()) + 1
    out["top_parker_self"] = float(sh["self"][top])
    out["top_parker_prev"] = float(sh["prev"][top])
  return out


def _setting_summary(per_seed) -> dict:
  """name -> `stats.summary` over seeds of every scalar (None values, a
  correlation with a constant share, are left out)."""
  keys = next(iter(per_seed.values()))["scalars"]
  out = {}
  for k in keys:
    vals = [s["scalars"][k] for s in per_seed.values()]
    if all(v is not None for v in vals):
      out[k] = stats.summary(vals)
  return out


def _comparisons(config, runs) -> dict:
  """Welch intervals: each rule against plain at the same BOS setting, and
  BOS against no BOS for each rule."""
  e = config.experiment
  pairs = []
  for bos in e.bos:
    suffix = "+BOS" if bos else ""
    for v in e.variants:
      if v != "plain" and "plain" in e.variants:
        pairs.append((v + suffix, "plain" + suffix))
  if len(e.bos) == 2:
    for v in e.variants:
      pairs.append((v + "+BOS", v))
  out = {}
  for a, b in pairs:
    out[f"{a} - {b}"] = {
        k: stats.difference(
            [s["scalars"][k] for s in runs[a].values()],
            [s["scalars"][k] for s in runs[b].values()]) for k in COMPARED}
  return out


def _pooled_rho(per_seed) -> dict:
  """Spearman of a share with zero ablation over every head of every seed
  of a setting ("all"), and within each layer ("layer0", ...): layers
  differ in both, so the pooled number can be a layer effect."""
  out = {}
  for name in ("key0", "parked"):
    x = np.stack([s["shares"][name] for s in per_seed.values()])  # [S, L, H]
    y = np.stack([np.asarray(s["ablation"]) for s in per_seed.values()])
    groups = {"all": (x.ravel(), y.ravel())}
    for l in range(x.shape[1]):
      groups[f"layer{l}"] = (x[:, l].ravel(), y[:, l].ravel())
    out[name] = {}
    for g, (a, b) in groups.items():
      rho = interventions.rank_correlation(a, b)
      out[name][g] = {"rho": None if np.isnan(rho) else rho,
                      "n_heads": int(a.size)}
  return out


def rho_critical(n: int, alpha: float = 0.05) -> float:
  """|Spearman| that n independent pairs with no relation exceed with
  probability alpha (two-sided, t approximation: r = t / sqrt(n - 2 +
  t^2), t on n - 2 degrees of freedom)."""
  t = float(sp_stats.t.ppf(1 - alpha / 2, n - 2))
  return t / math.sqrt(n - 2 + t * t)


def rho_critical_values(pooled) -> dict:
  """`rho_critical` for each number of heads a pooled correlation of
  `_pooled_rho` is over, smallest first (str(n) -> |rho|)."""
  ns = {p["n_heads"] for x in pooled.values() for g in x.values()
        for p in g.values()}
  return {str(n): rho_critical(n) for n in sorted(ns)}


def logit_range_means(runs) -> dict:
  """setting -> each `survey.logit_range` number per layer ([L]), the
  mean over the setting's seeds."""
  out = {}
  for name, per_seed in runs.items():
    lr = [s["logit_range"] for s in per_seed.values()]
    out[name] = {k: [float(np.mean([r[k][l] for r in lr]))
                     for l in range(len(v))] for k, v in lr[0].items()}
  return out
