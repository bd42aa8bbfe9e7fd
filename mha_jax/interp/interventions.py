"""Which heads matter? Ablation, gradient importance and pruning.

Shape letters: L layers, H heads per layer, B batch, T length, D d_model.

Every model in `mha_jax.models.transformer` takes a per-head gate `head_mask [L, H]`
at call time (a patch of each layer's `z` hook site: head h of layer l is
multiplied by it before W^O). Ways to score a head against the task loss,
reported side by side because they can disagree:

  * zero ablation: the loss with the gate at 0, minus the clean loss;
  * mean ablation: the head's output `z` replaced by its mean over the
    batch AT EACH POSITION (a causal head's output depends on where it
    sits, so a mean over positions would also remove the positional part);
    keeps the "average" signal a later layer may rely on;
  * resample ablation: the head's output on ANOTHER input of the batch, at
    the same position (the batch rolled by one: example b gets example
    b-1's `z`), so the head still produces a typical output, just not the
    one for this input;
  * Taylor estimate: -d loss / d gate at gate = 1 on the batch, the
    first-order prediction of zero ablation. At a trained optimum the batch
    gradient is ~0 for every head and its sign is noise;
  * Michel et al. (2019)'s importance: the expected ABSOLUTE gradient
    per example (`per_example_gradient_importance`), optionally normalised
    by its l2 norm within each layer (`normalise_per_layer`), which is what
    their pruning ranks by (`iterative_prune_curve` recomputes it after
    every removal, as they do).

Under grouped-query attention (K < H kv heads) every score is per QUERY
head: its gate and its `z` are its own even where its keys and values are
shared with its group, so removing one query head leaves the others of
its group as they were (to remove a kv head, patch `k` or `v`:
`mha_jax.hooks`).

`mask_arg` selects which gates: "head_mask" (decoder self-attention) or
"cross_head_mask" / "encoder_head_mask" of an `EncoderDecoder`.
These functions are jitted inside: they are analysis drivers, not library
math.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mha_jax.training import train_state
from mha_jax.models import transformer

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


def _gated(graphdef, state, batch, gates, loss, mask_arg):
  """The loss of the model `(graphdef, state)` on `batch` with its heads
  gated by `gates [L, H]` (through the `mask_arg` call argument)."""
  m = nnx.merge(graphdef, state)
  return train_state.compute_loss(m, batch, loss, **{mask_arg: gates})[0]


# Compiled at module level with the model's structure static, so that every
# model of one structure (seeds, checkpoints, pruned copies) and every batch
# of one shape share one program; a closure jitted per call compiled anew
# each time.
_STATIC = ("graphdef", "loss", "mask_arg")
_gated_loss = jax.jit(_gated, static_argnames=_STATIC)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _gate_gradient(graphdef, state, batch, gates, loss, mask_arg):
  return jax.grad(_gated, argnums=3)(graphdef, state, batch, gates, loss,
                                     mask_arg)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _mean_abs_example_gradient(graphdef, state, batch, gates, loss,
                               mask_arg):
  def one(example):  # a batch of one
    example = jax.tree.map(lambda x: x[None], example)
    return jax.grad(_gated, argnums=3)(graphdef, state, example, gates, loss,
                                       mask_arg)
  return jnp.mean(jnp.abs(jax.vmap(one)(batch)), 0)


def loss_fn(model, batch, loss, mask_arg="head_mask"):
  """A jitted `(gates [L, H], state=None) -> loss` for `model` on `batch`.

  `state` (from `nnx.state`) swaps in other values of the same model's
  variables without recompiling; None uses the model's current ones.
  """
  gate_shape(model, mask_arg)  # a bad `mask_arg` fails here, by name
  graphdef, state0 = nnx.split(model)
  return lambda gates, state=None: _gated_loss(
      graphdef, state0 if state is None else state, batch, gates, loss=loss,
      mask_arg=mask_arg)


def gradient_importance(model, batch, loss, mask_arg="head_mask"):
  """`d loss / d gate` at all gates 1, `[L, H]` (negative: head helps)."""
  graphdef, state = nnx.split(model)
  gates = jnp.ones(gate_shape(model, mask_arg))
  return np.asarray(_gate_gradient(graphdef, state, batch, gates, loss=loss,
                                   mask_arg=mask_arg))


def _per_example_abs_grad(model, batch, loss, mask_arg):
  """A jitted `gates [L, H] -> mean_b |d loss_b / d gate| [L, H]`."""
  gate_shape(model, mask_arg)
  graphdef, state = nnx.split(model)
  return lambda gates: _mean_abs_example_gradient(
      graphdef, state, batch, gates, loss=loss, mask_arg=mask_arg)


def per_example_gradient_importance(model, batch, loss,
                                    mask_arg="head_mask", gates=None):
  """Michel et al.'s importance: mean over examples of |d loss_b / d gate|.

  `[L, H]`, at `gates` (all 1 by default; pruned heads at 0). The batch
  gradient of a trained model is ~0 for every head: scaling a head's gate
  is the same as scaling its rows of W^O, which training has already
  brought to a stationary point. Taking the absolute value per example
  (before averaging) keeps the heads whose gate matters for each input but
  pulls different ways across inputs.
  """
  gates = jnp.ones(gate_shape(model, mask_arg)) if gates is None else gates
  return np.asarray(_per_example_abs_grad(model, batch, loss, mask_arg)(
      jnp.asarray(gates, jnp.float32)))


def normalise_per_layer(importance) -> np.ndarray:
  """Each layer's scores divided by their l2 norm (Michel et al. 2019).

  `[L, H] -> [L, H]`. Layers whose gradients differ in scale then compete
  on equal terms when heads are ranked across layers. A layer of zeros
  stays zero.
  """
  imp = np.asarray(importance, np.float64)
  norm = np.linalg.norm(imp, axis=-1, keepdims=True)
  return np.where(norm > 0, imp / np.where(norm > 0, norm, 1.0), 0.0)


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


def position_mean(z):
  """Each position's mean over the batch, `[B, T, H, Dv] -> [1, T, H, Dv]`."""
  return jnp.mean(z, axis=0, keepdims=True)


def resample(z):
  """Another example's output at the same position: the batch rolled by 1.

  `[B, T, H, Dv]`, example b gets example b-1's row (a derangement for
  B > 1, so no example keeps its own output). Examples are i.i.d. draws
  of the task, so this is a draw from the head's output distribution.
  """
  return jnp.roll(z, 1, axis=0)


def replacement_ablation(model, batch, loss, replace, mask_arg="head_mask"):
  """Loss increase when each head's `z` alone is swapped for `replace(z)`.

  `[L, H]`. `replace` maps the head outputs of a layer `[B, T, H, Dv]` to
  what replaces them (broadcastable; `position_mean`, `resample`). It sees
  what the layer computes on this batch in the same forward pass (layers
  below are unchanged). One compiled loss serves every head: which head to
  replace is an array, not a Python int.
  """
  n_layers, n_heads = gate_shape(model, mask_arg)
  sites = tuple(z_sites(model, mask_arg))
  graphdef, state = nnx.split(model)
  f = lambda select: _replaced_loss(graphdef, state, batch, select, loss=loss,
                                    replace=replace, sites=sites)
  zeros = jnp.zeros((n_layers, n_heads))
  clean = float(f(zeros))
  out = np.zeros((n_layers, n_heads))
  for l in range(n_layers):
    for h in range(n_heads):
      out[l, h] = float(f(zeros.at[l, h].set(1.0))) - clean
  return out


@functools.partial(jax.jit,
                   static_argnames=("graphdef", "loss", "replace", "sites"))
def _replaced_loss(graphdef, state, batch, select, loss, replace, sites):
  """The loss with the heads where `select [L, H]` is 1 replaced by
  `replace(z)` at their `z` hook `sites` (one per layer)."""
  def swap(l):
    def fn(z):  # [B, T, H, Dv]
      sel = select[l].astype(z.dtype)[None, None, :, None]
      return z * (1 - sel) + replace(z) * sel
    return fn

  m = nnx.merge(graphdef, state)
  patch = {site: swap(l) for l, site in enumerate(sites)}
  return train_state.compute_loss(m, batch, loss, patch=patch)[0]


def mean_ablation(model, batch, loss, mask_arg="head_mask"):
  """Loss increase with each head's `z` at its per-position batch mean."""
  return replacement_ablation(model, batch, loss, position_mean, mask_arg)


def resample_ablation(model, batch, loss, mask_arg="head_mask"):
  """Loss increase with each head's `z` taken from another example."""
  return replacement_ablation(model, batch, loss, resample, mask_arg)


def head_importance(model, batch, loss, mask_arg="head_mask"):
  """Every score of the module docstring, `[L, H]` each, and the clean loss.

  Keys: clean_loss, zero_ablation, mean_ablation, resample_ablation,
  gradient (batch d loss / d gate), taylor_estimate (-gradient),
  gradient_abs (Michel et al.'s expected |gradient|) and michel
  (gradient_abs normalised per layer).
  """
  ones = jnp.ones(gate_shape(model, mask_arg))
  grad = gradient_importance(model, batch, loss, mask_arg)
  f = loss_fn(model, batch, loss, mask_arg)
  grad_abs = per_example_gradient_importance(model, batch, loss, mask_arg)
  return {
      "clean_loss": float(f(ones)),
      "zero_ablation": zero_ablation(model, batch, loss, mask_arg, f=f),
      "mean_ablation": mean_ablation(model, batch, loss, mask_arg),
      "resample_ablation": resample_ablation(model, batch, loss, mask_arg),
      "gradient": grad,
      # Taylor: loss(gate=0) - loss(gate=1) ~ -d loss/d gate.
      "taylor_estimate": -grad,
      "gradient_abs": grad_abs,
      "michel": normalise_per_layer(grad_abs),
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


def iterative_prune_curve(model, rank_batch, test_batch, loss,
                          mask_arg="head_mask"):
  """Michel et al.'s pruning: re-rank after every removal.

  At each step the per-layer normalised |gradient| importance is computed
  on `rank_batch` with the heads removed so far gated to 0, and the least
  important remaining head goes next. Returns `(losses [L*H + 1] on
  `test_batch`, order [L*H] of flat indices l * H + h)`.
  """
  importance = _per_example_abs_grad(model, rank_batch, loss, mask_arg)
  f = loss_fn(model, test_batch, loss, mask_arg)
  shape = gate_shape(model, mask_arg)
  gates = np.ones(shape, np.float32)
  losses, order = [float(f(jnp.asarray(gates)))], []
  for _ in range(gates.size):
    score = normalise_per_layer(importance(jnp.asarray(gates))).ravel()
    score[np.asarray(order, int)] = np.inf  # removed heads stay removed
    idx = int(np.argmin(score))
    order.append(idx)
    gates.ravel()[idx] = 0.0
    losses.append(float(f(jnp.asarray(gates))))
  return np.asarray(losses), np.asarray(order)


def rank_correlation(a, b) -> float:
  """Spearman correlation of two score arrays (ties broken by position)."""
  ra = np.argsort(np.argsort(np.ravel(a)))
  rb = np.argsort(np.argsort(np.ravel(b)))
  if np.std(ra) == 0 or np.std(rb) == 0:
    return float("nan")
  return float(np.corrcoef(ra, rb)[0, 1])
