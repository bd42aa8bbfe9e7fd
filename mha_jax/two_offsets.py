"""The two-offset sweep: one attention layer, several head counts, seeds.

Shape letters: B examples, H heads, T length.

The two-offset tasks (`tasks.two_offset_continuous_batch`,
`tasks.two_offset_token_batch`) ask one attention-only layer for the
values at t-1 and t-3 at once. `sweep` trains a config once per (setting,
seed), a setting being a head count at fixed d_model (or one wide head),
and measures each model on one held-out batch: its loss, how much weight
each head puts on offsets 1 and 3, and whether two different heads own
the two offsets. Experiments 2 (`experiments.two_offsets`) and 3
(`experiments.head_dim`) both report from it.
"""

from __future__ import annotations

import re

import jax
import numpy as np

from mha_jax import analysis
from mha_jax import held_out
from mha_jax import runs


def settings(config, heads, wide: bool) -> list[tuple[str, dict]]:
  """`[(label, overrides)]`: each h in `heads` at the config's d_model.

  With `wide`, one more setting: a single head of width
  `experiment.wide_factor * d_model` (does width buy a second position?).
  """
  out = [(f"h={h}", {"model.num_heads": h, "model.head_dim": 0})
         for h in heads]
  if not wide:
    return out
  width = config.experiment.wide_factor * config.model.d_model
  out.append((f"h=1 wide (d_k={width})",
              {"model.num_heads": 1, "model.head_dim": width}))
  return out


@jax.jit
def _profile(w):
  return (analysis.offset_score(w, 1), analysis.offset_score(w, 3),
          analysis.entropy(w))


def offset_profile(weights) -> list[np.ndarray]:
  """`[offset1, offset3, entropy]`, each `[H]`, of a one-layer model.

  `weights` is `weights_of(...)["self"]`, `[1, B, H, T, T]`: the mean weight
  each head puts on the key 1 and 3 positions back, and its mean row
  entropy (nats).
  """
  return [np.asarray(x) for x in _profile(weights[0])]


def sweep(config, workdir, task: str, setting_list, *, reuse: bool = False):
  """Train every `(label, overrides)` x `experiment.seeds` on `task`.

  Runs go to `workdir/<task>_<label>_s<seed>`. Returns `(results,
  target_variance)`: `results[label]` is one dict per seed with "seed",
  the held-out "loss" (and "accuracy" for tokens), "offset1", "offset3",
  "entropy" (`[H]` each), "split_heads" (two different heads each put more
  than half of their weight on one of the offsets), "weights_example"
  (`[H, T, T]`, the first held-out example, for figures) and, on the
  continuous task, "nmse" = loss / target_variance. `target_variance` is
  the variance of the held-out targets (None for tokens).
  """
  e = config.experiment
  base = runs.variant(config, **{"task.name": task})
  batch = held_out.analysis_batch(base, e.analysis_examples)
  mask = np.asarray(batch["loss_mask"], bool)
  target_var = (float(np.var(np.asarray(batch["targets"])[mask]))
                if task.endswith("continuous") else None)
  out = {}
  for label, overrides in setting_list:
    name = re.sub(r"[^A-Za-z0-9]+", "_", f"{task}_{label}_s") + "{seed}"
    out[label] = []
    for r in runs.seed_runs(base, workdir, e.seeds, name, reuse=reuse,
                            **overrides):
      model = r.state.model()
      ev = held_out.eval_loss(model, batch, r.state.loss)
      weights = held_out.weights_of(model, batch)["self"]
      off1, off3, ent = offset_profile(weights)
      run = {"seed": r.seed, **ev, "offset1": off1, "offset3": off3,
             "entropy": ent, "weights_example": weights[0, 0]}
      if target_var is not None:
        run["nmse"] = ev["loss"] / target_var
      run["split_heads"] = bool(
          off1.max() > 0.5 and off3.max() > 0.5
          and off1.argmax() != off3.argmax())
      out[label].append(run)
  return out, target_var
