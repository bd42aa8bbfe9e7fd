"""Induction against the repeat distance, on sliding-window and global layers.

Shape letters: N inputs, L layers, H heads, G distances, D random draws.

A sliding layer of window W (Gemma 3: 512, itself and 511 back) sees the
token after an earlier copy only when that token is at most W - 1 back,
i.e. when the copy is at most W tokens back. Yet stacked sliding layers
could relay a copy further (layer 2 reads what layer 1 saw 511 back), so
the window alone does not say which layers copy past it. `measure` reads,
at each distance, every head's induction score on the second copy of
`inputs.at_distance` sequences, and the copy loss (the second copy's
next-token loss) with these sets of heads ablated, by zeros and by their
mean output over the inputs at that distance:

  global_induction  the top-k induction heads (by the survey) of the
                    global layers
  local_induction   the top-k of the sliding layers
  random_<i>        `draws` sets of k heads drawn from the heads in
                    neither set (the control for removing any k heads)
  global_layers     every head of every global layer (mean ablation
                    only): what is left is the sliding layers, so a copy
                    past the window that survives this was relayed

and beside them the `no_copy` loss: the same tokens in the first copy,
where nothing earlier repeats them (the loss of a model that cannot
copy at all).
"""

from __future__ import annotations

import numpy as np

from experiments.real_heads import causal
from experiments.real_heads import inputs
from experiments.real_heads import scores
from mha_jax.measure import stats


def layer_kinds(windows) -> np.ndarray:
  """`[L]` bool: True for a global layer (no window)."""
  return np.asarray([w is None for w in windows])


def head_sets(windows, num_heads: int, induction_means, k: int, *,
              seed: int, draws: int = 1) -> dict:
  """{"global_induction", "local_induction": the k heads of highest survey
  induction score `[L, H]` among the global / sliding layers, "random_<i>"
  for i < `draws`: k heads drawn with `seed` from the heads in neither
  set}."""
  is_global = layer_kinds(windows)
  if is_global.all() or not is_global.any():
    raise ValueError("head_sets: the model needs both sliding and global "
                     f"layers, got windows {list(windows)}")

  def top(sel):
    m = np.where(sel[:, None], np.asarray(induction_means), -np.inf)
    order = np.argsort(-m.ravel(), kind="stable")[:k]
    return [(int(i // num_heads), int(i % num_heads)) for i in order]
  out = {"global_induction": top(is_global), "local_induction":
         top(~is_global)}
  rand = causal.random_sets(len(windows), num_heads, k, draws, seed=seed,
                            exclude=out["global_induction"]
                            + out["local_induction"])
  return {**out, **{f"random_{i}": r for i, r in enumerate(rand)}}


def global_layer_heads(windows, num_heads: int) -> list:
  """Every (layer, head) of the global layers."""
  return [(int(l), h) for l in np.flatnonzero(layer_kinds(windows))
          for h in range(num_heads)]


def measure(model, info, e, induction_means) -> dict:
  """{"distances", "sets", "induction": `[G, N, L, H]`, "loss": {"none",
  "no_copy": `[G, N]`, "zero": {set: `[G, N]`}, "mean": {set: `[G,
  N]`}}} for the model described by `info` and config group `e`."""
  sets = head_sets(info["windows"], info["heads"], induction_means, e.top_k,
                   seed=e.seed, draws=e.distance_draws)
  layers = global_layer_heads(info["windows"], info["heads"])
  out = {"distances": list(e.distances), "sets": {**sets,
                                                  "global_layers": layers},
         "induction": [], "loss": {"none": [], "no_copy": [],
                                   "zero": {k: [] for k in sets},
                                   "mean": {k: [] for k in
                                            [*sets, "global_layers"]}}}
  for g, d in enumerate(e.distances):
    ids = inputs.at_distance(e.distance_inputs, d, e.segment, e.token_range,
                             info["bos"], seed=e.seed + 100 + g)
    t = ids.shape[1]
    rows = np.zeros(t, bool)
    rows[d + 1:] = True  # the second copy's queries
    second = np.arange(d + 1, t - 1)  # its predictable targets
    first = np.arange(1, e.segment)  # the same tokens, nothing to copy
    clean = scores.measure(model, ids, rows, chunk=e.distance_chunk,
                           local=0, positions=np.concatenate([first,
                                                              second]))
    out["induction"].append(clean["scores"]["induction"])
    nll = clean["nll"]
    out["loss"]["no_copy"].append(nll[:, :len(first)].mean(1))
    out["loss"]["none"].append(nll[:, len(first):].mean(1))
    repl = {"zero": scores.no_patch(model, t)[1], "mean": clean["mean_z"]}
    for a, by_set in out["loss"].items():
      if a in repl:
        for name, v in by_set.items():
          v.append(causal.loss(model, ids, second, out["sets"][name],
                               repl[a], chunk=e.distance_chunk))
  out["induction"] = np.asarray(out["induction"])
  out["loss"] = {k: ({s: np.asarray(x) for s, x in v.items()}
                     if isinstance(v, dict) else np.asarray(v))
                 for k, v in out["loss"].items()}
  return out


def _random(by_set: dict) -> np.ndarray:
  """`[G, N]`: each input's loss averaged over the random draws."""
  return np.mean([v for k, v in by_set.items() if k.startswith("random_")],
                 0)


def summarise(d: dict, windows, e) -> list[dict]:
  """Per distance: the sliding and the global layers' head of highest
  mean induction score; each loss (mean over inputs, bootstrap interval):
  "none", "no_copy", and per ablation ("zero", "mean") each set and
  "random" (each input's loss averaged over the draws); and per-input
  paired differences with their bootstrap intervals: each induction set
  minus random under each ablation, and the global layers mean-ablated
  minus "no_copy" (0: nothing is copied without them) and minus "none"
  (0: the sliding layers copy as well alone)."""
  is_global = layer_kinds(windows)
  boot = lambda v: stats.bootstrap_interval(v, resamples=e.resamples,
                                            seed=e.seed)
  cell = lambda v: {"mean": float(np.mean(v)), "ci": boot(v)}
  loss = d["loss"]
  out = []
  for g in range(len(d["distances"])):
    m = np.asarray(d["induction"][g]).mean(0)  # [L, H]
    row = {}
    for kind, sel in (("sliding", ~is_global), ("global", is_global)):
      masked = np.where(sel[:, None], m, -np.inf)
      lh = np.unravel_index(int(np.argmax(masked)), m.shape)
      row[f"best_{kind}"] = (int(lh[0]), int(lh[1]))
      row[f"best_{kind}_score"] = float(m[lh])
    row["loss"] = {k: cell(loss[k][g]) for k in ("none", "no_copy")}
    row["minus_random"] = {}
    for a in ("zero", "mean"):
      rand = _random(loss[a])[g]
      row["loss"][a] = {**{k: cell(v[g]) for k, v in loss[a].items()},
                        "random": cell(rand)}
      row["minus_random"][a] = {k: cell(loss[a][k][g] - rand) for k in
                                ("global_induction", "local_induction")}
    layers = loss["mean"]["global_layers"][g]
    row["global_layers_minus"] = {"no_copy": cell(layers
                                                  - loss["no_copy"][g]),
                                  "none": cell(layers - loss["none"][g])}
    out.append(row)
  return out
