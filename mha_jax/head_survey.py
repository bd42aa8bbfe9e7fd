"""Every head of one trained decoder, measured on one batch.

Shape letters: L layers, B examples, H heads per layer, T length.

`survey` gathers what experiment 1 reports per model: the per-head metrics
of `analysis.head_metrics` (previous-token, induction, duplicate-token,
entropy, ...) as `[L, H]` arrays, the Jensen-Shannon distance between every
pair of the model's L * H heads, and, on request, each head's importance by
ablation and gradient (`interventions.head_importance`).
"""

from __future__ import annotations

import jax
import numpy as np

from mha_jax import analysis
from mha_jax import held_out
from mha_jax import interventions

_head_metrics = jax.jit(analysis.head_metrics)
_js_distance = jax.jit(analysis.js_distance)


def survey(model, batch, loss: str, *, ablate: bool = True) -> dict:
  """Per-head numbers of a token decoder on `batch`.

  Returns a dict: "eval" (`held_out.eval_loss`), "metrics" (name -> `[L,
  H]`), "js_distance" `[L*H, L*H]` (heads in layer-major order) with its
  mean and minimum off the diagonal, "importance"
  (`interventions.head_importance`, or None without `ablate`), and one
  example for figures: "weights_example" `[L, H, T, T]` and
  "tokens_example" `[T]`.
  """
  weights = held_out.weights_of(model, batch)["self"]  # [L, B, H, T, T]
  tokens = np.asarray(batch["inputs"])
  per_layer = [_head_metrics(w, tokens) for w in weights]
  metrics = {k: np.stack([np.asarray(m[k]) for m in per_layer])
             for k in per_layer[0]}
  l, b, h, t, _ = weights.shape
  all_heads = np.transpose(weights, (1, 0, 2, 3, 4)).reshape(b, l * h, t, t)
  js = np.asarray(_js_distance(all_heads))  # [L*H, L*H]
  off_diag = js[~np.eye(l * h, dtype=bool)]
  return {
      "eval": held_out.eval_loss(model, batch, loss),
      "metrics": metrics,
      "js_distance": js,
      "js_mean_off_diagonal": float(off_diag.mean()),
      "js_min_off_diagonal": float(off_diag.min()),
      "importance": (interventions.head_importance(model, batch, loss)
                     if ablate else None),
      "weights_example": weights[:, 0],
      "tokens_example": tokens[0],
  }
