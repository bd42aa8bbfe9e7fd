"""What a KV cache changes in decoding cost, measuring: time, count, compare.

`measure` times one decode step with and without the cache at every
context length of `configs/kv_cache.py`, counts its bytes and FLOPs, and
checks that the cached logits equal the recomputed ones
(`experiments.kv_cache.decode_cost`); nothing is trained. `summarise` then
adds the slopes, the speed-up at the target context and the target
verdicts, which the report reads from results.json.
"""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np

from experiments.kv_cache import decode_cost
from mha_jax.measure import timing


def _machine() -> dict:
  """The backend, devices, core count, JAX version and load average."""
  return {"backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "cpu_count": os.cpu_count(), "jax": jax.__version__,
          "loadavg": [os.getloadavg()[0]]}


def summarise(cfg, results) -> dict:
  """Slopes, the speed-up at the target context, and the target verdicts."""
  b, m = cfg.bench, cfg.model
  rows = results["timing"]
  n = [r["n"] for r in rows]
  upper = [r for r in rows if r["n"] >= np.median(n)]
  full = [r for r in rows if "nocache_s" in r]
  slope = timing.loglog_slope
  s = {"cached_slope": slope(n, [r["cached_s"] for r in rows]),
       "cached_slope_upper_half": slope([r["n"] for r in upper],
                                        [r["cached_s"] for r in upper]),
       "nocache_slope": slope([r["n"] for r in full],
                              [r["nocache_s"] for r in full])}
  at = [r for r in full if r["n"] == b.target_context]
  if at:
    s["speedup_at_target"] = at[0]["nocache_s"] / at[0]["cached_s"]
    s["xla_flop_ratio_at_target"] = (at[0]["nocache_xla_flops"]
                                     / at[0]["cached_xla_flops"])
  by_k = {r["num_kv_heads"]: r for r in results["cache_bytes"]}
  if m.num_heads in by_k and 1 in by_k:
    s["mqa_over_mha_bytes"] = (by_k[1]["bytes_per_sequence"]
                               / by_k[m.num_heads]["bytes_per_sequence"])
  s["targets"] = {
      f"speed-up at n={b.target_context} >= {b.target_speedup:g}x":
          s.get("speedup_at_target", 0.0) >= b.target_speedup,
      f"cached log-log slope <= {b.target_slope:g}":
          s["cached_slope"] <= b.target_slope,
      f"MQA cache == 1/{m.num_heads} of MHA":
          s.get("mqa_over_mha_bytes") == 1.0 / m.num_heads,
  }
  return s


def measure(cfg, workdir, *, behaviour=None) -> dict:
  """The results dict: "config", "machine" (with the load average before
  and after), "timing" (one row per context length), "cache_bytes",
  "intensity", "exactness_max_rel_err", "behaviour" (the parsed
  `--behaviour_results` JSON, or None) and "summary" (`summarise`)."""
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  model = decode_cost.make_model(cfg, cfg.model.num_kv_heads)
  results = {
      "config": cfg.to_dict(),
      "machine": _machine(),
      "timing": [decode_cost.bench_context(cfg, model, n)
                 for n in cfg.bench.contexts],
      "cache_bytes": decode_cost.cache_bytes(cfg),
      "intensity": decode_cost.intensity(cfg),
      "exactness_max_rel_err": decode_cost.exactness(cfg),
      "behaviour": behaviour,
  }
  results["machine"]["loadavg"].append(os.getloadavg()[0])
  results["summary"] = summarise(cfg, results)
  return results
