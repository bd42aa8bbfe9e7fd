"""The cost claims of FORMULAS.md, measured: one layer against h and n.

Claims: time O(n D^2 + n^2 D), independent of the head count h at fixed D;
memory O(h n^2 + n D), dominated by the attention weights. For one full
self-attention layer (`multi_head_attention`) at each size:
  * time: median wall-clock of `repeats` jitted forward calls;
  * FLOPs: XLA's cost analysis of the forward program (not for the
    blockwise path, whose loop bodies XLA counts once), next to the closed
    form 8nD^2 + 4n^2D;
  * memory: XLA's `memory_analysis().temp_size_in_bytes` of the compiled
    forward+backward program (the scratch a training step needs beyond its
    inputs and outputs); deterministic, unlike process RSS.
Slopes are least-squares fits of log(y) on log(x) (`timing.loglog_slope`).
`experiments.cost_scaling` runs the sweeps of configs/cost_scaling.py and
writes the report.
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp

from mha_jax.core import flops as flops_lib
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.measure import timing


def measure_point(path, batch, n, d_model, heads, repeats) -> dict:
  """Time, XLA FLOPs and fwd+bwd scratch bytes of one layer at one size."""
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), d_model, heads)
  x = jax.random.normal(jax.random.PRNGKey(1), (batch, n, d_model))
  fwd = lambda p, x: multi_head.multi_head_attention(p, x,
                                                     implementation=path)
  train = jax.grad(lambda p, x: jnp.sum(fwd(p, x)), argnums=(0, 1))
  compiled = jax.jit(fwd).lower(params, x).compile()
  times, _ = timing.wall_times(compiled, (params, x), warmup=1,
                               repeats=repeats)
  mem = jax.jit(train).lower(params, x).compile().memory_analysis()
  point = {"path": path, "B": batch, "n": n, "D": d_model, "h": heads,
           "time_ms": 1e3 * statistics.median(times),
           "train_temp_bytes": int(mem.temp_size_in_bytes),
           "analytic_flops": flops_lib.analytic_mha_flops(batch, n, d_model)}
  if path != "flash":
    point["xla_flops"] = flops_lib.xla_flops(fwd, params, x)
  print(f"{path} n={n} h={heads}: {point['time_ms']:.1f} ms, "
        f"{point['train_temp_bytes'] / 2**20:.1f} MiB", flush=True)
  return point


def paths(config) -> list[str]:
  """The implementations named by `config.paths` (comma-separated)."""
  return [p.strip() for p in config.paths.split(",") if p.strip()]


def sweep(config) -> tuple[list[dict], list[dict]]:
  """`(against_heads, against_length)`: points of `measure_point`.

  Against h at n = `config.head_n`, then against n at h =
  `config.length_heads`, both at `config.d_model` and `config.batch`.
  """
  d, b = config.d_model, config.batch
  heads = [measure_point(p, b, config.head_n, d, h, config.repeats)
           for p in paths(config) for h in config.heads]
  length = [measure_point(p, b, n, d, config.length_heads, config.repeats)
            for p in paths(config) for n in config.n]
  return heads, length


def series(points, path, key, along):
  """`(xs, ys)`: `key` of `path`'s points that have it, sorted by `along`."""
  pts = sorted((p for p in points if p["path"] == path and key in p),
               key=lambda p: p[along])
  return [p[along] for p in pts], [p[key] for p in pts]


def length_slopes(points, fit_points) -> dict:
  """path -> {"time", "memory", "xla_flops"}: log-log slopes over the
  `fit_points` largest n ("xla_flops" only for paths XLA counts)."""
  out = {}
  for path in sorted({p["path"] for p in points}):
    ns, ts = series(points, path, "time_ms", "n")
    _, ms = series(points, path, "train_temp_bytes", "n")
    out[path] = {
        "time": timing.loglog_slope(ns[-fit_points:], ts[-fit_points:]),
        "memory": timing.loglog_slope(ns[-fit_points:], ms[-fit_points:])}
    ns, fl = series(points, path, "xla_flops", "n")
    if fl:
      out[path]["xla_flops"] = timing.loglog_slope(ns[-fit_points:],
                                                   fl[-fit_points:])
  return out


def head_effects(points) -> dict:
  """path -> how its cost moves with h at fixed n: "time_max_over_min",
  "memory_slope" (log-log, scratch bytes on h) and, for paths XLA counts,
  "xla_flops_max_over_min"."""
  out = {}
  for path in sorted({p["path"] for p in points}):
    hs, ts = series(points, path, "time_ms", "h")
    _, ms = series(points, path, "train_temp_bytes", "h")
    out[path] = {"time_max_over_min": max(ts) / min(ts),
                 "memory_slope": timing.loglog_slope(hs, ms)}
    _, fl = series(points, path, "xla_flops", "h")
    if fl:
      out[path]["xla_flops_max_over_min"] = max(fl) / min(fl)
  return out
