r"""What a KV cache changes in decoding cost, measured on a pure decoder stack.

  python -m experiments.kv_cache --workdir=runs/kv_cache
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/behaviour/results.json

Writes report.md, results.json and PNG plots to `--workdir`. Sizes live in
configs/kv_cache.py (override with `--config.bench.contexts=64,128` etc.).

Shape letters: B batch, n tokens in context, S cache slots, D d_model,
H query heads, K key/value heads, Dh head width, F MLP width, L layers.

`--behaviour_results` (optional) is a JSON file written by the training
experiments: {"command": str, "description": str, "runs": [{"name": str,
...metrics}]}. Its runs are shown side by side as a table; without it the
report says that behaviour was not measured in this run.
"""

import json
import os

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from experiments import kv_cache_report
from experiments import measure
from mha_jax import flops
from mha_jax import kv_cache
from mha_jax import params as params_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/kv_cache.py", "Path to the config file.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/kv_cache",
                               "Where report.md, results.json, PNGs go.")
_BEHAVIOUR = flags.DEFINE_string(
    "behaviour_results", None, "Optional JSON of trained MHA/GQA/MQA LMs to "
    "include side by side (see the module docstring for its format).")


def make_stack(cfg, num_kv_heads, seed=0):
  m = cfg.model
  return kv_cache.init_stack_params(
      jax.random.PRNGKey(seed), m.num_layers, m.d_model, m.num_heads,
      num_kv_heads=num_kv_heads, mlp_dim=m.mlp_dim)


def filled_caches(layers, batch, slots, n, seed=0):
  """Caches whose first n slots hold random keys/values (cost ignores them)."""
  caches = []
  for i, layer in enumerate(layers):
    c = kv_cache.init_cache_for(layer["attn"], batch, slots)
    kk, kv = jax.random.split(jax.random.PRNGKey(seed + i))
    caches.append(c._replace(
        k=jax.random.normal(kk, c.k.shape), v=jax.random.normal(kv, c.v.shape),
        length=jnp.full((batch,), n, jnp.int32)))
  return caches


def stack_step(layers, x, caches, *, implementation):
  """One decode step of the stack: `x [B, D]` -> `[B, D]`, caches, status."""
  y, caches, status = kv_cache.stack_cached(layers, x[:, None], caches,
                                            implementation=implementation)
  return y[:, 0], caches, status


def stack_recompute(layers, x, *, implementation):
  """No cache: rerun the stack over the whole prefix `x [B, n+1, D]`."""
  return kv_cache.stack_forward(layers, x, implementation=implementation)[:, -1]


def analytic_flops(cfg, num_kv_heads, batch, n, *, cached, slots=None):
  """Matmul FLOPs (multiply-add = 2). Cached: one token over S slots."""
  m = cfg.model
  d, h, k, f = m.d_model, m.num_heads, num_kv_heads, m.mlp_dim
  dh = d // h
  per_token = 2 * d * (h + 2 * k) * dh + 2 * h * dh * d + 4 * d * f
  if cached:  # the new token's projections + QK^T and AV over all S slots
    per_layer = per_token + 4 * slots * h * dh
  else:  # every token's projections + the full n x n score matrix
    per_layer = n * per_token + 4 * n * n * h * dh
  return batch * m.num_layers * per_layer


def median_time(fn, args, *, warmup, repeats, feed_back=None):
  """Median and min wall seconds of `fn(*args)`, and the last output.

  The minimum is kept next to the median because on a shared machine the
  noise only ever adds time.
  """
  times, out = measure.wall_times(fn, args, warmup=warmup, repeats=repeats,
                                  feed_back=feed_back)
  return (float(np.median(times)), float(np.min(times))), out


def bench_context(cfg, layers, n):
  """Cached step and recomputation at context n: times and FLOPs."""
  b, m = cfg.bench, cfg.model
  impl = m.implementation
  slots = n + b.warmup + b.repeats  # room for every timed step
  caches = filled_caches(layers, b.batch, slots, n)
  x = jax.random.normal(jax.random.PRNGKey(1), (b.batch, m.d_model))
  cost = flops.xla_cost_analysis(
      lambda l, x, c: stack_step(l, x, c, implementation=impl),
      layers, x, caches)
  row = {"n": n, "slots": slots,
         "cached_xla_flops": cost.get("flops", 0.0),
         "cached_xla_bytes": cost.get("bytes accessed", 0.0),
         "cached_matmul_flops": flops.jaxpr_matmul_flops(
             stack_step, layers, x, caches, implementation=impl),
         "cached_analytic_flops": analytic_flops(
             cfg, m.num_kv_heads, b.batch, n, cached=True, slots=slots)}
  step = jax.jit(lambda l, x, c: stack_step(l, x, c, implementation=impl),
                 donate_argnums=2)  # update the cache in place
  (row["cached_s"], row["cached_min_s"]), (_, caches, status) = median_time(
      step, (layers, x, caches), warmup=b.warmup, repeats=b.repeats,
      feed_back=lambda a, out: (a[0], a[1], out[1]))
  kv_cache.raise_if_overflow(status)
  if n <= b.nocache_max_context:
    xs = jax.random.normal(jax.random.PRNGKey(2), (b.batch, n + 1, m.d_model))
    full = jax.jit(lambda l, x: stack_recompute(l, x, implementation=impl))
    row["nocache_xla_flops"] = flops.xla_cost_analysis(
        lambda l, x: stack_recompute(l, x, implementation=impl),
        layers, xs).get("flops", 0.0)
    row["nocache_analytic_flops"] = analytic_flops(
        cfg, m.num_kv_heads, b.batch, n + 1, cached=False)
    (row["nocache_s"], row["nocache_min_s"]), _ = median_time(full, (layers, xs), warmup=1,
                                      repeats=b.nocache_repeats)
  logging.info("n=%d %s", n, {k: v for k, v in row.items() if "_s" in k})
  return row


def cache_bytes(cfg):
  """Bytes of the caches themselves (`.nbytes`) vs 2 L K Dh bytes/token."""
  h, m = cfg.heads, cfg.model
  rows = []
  for k in h.kv_heads:
    layers = make_stack(cfg, k)
    caches = [kv_cache.init_cache_for(l["attn"], 1, h.max_len) for l in layers]
    kv = sum(c.k.nbytes + c.v.nbytes for c in caches)
    dims = params_lib.mha_dims(layers[0]["attn"])
    rows.append({
        "num_kv_heads": k, "bytes_per_sequence": kv,
        "bytes_per_token": kv / h.max_len,
        "formula_bytes_per_token": 2 * m.num_layers * k * dims.head_dim
                                   * caches[0].k.dtype.itemsize,
        "length_bytes_per_sequence": sum(c.length.nbytes for c in caches)})
  mha = rows[0]["bytes_per_sequence"]
  for r in rows:
    r["fraction_of_first"] = r["bytes_per_sequence"] / mha
  return rows


def intensity(cfg):
  """FLOPs per byte moved (weights + cache read) of one decode step."""
  h, b, m = cfg.heads, cfg.bench, cfg.model
  impl = m.implementation
  rows = []
  for k in h.kv_heads:
    layers = make_stack(cfg, k)
    weight_bytes = sum(a.nbytes for a in jax.tree.leaves(layers))
    for batch in h.batches:
      slots = h.context + b.warmup + b.repeats
      caches = filled_caches(layers, batch, slots, h.context)
      cache_read = sum(c.k.nbytes + c.v.nbytes for c in caches)
      x = jnp.ones((batch, m.d_model))
      fl = analytic_flops(cfg, k, batch, h.context, cached=True, slots=slots)
      cost = flops.xla_cost_analysis(
          lambda l, x, c: stack_step(l, x, c, implementation=impl),
          layers, x, caches)
      step = jax.jit(lambda l, x, c: stack_step(l, x, c, implementation=impl),
                     donate_argnums=2)
      (t, t_min), _ = median_time(step, (layers, x, caches), warmup=b.warmup,
                         repeats=b.repeats,
                         feed_back=lambda a, out: (a[0], a[1], out[1]))
      rows.append({
          "num_kv_heads": k, "batch": batch, "context": h.context,
          "analytic_flops": fl, "weight_bytes": weight_bytes,
          "cache_bytes_read": cache_read,
          "analytic_intensity": fl / (weight_bytes + cache_read),
          "xla_flops": cost.get("flops", 0.0),
          "xla_bytes_accessed": cost.get("bytes accessed", 0.0),
          "step_s": t, "step_min_s": t_min})
      logging.info("intensity %s", rows[-1])
  return rows


def exactness(cfg, steps=8):
  """Largest relative error of prefill + decode vs the full forward."""
  m = cfg.model
  out = {}
  lens = jnp.array([5, 9, 2], jnp.int32)
  for k in cfg.heads.kv_heads:
    layers = make_stack(cfg, k, seed=3)
    p = int(lens.max())
    full = jax.random.normal(jax.random.PRNGKey(4), (3, p + steps, m.d_model))
    ref = kv_cache.stack_forward(layers, full)
    caches = [kv_cache.init_cache_for(l["attn"], 3, p + steps) for l in layers]
    y, caches, _ = kv_cache.stack_cached(layers, full[:, :p], caches,
                                         lengths=lens)
    errs = [float(jnp.linalg.norm(y[i, :n] - ref[i, :n])
                  / jnp.linalg.norm(ref[i, :n])) for i, n in enumerate(lens)]
    rows = jnp.arange(3)
    for s in range(steps):
      y, caches, _ = stack_step(layers, full[rows, lens + s], caches,
                                implementation=m.implementation)
      r = ref[rows, lens + s]
      errs.append(float(jnp.max(jnp.linalg.norm(y - r, axis=-1)
                                / jnp.linalg.norm(r, axis=-1))))
    out[str(k)] = max(errs)
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cfg, workdir = _CONFIG.value, _WORKDIR.value
  behaviour = None
  if _BEHAVIOUR.value:
    with open(_BEHAVIOUR.value) as f:
      behaviour = json.load(f)
  os.makedirs(workdir, exist_ok=True)
  layers = make_stack(cfg, cfg.model.num_kv_heads)
  results = {
      "config": cfg.to_dict(),
      "machine": {"backend": jax.default_backend(),
                  "devices": [str(d) for d in jax.devices()],
                  "cpu_count": os.cpu_count(), "jax": jax.__version__,
                  "loadavg": [os.getloadavg()[0]]},
      "timing": [bench_context(cfg, layers, n) for n in cfg.bench.contexts],
      "cache_bytes": cache_bytes(cfg),
      "intensity": intensity(cfg),
      "exactness_max_rel_err": exactness(cfg),
      "behaviour": behaviour,
  }
  results["machine"]["loadavg"].append(os.getloadavg()[0])
  results["summary"] = kv_cache_report.summarise(cfg, results)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  kv_cache_report.write(cfg, results, workdir)
  logging.info("Wrote %s/report.md", workdir)


if __name__ == "__main__":
  app.run(main)
