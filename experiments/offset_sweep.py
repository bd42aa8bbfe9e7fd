"""The two-offset sweep: one attention layer, several head counts, seeds.

Shape letters: B examples, H heads, T length.

The two-offset tasks (`tasks.two_offset_continuous_batch`,
`tasks.two_offset_token_batch`) ask one layer for the values at t-1 and
t-3 at once. `sweep` trains a config once per (setting, seed), a setting
being a head count at fixed d_model or a single-head control (a 4x wider
model, or an added MLP), and measures each model on a held-out batch
drawn for its training seed: its loss, how much weight each head puts on
offsets 1 and 3, whether two different heads own the two offsets, and its
eval-loss curve. `tuned_sweep` first picks each setting's learning rate
from a grid on a separate selection seed, then trains the reported seeds
at that rate, and checks that a run twice as long does not do better
(the plateau check). Two experiments run it, `experiments.two_offsets`
and `experiments.head_dim`, so it lives beside them rather than in
either; what both reports say about a sweep is `offset_sweep_report`'s
(and its template, offset_sweep_report.md.tmpl).
"""

from __future__ import annotations

import pathlib
import re

import jax
import numpy as np

from mha_jax.interp import explorer
from mha_jax.interp import head_metrics
from mha_jax.measure import curves
from mha_jax.measure import runs
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import saved_run
from mha_jax.training import train_state

# Every coordinate of the continuous task's targets is a coordinate of
# some u_s ~ N(0, 1) (positions t < 3 are not scored), so the population
# variance of the targets is exactly 1 and NMSE = MSE / 1.
TARGET_VARIANCE = 1.0


def settings(config, heads, controls: bool, *,
             label=lambda h: f"h={h}") -> list[tuple[str, dict]]:
  """`[(label(h), overrides)]`: each h in `heads` at the config's d_model.

  With `controls`, two single-head settings that get more capacity than
  h = 1 without a second softmax: a model `experiment.wide_factor` times
  wider (d_model and so the head width d_k; a head wider than d_model
  would be capped by the residual stream it reads and writes), and the
  h = 1 layer followed by an MLP of width 4 d_model (a non-linear read-out
  of what the head fetched).
  """
  out = [(label(h), {"model.num_heads": h, "model.head_dim": 0})
         for h in heads]
  if not controls:
    return out
  d = config.model.d_model
  wide = config.experiment.wide_factor * d
  out.append((f"h=1, d_model={wide} (d_k={wide})",
              {"model.num_heads": 1, "model.head_dim": 0,
               "model.d_model": wide}))
  out.append((f"h=1 + MLP (F={4 * d})",
              {"model.num_heads": 1, "model.head_dim": 0,
               "model.attention_only": False, "model.mlp_dim": 4 * d}))
  return out


@jax.jit
def _profile(w):
  return (head_metrics.offset_score(w, 1), head_metrics.offset_score(w, 3),
          head_metrics.entropy(w))


def offset_profile(weights) -> list[np.ndarray]:
  """`[offset1, offset3, entropy]`, each `[H]`, of a one-layer model.

  `weights` is `weights_of(...)["self"]`, `[1, B, H, T, T]`: the mean weight
  each head puts on the key 1 and 3 positions back, and its mean row
  entropy (nats).
  """
  return [np.asarray(x) for x in _profile(weights[0])]


def run_name(task, label, suffix):
  """The folder name of one sweep run, with a `{seed}` field to format."""
  return re.sub(r"[^A-Za-z0-9]+", "_", f"{task}_{label}_{suffix}") + "{seed}"


def run_folder(task: str, label: str, seed: int) -> str:
  """The folder of the reported (not selection or plateau) run of `label`
  on `task` with `seed`."""
  return run_name(task, label, "s").format(seed=seed)


def write_explorer(config, workdir, task: str, label: str, seed: int, *,
                   title: str) -> pathlib.Path:
  """explorer.html in `workdir` of one reported run, on the held-out batch
  its row of the NMSE table was measured on."""
  workdir = pathlib.Path(workdir)
  # The sweep keeps numbers, not models: load the run from its folder.
  state, run_config = saved_run.load_state(workdir
                                           / run_folder(task, label, seed))
  batch = held_out.analysis_batch(run_config,
                                  config.experiment.analysis_examples,
                                  seed=held_out.ANALYSIS_SEED + seed)
  return explorer.write_explorer(
      state.model(), batch, workdir / "explorer.html", loss=state.loss,
      init_model=train_state.create_train_state(run_config).model(),
      title=title)


def sweep(config, workdir, task: str, setting_list, *, seeds=None,
          reuse: bool = False, suffix: str = "s") -> dict:
  """Train every `(label, overrides)` x seed on `task`; measure each run.

  `seeds` defaults to `experiment.seeds`. Runs go to
  `workdir/<task>_<label>_<suffix><seed>`. Returns `results[label]`: one
  dict per seed with "seed", "learning_rate", the held-out "loss" (and
  "accuracy" for tokens) on `experiment.analysis_examples` sequences drawn
  for that seed (`held_out.ANALYSIS_SEED + seed`), "offset1", "offset3",
  "entropy" (`[H]` each), "split_heads" (two different heads each put
  more than half of their weight on one of the offsets),
  "weights_example" (`[H, T, T]`, the first held-out example, for
  figures), "curve" (`{"steps", "loss"}`: the training loop's eval loss)
  and, on the continuous task, "nmse" = loss / `TARGET_VARIANCE` with
  "target_variance_sample" (the held-out batch's own target variance).
  """
  e = config.experiment
  seeds = tuple(e.seeds if seeds is None else seeds)
  base = runs.variant(config, **{"task.name": task})
  continuous = task.endswith("continuous")
  batches = {s: held_out.analysis_batch(base, e.analysis_examples,
                                        held_out.ANALYSIS_SEED + s)
             for s in seeds}
  out = {}
  for label, overrides in setting_list:
    out[label] = []
    for r in runs.seed_runs(base, workdir, seeds,
                            run_name(task, label, suffix), reuse=reuse,
                            **overrides):
      batch = batches[r.seed]
      model = r.state.model()
      ev = held_out.eval_loss(model, batch, r.state.loss)
      weights = held_out.weights_of(model, batch)["self"]
      off1, off3, ent = offset_profile(weights)
      steps, losses = curves.read(r.run_dir, "eval", "loss")
      run = {"seed": r.seed, "learning_rate": r.config.train.learning_rate,
             **ev, "offset1": off1, "offset3": off3, "entropy": ent,
             "weights_example": weights[0, 0],
             "curve": {"steps": steps, "loss": losses}}
      if continuous:
        run["nmse"] = ev["loss"] / TARGET_VARIANCE
        mask = np.asarray(batch["loss_mask"], bool)
        run["target_variance_sample"] = float(
            np.var(np.asarray(batch["targets"])[mask]))
      run["split_heads"] = bool(
          off1.max() > 0.5 and off3.max() > 0.5
          and off1.argmax() != off3.argmax())
      out[label].append(run)
  return out


def tuned_sweep(config, workdir, task: str, setting_list, *,
                reuse: bool = False) -> dict:
  """`sweep` with a learning rate chosen per setting, and a plateau check.

  1. Selection: every setting at every rate of
     `experiment.learning_rates`, seed `experiment.selection_seed` (not one
     of the reported seeds); the rate with the lowest held-out loss wins.
     Skipped when there is one rate and no plateau check (smoke runs).
  2. The reported seeds (`experiment.seeds`) at the chosen rate.
  3. Plateau check (when `experiment.plateau_factor` > 1): the selection
     seed at the chosen rate trained `plateau_factor` times as many steps
     (the same schedule shape stretched), against the selection run.

  Returns `{"selection": {label: {"grid": {lr: loss}, "chosen": lr,
  "at_edge": bool}}, "runs": sweep results at the chosen rates,
  "plateau": {label: {"steps", "loss", "long_steps", "long_loss"}}}`.
  """
  e = config.experiment
  sel_seed = e.selection_seed
  if sel_seed in tuple(e.seeds):
    raise ValueError(f"tuned_sweep: experiment.selection_seed={sel_seed} is "
                     f"one of the reported seeds {tuple(e.seeds)}; choose "
                     "the rate on a seed that is not reported")
  lrs = sorted(e.learning_rates)
  factor = e.plateau_factor
  # One rate and no plateau run: nothing to choose or compare, no runs.
  select = len(lrs) > 1 or factor > 1
  selection, chosen_list, sel_runs = {}, [], {}
  for label, overrides in setting_list:
    grid = {}
    for lr in (lrs if select else ()):
      res = sweep(config, workdir, task,
                  [(label, {**overrides, "train.learning_rate": lr})],
                  seeds=(sel_seed,), reuse=reuse, suffix=f"lr{lr:g}_s")
      grid[lr] = res[label][0]["loss"]
      sel_runs[(label, lr)] = res[label][0]
    best = min(lrs, key=lambda lr: grid.get(lr, 0.0))
    selection[label] = {"grid": {f"{lr:g}": grid[lr] for lr in grid},
                        "chosen": best,
                        "at_edge": len(lrs) > 1 and best in (lrs[0], lrs[-1])}
    chosen_list.append((label, {**overrides, "train.learning_rate": best}))
  reported = sweep(config, workdir, task, chosen_list, reuse=reuse)
  plateau = {}
  if factor > 1:
    n = config.train.num_steps
    for label, overrides in chosen_list:
      long = sweep(config, workdir, task,
                   [(label, {**overrides, "train.num_steps": factor * n})],
                   seeds=(sel_seed,), reuse=reuse, suffix=f"x{factor}_s")
      short = sel_runs[(label, overrides["train.learning_rate"])]
      plateau[label] = {"seed": sel_seed, "steps": n, "loss": short["loss"],
                        "long_steps": factor * n,
                        "long_loss": long[label][0]["loss"],
                        "long_curve": long[label][0]["curve"]}
  return {"selection": selection, "runs": reported, "plateau": plateau}


def compare_settings(results: dict, key: str, reference: str) -> dict:
  """Every setting of a `sweep` minus `reference` on `key`.

  `{label: stats.difference(...) plus "detectable"}`: Welch's 95%
  interval of the difference of means over seeds, and the smallest true
  difference that many seeds per setting would detect with 80% power
  (from the pooled sample std; None with one seed).
  """
  ref = [r[key] for r in results[reference]]
  out = {}
  for label, rs in results.items():
    if label == reference:
      continue
    vals = [r[key] for r in rs]
    d = stats.difference(vals, ref)
    n = min(len(vals), len(ref))
    d["detectable"] = (stats.detectable_difference(float(np.sqrt(
        (np.var(vals, ddof=1) + np.var(ref, ddof=1)) / 2)), n)
                       if n >= 2 else None)
    out[label] = d
  return out


def head_summary(rs) -> dict:
  """`stats.summary` over the seeds of one setting's runs of the best
  head's weight on t-1 and on t-3 ("best_offset1", "best_offset3")."""
  return {f"best_offset{o}": stats.summary([np.max(r[f"offset{o}"])
                                            for r in rs]) for o in (1, 3)}


def setting_summary(rs) -> dict:
  """`stats.summary` over the seeds of one setting's continuous runs: the
  "nmse", and the best head's weights of `head_summary`."""
  return {"nmse": stats.summary([r["nmse"] for r in rs]), **head_summary(rs)}
