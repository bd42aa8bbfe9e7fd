"""Induction against the repeat distance, on sliding-window and global layers.

Shape letters: N inputs, L layers, H heads, G distances.

A sliding layer of window W (Gemma 3: 512, itself and 511 back) sees the
token after an earlier copy only when that token is at most W - 1 back,
i.e. when the copy is at most W tokens back. `measure` reads every head's
induction score on the second copy of `inputs.at_distance` sequences at
each distance, and the copy loss with four sets of heads zeroed: none,
the top-k induction heads (by the survey) of the global layers, the
top-k of the sliding layers, and k heads drawn at random from all layers
(one draw, the control for removing any k heads).
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
              seed: int) -> dict:
  """{"global_induction", "local_induction": the k heads of highest survey
  induction score `[L, H]` among the global / sliding layers, "random": k
  heads drawn from all layers with `seed`}."""
  is_global = layer_kinds(windows)
  if is_global.all() or not is_global.any():
    raise ValueError("head_sets: the model needs both sliding and global "
                     f"layers, got windows {list(windows)}")

  def top(sel):
    m = np.where(sel[:, None], np.asarray(induction_means), -np.inf)
    order = np.argsort(-m.ravel(), kind="stable")[:k]
    return [(int(i // num_heads), int(i % num_heads)) for i in order]
  return {"global_induction": top(is_global), "local_induction":
          top(~is_global), "random": causal.random_sets(
              len(windows), num_heads, k, 1, seed=seed)[0]}


def measure(model, info, e, induction_means) -> dict:
  """{"distances", "sets", "induction": `[G, N, L, H]`, "loss": {set:
  `[G, N]`}} for the model described by `info` and config group `e`."""
  sets = head_sets(info["windows"], info["heads"], induction_means, e.top_k,
                   seed=e.seed)
  out = {"distances": list(e.distances), "sets": sets, "induction": [],
         "loss": {"none": [], **{k: [] for k in sets}}}
  for g, d in enumerate(e.distances):
    ids = inputs.at_distance(e.distance_inputs, d, e.segment, e.token_range,
                             info["bos"], seed=e.seed + 100 + g)
    t = ids.shape[1]
    rows = np.zeros(t, bool)
    rows[d + 1:] = True  # the second copy's queries
    positions = np.arange(d + 1, t - 1)  # its predictable targets
    clean = scores.measure(model, ids, rows, chunk=1, local=0,
                           positions=positions)
    out["induction"].append(clean["scores"]["induction"])
    out["loss"]["none"].append(clean["nll"].mean(1))
    zeros = scores.no_patch(model, t)[1]
    for name, heads in sets.items():
      out["loss"][name].append(causal.loss(model, ids, positions, heads,
                                           zeros, chunk=1))
  out["induction"] = np.asarray(out["induction"])
  out["loss"] = {k: np.asarray(v) for k, v in out["loss"].items()}
  return out


def summarise(d: dict, windows, e) -> list[dict]:
  """Per distance: the sliding and the global layers' head of highest
  mean induction score, and each head set's copy loss (mean over inputs,
  bootstrap interval)."""
  is_global = layer_kinds(windows)
  out = []
  for g in range(len(d["distances"])):
    m = np.asarray(d["induction"][g]).mean(0)  # [L, H]
    row = {}
    for kind, sel in (("sliding", ~is_global), ("global", is_global)):
      masked = np.where(sel[:, None], m, -np.inf)
      lh = np.unravel_index(int(np.argmax(masked)), m.shape)
      row[f"best_{kind}"] = (int(lh[0]), int(lh[1]))
      row[f"best_{kind}_score"] = float(m[lh])
    row["loss"] = {k: {"mean": float(np.mean(v[g])),
                       "ci": stats.bootstrap_interval(
                           v[g], resamples=e.resamples, seed=e.seed)}
                   for k, v in d["loss"].items()}
    out.append(row)
  return out
