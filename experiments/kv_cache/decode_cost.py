"""What a KV cache changes in decoding cost, measured on `DecoderLM`.

Shape letters: B batch, n tokens in context, S cache slots, D d_model,
H query heads, K key/value heads, Dh head width, F MLP width, L layers,
V vocabulary.

The measured model is the library's trained-model class,
`transformer.DecoderLM` (token embedding, L pre-LayerNorm attention + MLP
blocks, final LayerNorm, readout to V logits), which owns its cache: every
measurement calls it with `cache=` (one decode step) or without
(recomputing the whole prefix). `cfg` is a config like
`configs/kv_cache.py`: groups `model` (the measured sizes), `bench` (the
timing runs) and `heads` (the K compared).
"""

import functools

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import flops
from mha_jax.core import kv_cache
from mha_jax.measure import timing
from mha_jax.models import transformer


def make_model(cfg, num_kv_heads, seed=0):
  """The `DecoderLM` of `cfg.model` with `num_kv_heads` key/value heads."""
  m = cfg.model
  config = transformer.ModelConfig(
      vocab_size=m.vocab_size, d_model=m.d_model, num_layers=m.num_layers,
      num_heads=m.num_heads, num_kv_heads=num_kv_heads, mlp_dim=m.mlp_dim,
      max_len=m.max_len, positions=m.positions, attention_only=False,
      implementation=m.implementation)
  return transformer.DecoderLM(config, rngs=nnx.Rngs(seed))


def filled_caches(model, batch, slots, n, seed=0):
  """Caches whose first n slots hold random keys/values (cost ignores them)."""
  caches = []
  for i, c in enumerate(model.init_cache(batch, slots)):
    kk, kv = jax.random.split(jax.random.PRNGKey(seed + i))
    caches.append(c._replace(
        k=jax.random.normal(kk, c.k.shape, c.k.dtype),
        v=jax.random.normal(kv, c.v.shape, c.v.dtype),
        length=jnp.full((batch,), n, jnp.int32)))
  return tuple(caches)


def decode_step(graphdef, state, token, caches):
  """One cached decode step: `token [B]` -> logits `[B, V]`, caches, status.

  Pure in `(state, token, caches)` once `graphdef` is bound (see
  `split_model`), so it can be jitted, donated and traced for FLOPs.
  """
  model = nnx.merge(graphdef, state)
  logits, caches = model(token[:, None], cache=caches)
  return logits[:, 0], caches, kv_cache.status(caches)


def recompute(graphdef, state, tokens):
  """No cache: rerun the model over the whole prefix `tokens [B, n+1]` and
  return the last position's logits `[B, V]` (the readout still runs at
  every position, as a cacheless decoder would)."""
  return nnx.merge(graphdef, state)(tokens)[:, -1]


def split_model(model):
  """`(state, step, recompute)`: the model's state and the two pure
  functions `step(state, token, caches)`, `recompute(state, tokens)`."""
  graphdef, state = nnx.split(model)
  return (state, functools.partial(decode_step, graphdef),
          functools.partial(recompute, graphdef))


def analytic_flops(cfg, num_kv_heads, batch, n, *, cached, slots=None):
  """Matmul FLOPs (multiply-add = 2). Cached: one token over S slots.

  Per token and layer: the q, k, v, o projections and the two MLP matmuls;
  plus the readout, 2 D V per token whose logits are computed (the new one
  when cached, all n when recomputing). The embedding is a gather, and
  LayerNorm and rotary are elementwise: no matmul FLOPs.
  """
  m = cfg.model
  d, h, k, f, v = m.d_model, m.num_heads, num_kv_heads, m.mlp_dim, m.vocab_size
  dh = d // h
  per_token = 2 * d * (h + 2 * k) * dh + 2 * h * dh * d + 4 * d * f
  if cached:  # the new token's projections + QK^T and AV over all S slots
    per_layer = per_token + 4 * slots * h * dh
    readout = 2 * d * v
  else:  # every token's projections + the full n x n score matrix
    per_layer = n * per_token + 4 * n * n * h * dh
    readout = n * 2 * d * v
  return batch * (m.num_layers * per_layer + readout)


def _timed_step(step_fn, state, token, caches, bench):
  """XLA's cost analysis of one cached step, then `((median, min) wall
  seconds, final caches)` over `bench.repeats` calls after `bench.warmup`,
  each call donating its cache to the next (updated in place)."""
  cost = flops.xla_cost_analysis(step_fn, state, token, caches)
  step = jax.jit(step_fn, donate_argnums=2)
  times, (_, caches, status) = timing.median_time(
      step, (state, token, caches), warmup=bench.warmup,
      repeats=bench.repeats, feed_back=lambda a, out: (a[0], a[1], out[1]))
  kv_cache.raise_if_overflow(status)
  return cost, times


def bench_context(cfg, model, n):
  """Cached step and recomputation at context n: times and FLOPs."""
  b, m = cfg.bench, cfg.model
  slots = n + b.warmup + b.repeats  # room for every timed step
  state, step_fn, recompute_fn = split_model(model)
  caches = filled_caches(model, b.batch, slots, n)
  token = jax.random.randint(jax.random.PRNGKey(1), (b.batch,), 0,
                             m.vocab_size)
  row = {"n": n, "slots": slots,
         "cached_matmul_flops": flops.jaxpr_matmul_flops(
             step_fn, state, token, caches),
         "cached_analytic_flops": analytic_flops(
             cfg, m.num_kv_heads, b.batch, n, cached=True, slots=slots)}
  cost, (row["cached_s"], row["cached_min_s"]) = _timed_step(
      step_fn, state, token, caches, b)
  row.update(cached_xla_flops=cost.get("flops", 0.0),
             cached_xla_bytes=cost.get("bytes accessed", 0.0))
  if n <= b.nocache_max_context:
    tokens = jax.random.randint(jax.random.PRNGKey(2), (b.batch, n + 1), 0,
                                m.vocab_size)
    row["nocache_xla_flops"] = flops.xla_cost_analysis(
        recompute_fn, state, tokens).get("flops", 0.0)
    row["nocache_analytic_flops"] = analytic_flops(
        cfg, m.num_kv_heads, b.batch, n + 1, cached=False)
    (row["nocache_s"], row["nocache_min_s"]), _ = timing.median_time(
        jax.jit(recompute_fn), (state, tokens), warmup=1,
        repeats=b.nocache_repeats)
  logging.info("n=%d %s", n, {k: v for k, v in row.items() if "_s" in k})
  return row


def cache_bytes(cfg):
  """Bytes of the caches themselves (`.nbytes`) vs 2 L K Dh bytes/token."""
  h, m = cfg.heads, cfg.model
  rows = []
  for k in h.kv_heads:
    model = make_model(cfg, k)
    caches = model.init_cache(1, h.max_len)
    kv = sum(c.k.nbytes + c.v.nbytes for c in caches)
    rows.append({
        "num_kv_heads": k, "bytes_per_sequence": kv,
        "bytes_per_token": kv / h.max_len,
        "formula_bytes_per_token": 2 * m.num_layers * k
                                   * model.config.head_width
                                   * caches[0].k.dtype.itemsize,
        "length_bytes_per_sequence": sum(c.length.nbytes for c in caches)})
  mha = rows[0]["bytes_per_sequence"]
  for r in rows:
    r["fraction_of_first"] = r["bytes_per_sequence"] / mha
  return rows


def intensity(cfg):
  """FLOPs per byte moved (weights + cache read) of one decode step."""
  h, b = cfg.heads, cfg.bench
  rows = []
  for k in h.kv_heads:
    model = make_model(cfg, k)
    state, step_fn, _ = split_model(model)
    # Every parameter, the embedding table included, although a step
    # gathers only B of its rows (a small over-count: V D of the total).
    weight_bytes = sum(a.nbytes for a in jax.tree.leaves(state))
    for batch in h.batches:
      slots = h.context + b.warmup + b.repeats
      caches = filled_caches(model, batch, slots, h.context)
      cache_read = sum(c.k.nbytes + c.v.nbytes for c in caches)
      token = jnp.ones((batch,), jnp.int32)
      fl = analytic_flops(cfg, k, batch, h.context, cached=True, slots=slots)
      cost, (t, t_min) = _timed_step(step_fn, state, token, caches, b)
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


# Jitted once per model structure: the reference forward and the prefill.
@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens):
  return nnx.merge(graphdef, state)(tokens)


@functools.partial(jax.jit, static_argnums=0)
def _prefill(graphdef, state, tokens, caches, lengths):
  return nnx.merge(graphdef, state)(tokens, cache=caches, lengths=lengths)


def _rel_err(y, ref):
  """Relative error of each row of `y [..., V]`, in float64 NumPy."""
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(y - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def exactness(cfg, steps=8):
  """Largest relative error of the logits of prefill + decode vs the full
  forward, over a ragged batch of prompts (5, 9, 2)."""
  out = {}
  lens = jnp.array([5, 9, 2], jnp.int32)
  rows = jnp.arange(3)
  p = int(lens.max())
  for k in cfg.heads.kv_heads:
    model = make_model(cfg, k, seed=3)
    graphdef, state = nnx.split(model)
    step = jax.jit(functools.partial(decode_step, graphdef))
    full = jax.random.randint(jax.random.PRNGKey(4), (3, p + steps), 0,
                              cfg.model.vocab_size)  # [B, P + steps]
    ref = np.asarray(_forward(graphdef, state, full))  # [B, P + steps, V]
    # Row i's prompt is full[i, :lens[i]]; the rest of the first P tokens is
    # padding that prefill must not write.
    y, caches = _prefill(graphdef, state, full[:, :p],
                         model.init_cache(3, p + steps), lens)
    # Prefill: each prompt as one vector of its n x V logits.
    y = np.asarray(y)
    errs = [float(_rel_err(np.ravel(y[i, :n]), np.ravel(ref[i, :n])))
            for i, n in enumerate(np.asarray(lens))]
    for s in range(steps):
      y, caches, status = step(state, full[rows, lens + s], caches)
      errs.append(float(_rel_err(y, ref[np.asarray(rows),
                                        np.asarray(lens) + s]).max()))
    kv_cache.raise_if_overflow(status)
    out[str(k)] = max(errs)
  return out
