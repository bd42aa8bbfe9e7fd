"""Heads knocked out, the rest of the model live: the forward passes of
Wang et al.'s circuit criteria.

Shape letters: N prompts, T tokens, L layers, H query heads, Dv per-head
value width.

Wang et al. (2022, section 4) judge a circuit C (a set of heads) by
running the model with every head outside C knocked out: its output z
replaced by its mean over the ABC distribution, the prompts of the same
template with three fresh names, at each position; the heads of C and
every MLP run as they would, reading the knocked-out heads' means. So a
knockout is a replacement of z at the knocked heads by a value computed
beforehand (`template_means`, or `resampled` for resample ablation),
applied in one forward pass (`knocked_logit_diff`). Which heads are kept
is an array, not a static choice, so every circuit reuses one compiled
program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import forward


def z_sites(num_layers: int) -> list[str]:
  return [f"blocks.{l}.attn.z" for l in range(num_layers)]


def captured_z(model, tokens, end) -> jax.Array:
  """`[L, N, T, H, Dv]`: every head's z on `tokens [N, T]`."""
  sites = z_sites(model.config.num_layers)
  _, acts = forward.end_logits(model, tokens, end, capture=sites)
  return jnp.stack([acts[s] for s in sites])


def template_means(z, template) -> np.ndarray:
  """`[L, N, T, H, Dv]`: for each prompt, the mean of `z [L, N, T, H, Dv]`
  over the prompts of its own template (`template [N]`), position by
  position. The prompts of one template have their names at the same
  positions (single-token names), so a position means the same word in
  each; right padding repeats the last token and is never read."""
  z = np.asarray(z, np.float32)
  template = np.asarray(template)
  out = np.empty_like(z)
  for t in np.unique(template):
    rows = template == t
    out[:, rows] = z[:, rows].mean(1, keepdims=True)
  return out


def resample_partners(template, seed: int) -> np.ndarray:
  """`[N]`: for each prompt another prompt of the same template, drawn
  without fixed points (a random cyclic shift of each template's shuffled
  prompts), so no prompt reads its own activations."""
  template = np.asarray(template)
  rng = np.random.default_rng(seed)
  partner = np.arange(len(template))
  for t in np.unique(template):
    rows = np.flatnonzero(template == t)
    if len(rows) < 2:
      raise ValueError(f"resample_partners: template {int(t)} has "
                       f"{len(rows)} prompt; resampling needs at least 2 "
                       "per template")
    order = rng.permutation(rows)
    partner[order] = np.roll(order, -int(rng.integers(1, len(rows))))
  return partner


def _kept(replacement, keep, z):
  """z `[N, T, H, Dv]` at the heads where `keep [H]`, else the
  replacement."""
  return jnp.where(keep[None, None, :, None], z, replacement.astype(z.dtype))


def patch(replacement, keep) -> dict:
  """The model's `patch=`: the heads where `keep [L, H]` is False take
  their z from `replacement [L, N, T, H, Dv]`."""
  return {site: functools.partial(_kept, replacement[l], keep[l])
          for l, site in enumerate(z_sites(keep.shape[0]))}


def knocked_logit_diff(model, tokens, end, io, s, replacement, keep
                       ) -> jax.Array:
  """`[N]` logit(IO) - logit(S) at END with the heads where `keep [L, H]`
  is False taking their z from `replacement [L, N, T, H, Dv]`."""
  logits, _ = forward.end_logits(model, tokens, end,
                                 patch=patch(replacement, keep))
  return forward.logit_diff(logits, io, s)


def keep_mask(shape, knocked) -> np.ndarray:
  """`[L, H]` bool: True except at the `(layer, head)` pairs `knocked`."""
  keep = np.ones(shape, bool)
  for l, h in knocked:
    keep[l, h] = False
  return keep


def circuit_mask(shape, heads) -> np.ndarray:
  """`[L, H]` bool: True at the circuit's `heads` only (the rest knocked
  out)."""
  return ~keep_mask(shape, heads)
