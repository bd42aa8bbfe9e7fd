"""Which heads matter? Ablation, gradient importance and pruning.

Shape letters: L layers, H heads per layer, B batch, T length, D d_model.

Every model in `mha_jax.transformer` takes a per-head gate `head_mask [L, H]`
at call time (a patch of each layer's `z` hook site: head h of layer l is
multiplied by it before W^O). Three ways to score a head against the task
loss, reported side by side because they can disagree:

  * zero ablation: the loss with the gate at 0, minus the clean loss;
  * mean ablation: the head's output `z` replaced by its mean over the
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
from mha_jax import transformer

# The `z` hook site of layer l that each gate argument addresses.
_Z_SITES = {
    (transformer.DecoderLM, "head_mask"): "blocks.{}.attn.z",
    (transformer.EncoderDecoder, "head_mask"): "decoder.blocks.{}.attn.z",
    (transformer.EncoderDecoder, "cross_head_mask"):
        "decoder.blocks.{}.cross.z",
    (transformer.EncoderDecoder, "encoder_head_mask"):
        "encoder.blocks.{}.attn.z",
}


def z_sites(model, mask_arg="head_mask") -> list[str]:
  """The `z` hook site of every layer that `mask_arg` gates."""
  key = (type(model), mask_arg)
  if key not in _Z_SITES:
    valid = sorted(a for t, a in _Z_SITES if t is type(model))
    raise ValueError(f"`mask_arg` for a {type(model).__name__} must be one "
                     f"of {valid}, got {mask_arg!r}")
  return [_Z_SITES[key].format(l) for l in range(model.config.num_layers)]


def gate_shape(model, mask_arg="head_mask"):
  """`(L, H)` of the gates `mask_arg` addresses."""
  return len(z_sites(model, mask_arg)), model.config.num_heads


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


def mean_ablation(model, batch, loss, mask_arg="head_mask"):
  """Loss increase when each head's `z` is replaced by its mean over the
  batch and positions, `[L, H]`.

  The mean is taken in the same forward pass, over what the head computes
  on this batch (layers below are unchanged). One compiled loss serves
  every head: which head to replace is an array, not a Python int.
  """
  n_layers, n_heads = gate_shape(model, mask_arg)
  sites = z_sites(model, mask_arg)
  graphdef, state = nnx.split(model)

  def f(select):  # select [L, H]: 1 where the head is mean-ablated
    def to_mean(l):
      def fn(z):  # [B, T, H, Dv]
        mean = jnp.mean(z, axis=(0, 1), keepdims=True)
        sel = select[l].astype(z.dtype)[None, None, :, None]
        return z * (1 - sel) + mean * sel
      return fn

    m = nnx.merge(graphdef, state)
    patch = {site: to_mean(l) for l, site in enumerate(sites)}
    return train.compute_loss(m, batch, loss, patch=patch)[0]

  f = jax.jit(f)
  zeros = jnp.zeros((n_layers, n_heads))
  clean = float(f(zeros))
  out = np.zeros((n_layers, n_heads))
  for l in range(n_layers):
    for h in range(n_heads):
      out[l, h] = float(f(zeros.at[l, h].set(1.0))) - clean
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
