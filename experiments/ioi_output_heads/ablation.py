"""A set of heads mean-ablated together over the ABC distribution.

Shape letters: N prompts, T tokens, L layers, H query heads, Dv per-head
value width.

Wang et al. knock a head out by replacing its output with its mean over
the ABC prompts (three fresh names, nothing repeated) of the same
template at each position: what the head writes on IOI-shaped text that
tells it nothing about which name is S. Every prompt of one template has
its names at the same positions (all names are one token), so the mean
is taken per template and position. The heads are chosen by a `[L, H]`
mask, an argument of the compiled run: one program serves every group.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import forward
from experiments.ioi_task import knockout


def template_means(z, template) -> np.ndarray:
  """`[N, T, H, Dv]`: for each prompt, the mean of `z [N, T, H, Dv]` (one
  layer's head outputs on the ABC prompts) over the prompts of its
  template (`knockout.template_means` of one layer)."""
  return knockout.template_means(np.asarray(z)[None], template)[0]


def abc_means(model, corrupted, template, *, chunk: int) -> list:
  """`[L] x [N, T, H, Dv]`: `template_means` of every layer's `z` on the
  ABC prompts `corrupted [N, T]` (run `chunk` prompts at a time)."""
  sites = tuple(f"blocks.{l}.attn.z" for l in range(model.config.num_layers))
  n = len(corrupted)
  end = jnp.full((n,), corrupted.shape[1] - 1)
  z = {s: [] for s in sites}
  for i in range(0, n, chunk):
    _, got = forward.end_logits(model, jnp.asarray(corrupted[i:i + chunk]),
                                end[i:i + chunk], capture=sites)
    for s in sites:
      z[s].append(np.asarray(got[s]))
  return [template_means(np.concatenate(z[s]), template) for s in sites]


def ablated_logit_diff(model, tokens, meta, means, mask):
  """`[N]`: logit(IO) - logit(S) at END with the heads of `mask [L, H]`
  (bool) given their ABC mean output `means` (`[L] x [N, T, H, Dv]`, the
  prompts' own rows of `abc_means`) at every position: the shared
  knockout, keeping the heads outside `mask`."""
  return knockout.knocked_logit_diff(model, tokens, meta["end"], meta["io"],
                                     meta["s"], jnp.stack(means), ~mask)
