"""The softmax of attention rows: float32, -inf as zero weight, empty rows 0.

Shape letters: Tk key length; `...` any leading axes ([B, H, Tq] for
attention scores).

The project's policies for the softmax, held by every path that forms the
weights (the blockwise kernel keeps the same ones in its online form):
  * a forbidden key has score -inf and gets exactly zero weight;
  * a row with no allowed key gets weights 0 (not NaN, not uniform), with
    finite gradients;
  * the softmax runs in float32 whatever the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.core import score_rules


@jax.custom_jvp
def softmax_rows(x: jax.Array) -> jax.Array:
  """Softmax over the last axis of float32 `x` that may hold -inf; 0 rows."""
  row_max = jnp.max(x, axis=-1, keepdims=True)
  # An empty row has max -inf; shift by 0 so that exp gives 0, not NaN.
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  e = jnp.exp(x - row_max)
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


@softmax_rows.defjvp
def _softmax_rows_jvp(primals, tangents):
  # The softmax derivative y * (dx - <y, dx>), written once instead of
  # letting autodiff trace max/exp/sum/divide: the backward pass then makes
  # two passes over [.., Tq, Tk] instead of about six, which halves the
  # reference path's forward+backward time (experiments/benchmark/). A
  # masked key or an empty row has y = 0 and so receives no gradient; the
  # rule is linear in dx, so JAX transposes it for reverse mode and can
  # differentiate it again (Hessians, jax.jacfwd).
  (x,), (x_dot,) = primals, tangents
  y = softmax_rows(x)
  return y, y * (x_dot - jnp.sum(y * x_dot, axis=-1, keepdims=True))


def softmax_with_sink(scores: jax.Array, sinks: jax.Array | None):
  """The softmax of rows of `scores [..., Tk]` with one extra column of
  logit `sinks` (broadcast to `[..., 1]`) that is dropped afterwards: the
  weights of the real keys, summing to 1 minus the sink's share."""
  if sinks is None:
    return softmax_rows(scores)
  column = jnp.broadcast_to(sinks.astype(jnp.float32),
                            scores.shape[:-1] + (1,))
  return softmax_rows(jnp.concatenate([scores, column], axis=-1))[..., :-1]


def masked_softmax(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
  """float32 softmax over the last axis; masked keys and empty rows give 0."""
  logits = logits.astype(jnp.float32)
  if mask is not None:
    logits = score_rules.forbid(logits, mask)
  return softmax_rows(logits)
