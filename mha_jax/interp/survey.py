"""Every head of one trained decoder, measured on one batch, with floors.

Shape letters: L layers, B examples, H heads per layer, T length, R
bootstrap resamples.

`survey` gathers what experiment 1 reports per model: the per-head metrics
of `head_metrics.head_metrics` (previous-token, induction, duplicate-token,
entropy, ...) as `[L, H]` arrays with a 95% bootstrap interval over the
examples for the two circuit scores; the Jensen-Shannon distance between
every pair of the model's L * H heads, split into pairs within one layer
and pairs across layers; the floors every score is read against (uniform
causal attention on the same sequences, and the same architecture at
initialisation); and, on request, each head's importance by ablation and
gradient (`interventions.head_importance`). `floored` is that structure
(trained, untrained, uniform, ablation) for any measures, which the sink
and text-head surveys of experiments/ share.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.interp import head_metrics
from mha_jax.interp import interventions
from mha_jax.measure import bootstrap
from mha_jax.training import held_out

_js_distance = jax.jit(head_metrics.js_distance)
# The scores a circuit claim rests on: these get intervals over examples.
INTERVAL_METRICS = ("previous_token", "induction")


@functools.partial(jax.jit, static_argnames=("names",))
def _resampled(weights, tokens, idx, names):
  """`[R, len(names), H]`: the metrics on each resample `idx [R, B]`."""
  def one(i):
    m = head_metrics.head_metrics(weights[i], tokens[i])
    return jnp.stack([m[n] for n in names])
  return jax.lax.map(one, idx)


def bootstrap_metrics(weights, tokens, *, names=INTERVAL_METRICS,
                      resamples: int = 200, seed: int = 0) -> dict:
  """name -> `[L, H, 2]` percentile-bootstrap 95% intervals over examples.

  `weights [L, B, H, T, T]`. Each resample draws B examples with
  replacement (`bootstrap.draws`) and recomputes the metric exactly as
  `head_metrics` does (rows pooled over the resampled examples); every
  layer uses the same draws.
  """
  idx = bootstrap.draws(weights.shape[1], resamples, seed)
  per_layer = np.stack([np.asarray(_resampled(w, tokens, idx, names))
                        for w in weights])  # [L, R, N, H]
  q = bootstrap.interval(per_layer, axis=1, levels=(0.025, 0.975))
  return {n: q[:, i] for i, n in enumerate(names)}  # [L, H, 2] each


def js_by_layer(js: np.ndarray, num_layers: int) -> dict:
  """Mean JS distance of head pairs within one layer and across layers.

  `js [L*H, L*H]` in layer-major order. Within-layer pairs compete for
  the same residual stream; across-layer pairs may differ just because
  their inputs do, so the two means answer different questions. Across is
  None for a 1-layer model.
  """
  n = js.shape[0]
  layer = np.repeat(np.arange(num_layers), n // num_layers)
  same = layer[:, None] == layer[None, :]
  off = ~np.eye(n, dtype=bool)
  across = js[~same]
  return {"within_layer": float(js[same & off].mean()),
          "across_layer": float(across.mean()) if across.size else None}


def layer_metrics(weights, tokens=None) -> dict:
  """`head_metrics.head_metrics` of every layer: name -> `[L, H]` (NumPy).

  `weights [L, B, H, Tq, Tk]`; `tokens [B, T]` adds the token scores.
  """
  per_layer = [head_metrics.head_metrics(w, tokens)
               for w in np.asarray(weights)]
  return {k: np.stack([np.asarray(m[k]) for m in per_layer])
          for k in per_layer[0]}


def _scores(model, batch):
  """(weights [L, B, H, T, T], metrics name -> [L, H], js [L*H, L*H])."""
  weights = held_out.weights_of(model, batch)["self"]
  metrics = layer_metrics(weights, np.asarray(batch["inputs"]))
  l, b, h, t, _ = weights.shape
  all_heads = np.transpose(weights, (1, 0, 2, 3, 4)).reshape(b, l * h, t, t)
  return weights, metrics, np.asarray(_js_distance(all_heads))


def uniform_floor(batch) -> dict:
  """name -> score of uniform causal attention on `batch`'s sequences."""
  tokens = np.asarray(batch["inputs"])
  w = head_metrics.uniform_causal_weights(*tokens.shape)
  metrics = head_metrics.head_metrics(w, tokens)
  return {k: float(v[0]) for k, v in metrics.items()}


def floored(model, measure, *, uniform=None, init_model=None,
            ablate=None) -> dict:
  """A model's per-head measures beside their floors and its ablation.

  The structure every survey of heads reports (this module's `survey`,
  the sink and the text-head surveys): "trained", `measure(model)` (a
  dict of the model's numbers); "ablation", `ablate(model)` (each head's
  effect when removed) or None without `ablate`; "uniform", `uniform()`
  (the same numbers for uniform causal attention on the same inputs),
  given `uniform`; "init", `measure(init_model)` (the same architecture
  untrained), given `init_model`. Each survey lays these out under its
  own results keys.
  """
  out = {"trained": measure(model),
         "ablation": None if ablate is None else ablate(model)}
  if uniform is not None:
    out["uniform"] = uniform()
  if init_model is not None:
    out["init"] = measure(init_model)
  return out


def survey(model, batch, loss: str, *, ablate: bool = True,
           init_model=None) -> dict:
  """Per-head numbers of a token decoder on `batch`.

  Returns a dict: "eval" (`held_out.eval_loss`), "metrics" (name -> `[L,
  H]`), "intervals" (`bootstrap_metrics`), "js_distance" `[L*H, L*H]`
  (heads in layer-major order) with its mean and minimum off the diagonal
  and "js_by_layer"; "floors": "uniform" (`uniform_floor`) and, given
  `init_model` (the same architecture before training), "init" with its
  metrics, JS split and eval loss; "importance"
  (`interventions.head_importance`, or None without `ablate`), and one
  example for figures: "weights_example" `[L, H, T, T]` and
  "tokens_example" `[T]`.
  """
  def measure(m):
    weights, metrics, js = _scores(m, batch)
    return {"weights": weights, "metrics": metrics, "js": js,
            "eval": held_out.eval_loss(m, batch, loss)}

  s = floored(model, measure, uniform=lambda: uniform_floor(batch),
              init_model=init_model,
              ablate=((lambda m: interventions.head_importance(m, batch, loss))
                      if ablate else None))
  trained = s["trained"]
  weights, js = trained["weights"], trained["js"]
  tokens = np.asarray(batch["inputs"])
  n_layers = weights.shape[0]
  off_diag = js[~np.eye(js.shape[0], dtype=bool)]
  floors = {"uniform": s["uniform"]}
  if "init" in s:
    floors["init"] = {"metrics": s["init"]["metrics"],
                      "js_by_layer": js_by_layer(s["init"]["js"], n_layers),
                      "eval": s["init"]["eval"]}
  return {
      "eval": trained["eval"],
      "metrics": trained["metrics"],
      "intervals": bootstrap_metrics(weights, tokens),
      "js_distance": js,
      "js_mean_off_diagonal": float(off_diag.mean()),
      "js_min_off_diagonal": float(off_diag.min()),
      "js_by_layer": js_by_layer(js, n_layers),
      "floors": floors,
      "importance": s["ablation"],
      "weights_example": weights[:, 0],
      "tokens_example": tokens[0],
  }
