"""How wide must one head be? Fit a head's score map to a target pattern.

Shape letters: n positions, D input width, d_k head width.

A head's scores `X W_q W_k^T X^T / sqrt(d_k)` have rank <= d_k, and a
softmax ignores one constant per row, so a head of width n - 1 can produce
any full-support n x n attention pattern while narrower heads cannot in
general. `fit_attention` measures that bottleneck: it fits W_q, W_k of one
width to a random target by gradient descent and reports what is left.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax


def fit_attention(target, x, d_k: int, *, steps: int, lr: float, key):
  """Fit one head's W_q, W_k `[D, d_k]` to `target [n, n]` (rows sum to 1).

  `x` is `[n, D]`, one row per position. Minimises the mean over rows of
  KL(target || softmax(x W_q W_k^T x^T / sqrt(d_k))) with Adam, full batch,
  no mask. Returns the final mean KL (nats) and the largest absolute weight
  error, both scalars.
  """
  d = x.shape[1]
  kq, kk = jax.random.split(key)
  params = (jax.random.normal(kq, (d, d_k)) / np.sqrt(d),
            jax.random.normal(kk, (d, d_k)) / np.sqrt(d))
  # Decay to 1% of lr: the last steps polish the fit, so the error floor is
  # the representable error, not optimiser noise.
  tx = optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.01))
  log_target = jnp.log(target)

  def predicted_log(p):
    logits = (x @ p[0]) @ (x @ p[1]).T / np.sqrt(d_k)  # [n, n]
    return jax.nn.log_softmax(logits, axis=-1)

  def kl(p):
    return jnp.mean(jnp.sum(target * (log_target - predicted_log(p)), -1))

  def step(carry, _):
    p, opt = carry
    g = jax.grad(kl)(p)
    updates, opt = tx.update(g, opt, p)
    return (optax.apply_updates(p, updates), opt), None

  (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), None,
                                length=steps)
  err = jnp.max(jnp.abs(jnp.exp(predicted_log(params)) - target))
  return kl(params), err


def random_targets(key, num: int, n: int, temperature: float):
  """`num` random row-stochastic `[n, n]` targets with full support:
  softmax(temperature * N(0, 1) logits) per row, `[num, n, n]`."""
  logits = temperature * jax.random.normal(key, (num, n, n))
  return jax.nn.softmax(logits, axis=-1)


@functools.partial(jax.jit, static_argnames=("d_k", "steps", "lr"))
def _fit_all(targets, xs, keys, *, d_k, steps, lr):
  return jax.vmap(lambda t, x, k: fit_attention(
      t, x, d_k, steps=steps, lr=lr, key=k))(targets, xs, keys)


def width_sweep(num_targets: int, *, n: int, d_model: int, steps: int,
                lr: float, temperature: float) -> dict:
  """Fit every width d_k = 1..n to the same `num_targets` random targets.

  Targets, inputs `x [n, d_model]` and initial keys come from fixed keys
  (100, 200, 300), so a sweep is reproducible. Returns `{"d_k": [n],
  "kl": [n][num_targets], "max_error": [n][num_targets]}` (lists).
  """
  targets = random_targets(jax.random.PRNGKey(100), num_targets, n,
                           temperature)
  xs = jax.random.normal(jax.random.PRNGKey(200), (num_targets, n, d_model))
  keys = jax.random.split(jax.random.PRNGKey(300), num_targets)
  out = {"d_k": [], "kl": [], "max_error": []}
  for d_k in range(1, n + 1):
    kl, err = _fit_all(targets, xs, keys, d_k=d_k, steps=steps, lr=lr)
    out["d_k"].append(d_k)
    out["kl"].append(np.asarray(kl).tolist())
    out["max_error"].append(np.asarray(err).tolist())
  return out
