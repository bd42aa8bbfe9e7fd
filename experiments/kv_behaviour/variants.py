"""MHA, GQA and MQA variants of one decoder: names, costs, seed summaries.

Shape letters: H query heads, K key/value heads, Dh head width, L layers.

A variant is the same model with K key/value heads shared by H / K query
heads each (K = H: multi-head, 1 < K < H: grouped-query, K = 1:
multi-query). Sharing removes key/value parameters, so a variant with fewer
kv heads is also a smaller model; `matched_head_dim` finds the head width
Dh at which it has (as nearly as an even Dh allows) the parameter count of
the MHA model, to separate "fewer kv heads" from "fewer parameters".

`summarise` turns per-seed measurements of several variants into one
record per variant (every per-seed value, mean, sample std, 95% interval,
and the time until the loss first dropped below a threshold);
`compare` sets each variant against the reference with Welch intervals;
`table_rows` makes the display strings that `experiments.kv_cache
--behaviour_results` shows.
"""

from __future__ import annotations

from flax import nnx
import jax
import numpy as np

from mha_jax.measure import curves
from mha_jax.measure import report as report_lib
from mha_jax.measure import runs
from mha_jax.measure import stats
from mha_jax.training import config as config_lib

# Per-seed measurements that `summarise` summarises (each a float per seed).
MEASURES = ("eval_loss", "eval_accuracy", "teacher_forced_accuracy",
            "generation_token_accuracy", "generation_sequence_accuracy")


def variant_name(h: int, k: int) -> str:
  """"MHA" (K = H), "MQA" (K = 1) or "GQA (H/g)" for H = g K."""
  if k == h:
    return "MHA"
  return "MQA" if k == 1 else f"GQA (H/{h // k})"


def model_costs(model) -> tuple[int, float]:
  """Attention parameters per layer and KV-cache bytes per token (all
  layers, the cache dtype) of a `DecoderLM`, read from the arrays."""
  attn = model.blocks[0].attn
  params = sum(int(np.prod(a.shape)) for a in attn.core_params().values())
  caches = model.init_cache(batch=1)
  per_token = sum(c.k.nbytes + c.v.nbytes for c in caches) / caches[0].max_len
  return params, per_token


def param_count(model) -> int:
  """Every trainable parameter of `model` (its `nnx.Param` leaves)."""
  return sum(int(np.prod(x.shape))
             for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def config_param_count(config) -> int:
  """`param_count` of the model `config` builds, without allocating it."""
  model = nnx.eval_shape(lambda: config_lib.build_model(config,
                                                        nnx.Rngs(0)))
  return param_count(model)


def matched_head_dim(config, num_kv_heads: int) -> tuple[int, int, int]:
  """The even Dh at which `config` with K = `num_kv_heads` has the total
  parameter count closest to `config` itself (its own K and Dh).

  Even, because rotary positions rotate pairs of dimensions. Returns
  `(head_dim, params, reference_params)`.
  """
  ref = config_param_count(config)
  base = config.model.head_dim or config.model.d_model // config.model.num_heads
  best = None
  for dh in range(2, 4 * base + 1, 2):
    c = runs.variant(config, **{"model.num_kv_heads": num_kv_heads,
                                "model.head_dim": dh})
    n = config_param_count(c)
    if best is None or abs(n - ref) < abs(best[1] - ref):
      best = (dh, n)
  return best[0], best[1], ref


def summarise(variants, seeds, per_seed: dict, num_steps: int) -> list[dict]:
  """One record per variant, in the order of `variants`.

  `variants`: dicts with "key" (runs are `per_seed[f"{key}_seed{s}"]`),
  "name", "num_kv_heads", "head_dim" and "matched" (whether Dh was widened
  to match the reference's parameter count). Each run holds `MEASURES`,
  "first_step_below" (a step or None), "params",
  "attention_params_per_layer", "cache_bytes_per_token" and "curve"
  (`{"steps", "loss"}` of the eval loss). Each record gets the spec, the
  costs, `stats.summary` of every measure (every per-seed value, n, mean,
  sample std, 95% t interval) and "time_to_drop": the per-seed steps
  (None: not reached by `num_steps`), how many reached, the median step
  (None when fewer than half reached) and the survival curve over the
  eval steps.
  """
  out = []
  for v in variants:
    rs = [per_seed[f"{v['key']}_seed{s}"] for s in seeds]
    row = dict(v, seeds=len(rs), params=rs[0]["params"],
               attention_params_per_layer=rs[0]["attention_params_per_layer"],
               cache_bytes_per_token=rs[0]["cache_bytes_per_token"])
    for key in MEASURES:
      row[key] = stats.summary([r[key] for r in rs])
    first = [r["first_step_below"] for r in rs]
    steps = rs[0]["curve"]["steps"]
    row["time_to_drop"] = {
        "per_seed": first, "reached": sum(f is not None for f in first),
        "censored_at": num_steps, "median": curves.median_step(first),
        "survival": {"steps": steps,
                     "fraction_above": curves.survival_curve(first, steps)}}
    out.append(row)
  return out


def loss_at_steps(variants, seeds, per_seed, steps) -> dict:
  """`{variant key: {step: stats.summary of the eval loss at that step}}`,
  from each run's eval curve (the intermediate evaluations of one run)."""
  out = {}
  for v in variants:
    rows = {}
    for s in steps:
      vals = []
      for seed in seeds:
        c = per_seed[f"{v['key']}_seed{seed}"]["curve"]
        vals.append(c["loss"][c["steps"].index(s)])
      rows[s] = stats.summary(vals)
    out[v["key"]] = rows
  return out


def compare(reference: dict, other: dict) -> dict:
  """`other` minus `reference` for the loss, the generation accuracy and
  the time to drop.

  Loss and accuracy: `stats.difference` (Welch's 95% interval) and the
  smallest difference the seed count would detect (80% power, from the
  pooled sample std). Time to drop: the difference of mean steps with its
  Welch interval only when every seed of both reached the threshold
  (otherwise None: a mean over censored runs means nothing), and the
  log-rank p-value, which keeps the censored runs.
  """
  out = {"reference": reference["key"], "variant": other["key"]}
  for key in ("eval_loss", "generation_token_accuracy"):
    a, b = other[key]["values"], reference[key]["values"]
    d = stats.difference(a, b)
    n = min(len(a), len(b))
    pooled = (np.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)
              if n >= 2 else None)
    d["detectable"] = (stats.detectable_difference(float(pooled), n)
                       if pooled is not None else None)
    out[key] = d
  ta, tb = other["time_to_drop"], reference["time_to_drop"]
  complete = (None not in ta["per_seed"]) and (None not in tb["per_seed"])
  out["time_to_drop"] = {
      "mean_difference": (stats.difference(ta["per_seed"], tb["per_seed"])
                          if complete else None),
      "logrank_p": curves.logrank_p(ta["per_seed"], tb["per_seed"],
                                      ta["censored_at"])}
  return out


def drop_cell(t: dict) -> str:
  """The time-to-drop cell: median step and how many seeds reached it."""
  med = t["median"]
  head = (f"median {med}" if med is not None
          else f"median > {t['censored_at']}")
  return f"{head} ({t['reached']}/{len(t['per_seed'])} seeds)"


def table_rows(variants, loss_threshold: float) -> list[dict]:
  """The `summarise` records as display strings, one dict (column -> cell)
  per variant; cells are mean ± sample std [95% interval of the mean]."""
  rows = []
  for v in variants:
    rows.append({
        "variant": v["name"], "K": v["num_kv_heads"], "Dh": v["head_dim"],
        "params": v["params"],
        "attn params/layer": v["attention_params_per_layer"],
        "cache B/token": f"{v['cache_bytes_per_token']:.0f}",
        "eval loss": report_lib.summary(v["eval_loss"]),
        "eval accuracy": report_lib.summary(v["eval_accuracy"]),
        "teacher-forced acc (same prompts)": report_lib.summary(
            v["teacher_forced_accuracy"]),
        "cached generation: token acc": report_lib.summary(
            v["generation_token_accuracy"]),
        "whole continuation right": report_lib.summary(
            v["generation_sequence_accuracy"]),
        f"first eval step with loss < {loss_threshold:g}": drop_cell(
            v["time_to_drop"]),
    })
  return rows
