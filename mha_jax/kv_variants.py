"""MHA, GQA and MQA variants of one decoder: names, costs, seed summaries.

Shape letters: H query heads, K key/value heads, L layers.

A variant is the same model with K key/value heads shared by H / K query
heads each (K = H: multi-head, 1 < K < H: grouped-query, K = 1:
multi-query). `summarise` turns per-seed measurements of several variants
into one row of means and spreads per K; `table_rows` makes those rows the
display strings that `experiments.kv_cache --behaviour_results` shows.
"""

from __future__ import annotations

import numpy as np

# Per-seed measurements that `summarise` averages (each a float per seed).
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


def summarise(num_heads: int, kv_heads, seeds, per_seed: dict) -> list[dict]:
  """One row of means and spreads per K, in the order of `kv_heads`.

  `per_seed["K{k}_seed{s}"]` holds one run's `MEASURES`,
  "first_step_below" (a step or None), "attention_params_per_layer" and
  "cache_bytes_per_token". Each row has "name", "num_kv_heads", "seeds",
  the two costs, `{"mean", "std", "min", "max"}` of every measure (std
  with ddof=0) and "first_step_below": how many seeds reached the
  threshold, their mean step, and the per-seed steps.
  """
  variants = []
  for k in kv_heads:
    rs = [per_seed[f"K{k}_seed{s}"] for s in seeds]
    row = {"name": variant_name(num_heads, k), "num_kv_heads": k,
           "seeds": len(rs),
           "attention_params_per_layer": rs[0]["attention_params_per_layer"],
           "cache_bytes_per_token": rs[0]["cache_bytes_per_token"]}
    for key in MEASURES:
      vals = [r[key] for r in rs]
      row[key] = {"mean": float(np.mean(vals)), "std": float(np.std(vals)),
                  "min": float(np.min(vals)), "max": float(np.max(vals))}
    reached = [r["first_step_below"] for r in rs
               if r["first_step_below"] is not None]
    row["first_step_below"] = {
        "reached": len(reached),
        "mean": float(np.mean(reached)) if reached else None,
        "per_seed": [r["first_step_below"] for r in rs]}
    variants.append(row)
  return variants


def _spread(stat, digits=3):
  return (f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f} "
          f"[{stat['min']:.{digits}f}, {stat['max']:.{digits}f}]")


def table_rows(variants, loss_threshold: float) -> list[dict]:
  """The `summarise` rows as display strings, one dict (column -> cell)
  per variant; cells are mean ± std [min, max] over seeds."""
  rows = []
  for v in variants:
    fs = v["first_step_below"]
    rows.append({
        "variant": v["name"], "K": v["num_kv_heads"],
        "attn params/layer": v["attention_params_per_layer"],
        "cache B/token": f"{v['cache_bytes_per_token']:.0f}",
        "eval loss": _spread(v["eval_loss"]),
        "eval accuracy": _spread(v["eval_accuracy"]),
        "teacher-forced acc (same prompts)": _spread(
            v["teacher_forced_accuracy"]),
        "cached generation: token acc": _spread(
            v["generation_token_accuracy"]),
        "whole continuation right": _spread(
            v["generation_sequence_accuracy"]),
        f"first step loss < {loss_threshold:g}": (
            f"{fs['mean']:.0f} ({fs['reached']}/{v['seeds']} seeds)"
            if fs["reached"] else f"never (0/{v['seeds']})"),
    })
  return rows
