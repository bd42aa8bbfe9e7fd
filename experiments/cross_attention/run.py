"""Experiment 4, measuring: train the encoder-decoder on reversal, score
every cross-attention head.

Shape letters: L layers, B examples, H heads, T decoder length, S source
length.

`measure` trains `experiment.seeds`, and on a held-out batch per seed
scores each cross-attention head by how often its argmax lands on the
aligned source token (len - 1 - t), beside two floors (uniform attention
over the source, the untrained model), and by ablation; it writes
explorer.html of the first seed and returns `{"summary", "runs"}`.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np

from mha_jax.interp import explorer
from mha_jax.interp import head_metrics
from mha_jax.interp import interventions
from mha_jax.measure import runs as runs_lib
from mha_jax.measure import stats
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import train_state

# Layers of cross-attention weights [L, B, H, T, S] -> scores [L, H].
_layer_scores = jax.jit(jax.vmap(head_metrics.alignment_scores,
                                 in_axes=(0, None, None)))


def _alignment(cross, target, valid):
  """`{"accuracy", "mass", "mass_within_1"}`, `[L, H]` each, as NumPy."""
  return dict(zip(("accuracy", "mass", "mass_within_1"),
                  (np.asarray(x) for x in _layer_scores(cross, target,
                                                        valid))))


def _uniform_over_source(src):
  """`[1, B, 1, T, S]`: every decoder step spreads over the real tokens."""
  real = (np.asarray(src) != tasks.PAD).astype(np.float32)  # [B, S]
  w = real / real.sum(-1, keepdims=True)
  return np.broadcast_to(w[None, :, None, None, :],
                         (1, src.shape[0], 1, src.shape[1], src.shape[1]))


def measure(config, workdir, *, reuse: bool = False) -> dict:
  """Train every seed and score its heads; `{"summary", "runs"}` with one
  record per seed in "runs" (see `_measure_run`)."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  runs = []
  for r in runs_lib.seed_runs(config, workdir, e.seeds, reuse=reuse):
    batch = held_out.analysis_batch(config, e.analysis_examples,
                                    seed=held_out.ANALYSIS_SEED + r.seed)
    model = r.state.model()
    init = train_state.create_train_state(r.config).model()
    if r.seed == e.seeds[0]:
      explorer.write_explorer(
          model, batch, workdir / "explorer.html", loss=r.state.loss,
          init_model=init, title=f"Cross-attention on reversal, seed {r.seed}")
    runs.append(_measure_run(r, model, init, batch))
  return {"summary": summary(runs), "runs": runs}


def _measure_run(r, model, init, batch) -> dict:
  """One seed: eval loss, alignment scores `[L, H]` with their floors,
  head importance, and the first example's cross-attention `[L, H, T, S]`
  and tokens (for figures)."""
  target, valid = head_metrics.aligned_source(batch["inputs"], tasks.PAD)
  cross = held_out.weights_of(model, batch)["cross"]  # [L, B, H, T, S]
  align = _alignment(cross, target, valid)
  return {
      "seed": r.seed, **held_out.eval_loss(model, batch, r.state.loss),
      **{f"alignment_{k}": v for k, v in align.items()},
      "floors": {
          "uniform": {k: float(v[0, 0]) for k, v in _alignment(
              _uniform_over_source(batch["inputs"]), target,
              valid).items()},
          "init": _alignment(held_out.weights_of(init, batch)["cross"],
                             target, valid)},
      "importance": interventions.head_importance(
          model, batch, r.state.loss, mask_arg="cross_head_mask"),
      "cross_example": cross[:, 0],
      "source_example": np.asarray(batch["inputs"][0]),
      "decoder_example": np.asarray(batch["decoder_inputs"][0]),
      "source_length_example": int(valid[0].sum())}


def summary(runs) -> dict:
  """The report's headline numbers over seeds (`stats.summary` records)."""
  def best_head(r):
    return int(np.argmax(r["alignment_accuracy"]))
  per_seed = {
      "token_accuracy": [r["accuracy"] for r in runs],
      "last_layer_alignment": [r["alignment_accuracy"][-1].mean()
                               for r in runs],
      "first_layer_alignment": [r["alignment_accuracy"][0].mean()
                                for r in runs],
      "best_head_alignment": [r["alignment_accuracy"].max() for r in runs],
      "best_head_within_1": [r["alignment_mass_within_1"].ravel()[
          best_head(r)] for r in runs],
      "uniform_alignment": [r["floors"]["uniform"]["accuracy"]
                            for r in runs],
      "uniform_within_1": [r["floors"]["uniform"]["mass_within_1"]
                           for r in runs],
      "init_best_head_alignment": [r["floors"]["init"]["accuracy"].max()
                                   for r in runs],
  }
  return {k: stats.summary(v) for k, v in per_seed.items()}
