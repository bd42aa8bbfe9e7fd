"""Attention sinks: how much of each head's attention goes nowhere useful.

Shape letters: L layers, B batch, H heads, K key/value heads, T length
(self-attention: Tq = Tk = T), Dh per-head width.

Trained transformers often send much of a head's attention to the first
token when the head has nothing to do (the "attention sink", Xiao et al.
2023; Gu et al. 2024). A learned sink logit (`ModelConfig.attention_sinks`)
gives the head an explicit place for that weight: a softmax column that
multiplies no value. The measures here, one number per head:

  * key share, `key_share(pattern, key)`: the mean weight on key `key`
    (position 0 by default), averaged over the batch and the queries at
    positions 1..T-1. Query 0 is left out: it sees only key 0, so it
    would add a 1 to every head's mean whatever the head does.
  * sink share, `sink_share(pattern)`: 1 minus the row sum of `pattern`
    (the `pattern` hook holds the weights of the real keys only), over the
    same queries; 0 (up to float32 rounding, ~1e-7) without sinks.
  * parked share: key-0 share plus sink share.

`rows [B, T]` (bool) narrows a mean to some queries: the late ones
(`late_rows`, where a fixed share stands out against uniform attention),
or those with or without an induction target (`induction_rows`), to ask
whether a head parks when it has nothing to do. The floor of the key-0 share is
uniform causal attention, 1/(i+1) at query i; `uniform_key0_share` gives
its mean over queries 1..T-1 in closed form, and the same metric on
`head_metrics.uniform_causal_weights` gives it for any `rows`.

`survey` measures a trained decoder on one batch: these shares per head,
the learned sink logits, the range of the attention logits (to choose a
soft cap that binds), the held-out loss and each head's zero-ablation
effect.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import attention
from mha_jax.core import score_rules
from mha_jax.interp import head_metrics
from mha_jax.interp import interventions
from mha_jax.interp import survey as head_survey
from mha_jax.models import transformer
from mha_jax.training import held_out

# Queries counted by every share: position 1 on (query 0 has no choice).
FIRST_QUERY = 1


def _check_pattern(pattern, fn):
  if jnp.ndim(pattern) != 4 or pattern.shape[-1] != pattern.shape[-2]:
    raise ValueError(f"{fn}: `pattern` must be self-attention weights "
                     f"[B, H, T, T], got shape {jnp.shape(pattern)}")
  if pattern.shape[-1] < 2:
    raise ValueError(f"{fn}: needs T >= 2 (query 0 alone is not counted), "
                     f"got T = {pattern.shape[-1]}")
  return jnp.asarray(pattern, jnp.float32)


def _counted(pattern, rows, fn):
  """`[B, 1, T]` bool: queries 1..T-1, and `rows [B, T]` when given."""
  b, _, t, _ = pattern.shape
  counted = jnp.broadcast_to(jnp.arange(t) >= FIRST_QUERY, (b, t))
  if rows is not None:
    if jnp.shape(rows) != (b, t):
      raise ValueError(f"{fn}: `rows` must be [B, T] = [{b}, {t}], got "
                       f"{jnp.shape(rows)}")
    counted = counted & jnp.asarray(rows, bool)
  return counted[:, None, :]


def _mean_rows(values, counted):
  """Mean of `values [B, H, T]` over the counted queries, per head -> [H];
  0 for a head with no counted query."""
  counted = jnp.broadcast_to(counted, values.shape)
  n = jnp.sum(counted, axis=(0, 2))
  total = jnp.sum(jnp.where(counted, values, 0.0), axis=(0, 2))
  return jnp.where(n > 0, total / jnp.maximum(n, 1), 0.0)


def key_share(pattern, key: int = 0, *, rows=None) -> jax.Array:
  """Mean weight on key `key`, `[H]`, over queries 1..T-1 (and `rows`).

  `pattern [B, H, T, T]` as the `pattern` hook gives it (causal or not).
  """
  p = _check_pattern(pattern, "key_share")
  if not 0 <= key < p.shape[-1]:
    raise ValueError(f"key_share: `key`={key} is outside 0..{p.shape[-1] - 1}")
  return _mean_rows(p[..., key], _counted(p, rows, "key_share"))


def sink_share(pattern, *, rows=None) -> jax.Array:
  """Mean weight on the learned sink, 1 - row sum, `[H]`, over queries
  1..T-1 (and `rows`)."""
  p = _check_pattern(pattern, "sink_share")
  return _mean_rows(1.0 - jnp.sum(p, axis=-1),
                    _counted(p, rows, "sink_share"))


def uniform_key0_share(length: int) -> float:
  """Key-0 share of uniform causal attention over queries 1..T-1.

  Query i spreads evenly over i + 1 keys, so the mean is
  (1/(T-1)) sum_{i=1}^{T-1} 1/(i+1) = (H_T - 1) / (T - 1), with H_T the
  T-th harmonic number.
  """
  if not isinstance(length, int) or length < 2:
    raise ValueError(f"uniform_key0_share: `length` must be an int >= 2, "
                     f"got {length!r}")
  harmonic = sum(1.0 / n for n in range(1, length + 1))
  return (harmonic - 1.0) / (length - 1)


def induction_rows(tokens) -> jax.Array:
  """`[B, T]` bool: queries with an induction target (an earlier copy of
  their token, followed by a key they can see;
  `head_metrics.induction_targets`).

  In the induction task these are the queries that a layer-2 induction
  head has something to do for; the others are where it would park.
  """
  return jnp.any(head_metrics.induction_targets(jnp.asarray(tokens)), axis=-1)


def sink_logits(model) -> np.ndarray | None:
  """The learned sink logit of every head of a decoder, `[L, H]`, or None
  for a model without sinks."""
  attns = [b.attn for b in model.blocks]
  if not all(hasattr(a, "sinks") for a in attns):
    return None
  return np.stack([np.asarray(a.sinks[...], np.float32) for a in attns])


def _weights_model(model):
  """The same model on a path that forms the weights (`pattern` exists
  only on vmap and einsum)."""
  if not attention.forms_weights(model.config.implementation):
    return transformer.with_implementation(model, "einsum")
  return model


@functools.partial(jax.jit, static_argnums=0)
def _capture(graphdef, state, tokens):
  """(logits [L, B, H, T, T] before any soft cap, pattern [L, B, H, T, T])."""
  model = nnx.merge(graphdef, state)
  c = model.config
  sites = [f"blocks.{l}.attn.{s}" for l in range(c.num_layers)
           for s in ("q", "k", "pattern")]
  _, cap = model(tokens, capture=tuple(sites))
  logits, patterns = [], []
  for l in range(c.num_layers):
    q = cap[f"blocks.{l}.attn.q"]  # [B, T, H, Dh], after rotary
    k = cap[f"blocks.{l}.attn.k"]  # [B, T, K, Dh]
    k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)  # [B, T, H, Dh]
    scale = score_rules.scale_of(score_rules.ScoreRules(scale=c.attn_scale),
                                 q.shape[-1])
    logits.append(jnp.einsum("bqhd,bkhd->bhqk", q, k,
                             preferred_element_type=jnp.float32) * scale)
    patterns.append(cap[f"blocks.{l}.attn.pattern"])
  return jnp.stack(logits), jnp.stack(patterns)


def attention_arrays(model, tokens) -> tuple[np.ndarray, np.ndarray]:
  """Every layer's logits and pattern on `tokens [B, T]`, as NumPy.

  Returns `(logits [L, B, H, T, T], pattern [L, B, H, T, T])`: logits are
  scale * q.k (the `q`, `k` hooks, after rotary positions) BEFORE any soft
  cap and without masking; ALiBi and other biases are not added (the
  models measured here have none). The pattern is the `pattern` hook,
  read on an attention path that forms it.
  """
  model = _weights_model(model)
  logits, pattern = _capture(*nnx.split(model), jnp.asarray(tokens))
  return np.asarray(logits), np.asarray(pattern)


def logit_range(logits, *, cap: float | None = None) -> dict:
  """Size of the causal logits of each layer, `logits [L, B, H, T, T]`.

  name -> `[L]`: "abs_median" and "abs_q99" (quantiles of |s| over every
  key a query sees), "abs_max", "row_max_median" (median over rows of
  the row's largest logit: what a soft cap compresses first) and, given
  `cap`, "frac_above_cap" (the fraction of visible logits with |s| > cap,
  where tanh bends the logit by more than a quarter).
  """
  logits = np.asarray(logits, np.float64)
  t = logits.shape[-1]
  seen = np.tril(np.ones((t, t), bool))
  out = {"abs_median": [], "abs_q99": [], "abs_max": [], "row_max_median": []}
  if cap is not None:
    out["frac_above_cap"] = []
  for s in logits:  # [B, H, T, T]
    vals = np.abs(s[..., seen])
    out["abs_median"].append(float(np.median(vals)))
    out["abs_q99"].append(float(np.quantile(vals, 0.99)))
    out["abs_max"].append(float(vals.max()))
    out["row_max_median"].append(
        float(np.median(np.where(seen, s, -np.inf).max(-1))))
    if cap is not None:
      out["frac_above_cap"].append(float(np.mean(vals > cap)))
  return {k: np.asarray(v) for k, v in out.items()}


def late_rows(batch: int, length: int) -> jax.Array:
  """`[B, T]` bool: the second half of the queries (i >= T // 2).

  Uniform attention gives key 0 only 1/(i+1) there (about 0.045 at T =
  32), so a head that puts a fixed share on position 0 at every query
  stands out, where early queries would hide it.
  """
  return jnp.broadcast_to(jnp.arange(length) >= length // 2, (batch, length))


def head_shares(pattern, tokens) -> dict:
  """name -> `[L, H]` shares of `pattern [L, B, H, T, T]` on `tokens`.

  "key0", "key1" (the first symbol when token 0 is BOS), "sink",
  "parked" (key0 + sink); the same three on the late queries
  (`late_rows`, "_late"); and "key0" / "sink" on queries with ("_task")
  and without ("_idle") an induction target; "self" and "prev", the
  weight on the query's own and the previous token
  (`head_metrics.offset_score`), to tell what else a parking head does.
  """
  task = induction_rows(tokens)
  late = late_rows(*np.shape(tokens))
  out = {k: [] for k in ("key0", "key1", "sink", "parked", "key0_late",
                         "sink_late", "parked_late", "key0_task",
                         "key0_idle", "sink_task", "sink_idle", "self",
                         "prev")}
  for p in np.asarray(pattern):
    out["self"].append(head_metrics.offset_score(p, 0))
    out["prev"].append(head_metrics.offset_score(p, 1))
    k0, sk = key_share(p, 0), sink_share(p)
    k0_late, sk_late = key_share(p, 0, rows=late), sink_share(p, rows=late)
    out["key0"].append(k0)
    out["key1"].append(key_share(p, 1))
    out["sink"].append(sk)
    out["parked"].append(k0 + sk)
    out["key0_late"].append(k0_late)
    out["sink_late"].append(sk_late)
    out["parked_late"].append(k0_late + sk_late)
    out["key0_task"].append(key_share(p, 0, rows=task))
    out["key0_idle"].append(key_share(p, 0, rows=~task))
    out["sink_task"].append(sink_share(p, rows=task))
    out["sink_idle"].append(sink_share(p, rows=~task))
  return {k: np.stack([np.asarray(x) for x in v]) for k, v in out.items()}


def query_profile(pattern) -> dict:
  """Shares at each query position, mean over the batch: "key0" and
  "sink", `[L, H, T]` each, from `pattern [L, B, H, T, T]` (query 0
  included: it gives key 0 whatever the sink leaves)."""
  p = np.asarray(pattern, np.float64)
  return {"key0": p[..., 0].mean(1), "sink": (1.0 - p.sum(-1)).mean(1)}


def uniform_floor(tokens) -> dict:
  """The shares of `head_shares` for uniform causal attention on `tokens`
  (name -> float; the sink shares are 0)."""
  b, t = np.shape(tokens)
  w = np.asarray(head_metrics.uniform_causal_weights(b, t))[None]  # [1,B,1,T,T]
  return {k: float(v[0, 0]) for k, v in head_shares(w, tokens).items()}


def _measure(model, batch, loss, cap):
  logits, pattern = attention_arrays(model, batch["inputs"])
  out = {"shares": head_shares(pattern, batch["inputs"]),
         "profile": query_profile(pattern),
         "logit_range": logit_range(logits, cap=cap),
         "eval": held_out.eval_loss(model, batch, loss)}
  sl = sink_logits(model)
  if sl is not None:
    out["sink_logits"] = sl
  return out


def survey(model, batch, loss: str, *, init_model=None, ablate: bool = True,
           cap: float | None = None) -> dict:
  """Sink measures of a token decoder on `batch`.

  Returns "shares" (`head_shares`), "profile" (`query_profile`),
  "logit_range" (`logit_range` with `cap`), "eval"
  (`held_out.eval_loss`), "sink_logits" `[L, H]` (models with sinks),
  "ablation" (`interventions.zero_ablation` `[L, H]`, or None without
  `ablate`), "uniform" (`uniform_floor` on the batch) and, given
  `init_model` (the same architecture untrained), "init" with its shares,
  profile, logit range, eval and sink logits: `head_survey.floored`'s
  structure, with the trained model's measures at the top level.
  """
  s = head_survey.floored(
      model, lambda m: _measure(m, batch, loss, cap),
      uniform=lambda: uniform_floor(batch["inputs"]), init_model=init_model,
      ablate=((lambda m: interventions.zero_ablation(m, batch, loss))
              if ablate else None))
  out = dict(s["trained"], ablation=s["ablation"], uniform=s["uniform"])
  if "init" in s:
    out["init"] = s["init"]
  return out
