"""What a KV cache changes in decoding cost, measuring: time, count, compare.

`measure` times one decode step with and without the cache at every
context length of `configs/kv_cache.py`, counts its bytes and FLOPs, and
checks that the cached logits equal the recomputed ones
(`experiments.kv_cache.decode_cost`); nothing is trained.
"""

from __future__ import annotations

import os
import pathlib

import jax

from experiments.kv_cache import decode_cost


def _machine() -> dict:
  """The backend, devices, core count, JAX version and load average."""
  return {"backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "cpu_count": os.cpu_count(), "jax": jax.__version__,
          "loadavg": [os.getloadavg()[0]]}


def measure(cfg, workdir, *, behaviour=None) -> dict:
  """The results dict: "config", "machine" (with the load average before
  and after), "timing" (one row per context length), "cache_bytes",
  "intensity", "exactness_max_rel_err" and "behaviour" (the parsed
  `--behaviour_results` JSON, or None)."""
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
  return results
