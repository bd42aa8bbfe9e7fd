"""Which heads matter? Ablation, gradient importance and pruning.

Shape letters: L layers, H heads per layer, B batch, T length, D d_model.

Every model in `mha_jax.transformer` takes a per-head gate `head_mask [L, H]`
at call time (head h of layer l is multiplied by it before W^O). Three ways
to score a head against the task loss, reported side by side because they
can disagree:

  * zero ablation: the loss with the gate at 0, minus the clean loss;
  * mean ablation: the head's contribution replaced by its mean over the
    batch and positions (keeps the "average" signal a later layer may rely
    on, so it removes only the input-dependent part);
  * gradient importance: d loss / d gate at gate = 1. A first-order Taylor
    estimate predicts the zero-ablation change as -gradient; where the loss
    is far from linear in the gate (saturated softmax, redundant heads), the
    estimate and the real ablation differ. At a trained optimum the batch
    gradient is ~0 for every head (see `per_example_gradient_importance`,
    which averages |gradient| per example instead).

`mask_arg` selects which gates: "head_mask" (decoder self-attention) or
"cross_head_mask" / "encoder_head_mask" of an `EncoderDecoder`.
These functions are jitted inside: they are analysis drivers, not library
math.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mha_jax import train


def _attention_layers(model, mask_arg):
  """The `MultiHeadAttention` modules gated by `mask_arg`, one per layer."""
  if mask_arg == "head_mask":
    stack = model.decoder if hasattr(model, "decoder") else model.stack
    return [b.attn for b in stack.blocks], "attn", stack.blocks
  if mask_arg == "cross_head_mask":
    blocks = model.decoder.blocks
    return [b.cross for b in blocks], "cross", blocks
  if mask_arg == "encoder_head_mask":
    blocks = model.encoder.stack.blocks
    return [b.attn for b in blocks], "attn", blocks
  raise ValueError(f"`mask_arg` must be head_mask, cross_head_mask or "
                   f"encoder_head_mask, got {mask_arg!r}")


def gate_shape(model, mask_arg="head_mask"):
  """`(L, H)` of the gates `mask_arg` addresses."""
  layers, _, _ = _attention_layers(model, mask_arg)
  return len(layers), layers[0].dims.num_heads


def loss_fn(model, batch, loss, mask_arg="head_mask"):
  """A jitted `(gates [L, H], state=None) -> loss` for `model` on `batch`.

  `state` (from `nnx.state`) swaps in other values of the same model's
  variables without recompiling; None uses the model's current ones.
  """
  graphdef, state0 = nnx.split(model)

  def f(gates, state):
    m = nnx.merge(graphdef, state)
    return train.compute_loss(m, batch, loss, **{mask_arg: gates})[0]

  jitted = jax.jit(f)
  return lambda gates, state=None: jitted(
      gates, state0 if state is None else state)


def gradient_importance(model, batch, loss, mask_arg="head_mask"):
  """`d loss / d gate` at all gates 1, `[L, H]` (negative: head helps)."""
  graphdef, state = nnx.split(model)

  def f(gates):
    m = nnx.merge(graphdef, state)
    return train.compute_loss(m, batch, loss, **{mask_arg: gates})[0]

  return np.asarray(jax.jit(jax.grad(f))(jnp.ones(gate_shape(model, mask_arg))))


def per_example_gradient_importance(model, batch, loss,
                                    mask_arg="head_mask"):
  """Mean over examples of |d loss(example) / d gate|, `[L, H]`.

  The batch gradient of a trained model is ~0 for every head: scaling a
  head's gate is the same as scaling its rows of W^O, which training has
  already brought to a stationary point. Taking the absolute value per
  example (before averaging) keeps the heads whose gate matters for each
  input but pulls different ways across inputs (Michel et al., 2019).
  """
  graphdef, state = nnx.split(model)

  def f(gates, example):
    m = nnx.merge(graphdef, state)
    one = jax.tree.map(lambda x: x[None], example)  # a batch of one
    return train.compute_loss(m, one, loss, **{mask_arg: gates})[0]

  per_example = jax.jit(jax.vmap(jax.grad(f), in_axes=(None, 0)))(
      jnp.ones(gate_shape(model, mask_arg)), batch)  # [B, L, H]
  return np.asarray(jnp.mean(jnp.abs(per_example), axis=0))


def zero_ablation(model, batch, loss, mask_arg="head_mask", f=None):
  """Loss increase when each head alone is gated to 0, `[L, H]`.

  `f`: a `loss_fn` of the same model and batch to reuse (saves a compile).
  """
  f = f or loss_fn(model, batch, loss, mask_arg)
  n_layers, n_heads = gate_shape(model, mask_arg)
  ones = jnp.ones((n_layers, n_heads))
  clean = float(f(ones))
  out = np.zeros((n_layers, n_heads))
  for l in range(n_layers):
    for h in range(n_heads):
      out[l, h] = float(f(ones.at[l, h].set(0.0))) - clean
  return out


class _MeanAblated(nnx.Module):
  """Wraps one attention module; replaces selected heads by their mean.

  The contribution c of the heads where `select [H]` is 1,
  c = y(gates of those heads only) - y(no gates) `[B, T, D]`, is computed
  on the actual input, and the output becomes y - c + mean_{B,T}(c): layers
  below are unchanged, so this is the mean those heads produce on this
  batch. `select` is an array (not a Python int) so that one compiled loss
  serves every choice of heads.
  """

  def __init__(self, inner):
    self.inner = inner
    # What callers read off an attention module.
    self.dims = inner.dims
    self.implementation = inner.implementation
    self.select = nnx.Variable(jnp.zeros((inner.dims.num_heads,)))

  def __call__(self, *args, head_mask=None, return_weights=False, **kwargs):
    h = self.dims.num_heads
    gate = jnp.ones((h,)) if head_mask is None else jnp.asarray(head_mask)

    def call(g):
      return self.inner(*args, head_mask=g, return_weights=return_weights,
                        **kwargs)

    y_sel, y_none = call(gate * self.select[...]), call(jnp.zeros((h,)))
    out = call(gate)
    y, w = out if return_weights else (out, None)
    if return_weights:
      y_sel, y_none = y_sel[0], y_none[0]
    c = y_sel - y_none  # [B, T, D]
    y = y - c + jnp.mean(c, axis=(0, 1), keepdims=True)
    return (y, w) if return_weights else y


def mean_ablation(model, batch, loss, mask_arg="head_mask"):
  """Loss increase when each head is replaced by its mean output, `[L, H]`."""
  n_layers, n_heads = gate_shape(model, mask_arg)
  ablated = nnx.clone(model)
  _, attr, blocks = _attention_layers(ablated, mask_arg)
  wrappers = [_MeanAblated(getattr(b, attr)) for b in blocks]
  for block, wrapper in zip(blocks, wrappers):
    setattr(block, attr, wrapper)
  f = loss_fn(ablated, batch, loss, mask_arg)  # compiled once, state varies
  ones = jnp.ones((n_layers, n_heads))
  clean = float(f(ones, nnx.state(ablated)))
  out = np.zeros((n_layers, n_heads))
  for l in range(n_layers):
    for h in range(n_heads):
      wrappers[l].select[...] = jax.nn.one_hot(h, n_heads)
      out[l, h] = float(f(ones, nnx.state(ablated))) - clean
      wrappers[l].select[...] = jnp.zeros((n_heads,))
  return out


def head_importance(model, batch, loss, mask_arg="head_mask"):
  """All three scores, `[L, H]` each, plus the clean loss."""
  ones = jnp.ones(gate_shape(model, mask_arg))
  grad = gradient_importance(model, batch, loss, mask_arg)
  f = loss_fn(model, batch, loss, mask_arg)
  return {
      "clean_loss": float(f(ones)),
      "zero_ablation": zero_ablation(model, batch, loss, mask_arg, f=f),
      "mean_ablation": mean_ablation(model, batch, loss, mask_arg),
      "gradient": grad,
      # Taylor: loss(gate=0) - loss(gate=1) ~ -d loss/d gate.
      "taylor_estimate": -grad,
      "gradient_abs": per_example_gradient_importance(model, batch, loss,
                                                      mask_arg),
  }


def prune_curve(model, batch, loss, order, mask_arg="head_mask"):
  """Loss as heads are removed cumulatively in `order` (flat indices).

  `order` lists flat head indices `l * H + h`, least important first.
  Returns `losses [L*H + 1]`: `losses[k]` with the first k heads removed.
  """
  f = loss_fn(model, batch, loss, mask_arg)
  n_layers, n_heads = gate_shape(model, mask_arg)
  gates = np.ones(n_layers * n_heads, np.float32)
  losses = [float(f(jnp.asarray(gates.reshape(n_layers, n_heads))))]
  for idx in order:
    gates[idx] = 0.0
    losses.append(float(f(jnp.asarray(gates.reshape(n_layers, n_heads)))))
  return np.asarray(losses)


def rank_correlation(a, b) -> float:
  """Spearman correlation of two score arrays (ties broken by position)."""
  ra = np.argsort(np.argsort(np.ravel(a)))
  rb = np.argsort(np.argsort(np.ravel(b)))
  if np.std(ra) == 0 or np.std(rb) == 0:
    return float("nan")
  return float(np.corrcoef(ra, rb)[0, 1])
