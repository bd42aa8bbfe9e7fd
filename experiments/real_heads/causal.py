"""Causal tests: the loss with a set of heads ablated, against random sets.

Shape letters: N inputs, L layers, H heads, T tokens, Dv head width, P
scored positions, D draws.

A head is ablated by replacing its output `z` (before W^O) at every
position: by zeros (zero ablation) or by its mean over the inputs at that
position (mean ablation; `scores.measure` returns the mean). `loss`
gives each input's mean next-token loss over the scored positions with
the heads of `heads` ablated; `random_sets` the draws of k heads (without
replacement within a set, none of them a named head) that a top-k set is
compared with. `attribution`
is the first-order estimate of every single head's effect at once (the
gradient of the loss with respect to the blend from clean to ablated,
attribution patching): cheap, so it chooses which heads to ablate one at a
time, and the ablation itself is what the report quotes.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.real_heads import scores


def selection(heads, num_layers: int, num_heads: int) -> np.ndarray:
  """`[L, H]` float: 1 at each (layer, head) of `heads`, 0 elsewhere."""
  s = np.zeros((num_layers, num_heads), np.float32)
  for l, h in heads:
    if not (0 <= l < num_layers and 0 <= h < num_heads):
      raise ValueError(f"selection: head ({l}, {h}) is outside the model's "
                       f"{num_layers} layers x {num_heads} heads")
    s[l, h] = 1.0
  return s


def loss(model, ids, positions, heads, replacement, *, chunk: int
         ) -> np.ndarray:
  """`[N]` each input's mean loss over `positions` with `heads` (a list
  of (layer, head)) replaced by `replacement [L, T, H, Dv]`."""
  c = model.config
  out = scores.measure(model, ids, np.ones(ids.shape[1], bool), chunk=chunk,
                       local=0, positions=positions, with_scores=False,
                       select=selection(heads, c.num_layers, c.num_heads),
                       replacement=replacement)
  return out["nll"].mean(1)


def random_sets(num_layers: int, num_heads: int, k: int, draws: int, *,
                seed: int, exclude=()) -> list[list[tuple[int, int]]]:
  """`draws` sets of k distinct (layer, head), uniform over the heads not
  in `exclude` (the named sets a draw is compared with: a control that
  could hold a named head would measure part of that head's effect)."""
  banned = {(int(l), int(h)) for l, h in exclude}
  pool = [i for i in range(num_layers * num_heads)
          if divmod(i, num_heads) not in banned]
  if len(pool) < k:
    raise ValueError(f"random_sets: `k`={k} heads must be drawn from the "
                     f"{num_layers * num_heads} heads less the "
                     f"{len(banned)} of `exclude`, leaving {len(pool)}")
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(draws):
    flat = rng.choice(pool, k, replace=False)
    out.append([(int(i // num_heads), int(i % num_heads)) for i in flat])
  return out


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _gradient(graphdef, state, ids, positions, replacement):
  """d (summed loss at `positions`) / d select at select = 0, `[L, H]`."""
  model = nnx.merge(graphdef, state)
  n = model.config.num_layers
  site = f"blocks.{n - 1}.resid_post"
  targets = jnp.pad(ids[:, 1:], ((0, 0), (0, 1)))

  def f(select):
    _, acts = model(ids, capture=(site,),
                    patch=scores.patch_heads(select, replacement, n))
    return scores.loss_at(model, acts[site], targets, positions).sum()
  zeros = jnp.zeros((n, model.config.num_heads), jnp.float32)
  return jax.grad(f)(zeros)


def attribution(model, ids, positions, replacement, *, chunk: int
                ) -> np.ndarray:
  """`[L, H]` first-order estimate of each head's effect alone on the
  mean loss over inputs and `positions` (the gradient with respect to the
  blend from clean, 0, to ablated, 1)."""
  graphdef, state = nnx.split(model)
  total = 0.0
  for i in range(0, len(ids), chunk):
    total = total + np.asarray(_gradient(
        graphdef, state, jnp.asarray(ids[i:i + chunk]),
        jnp.asarray(positions), jnp.asarray(replacement)))
  return total / (len(ids) * len(positions))
