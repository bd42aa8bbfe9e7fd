"""Activation patching and the direct path of heads, scored by the IOI logit
difference per prompt.

Shape letters: N prompts, T tokens, L layers, H query heads, K kv heads,
Dv per-head value width, D d_model, P patches, R roles.

Activation patching is the library's (`mha_jax.interp.patching`) at
per-example positions: each prompt's S1, IO, S2 and END sit at their own
positions (eight templates, two orders), so a patch is (layer, head,
role) with the role's `[N, T]` mask, and every patched run's logit
difference is kept per prompt (`normalise=False`), so that a head's
effect gets a bootstrap interval over prompts (`stats.py`). The model it
runs is the END-only forward pass (`forward.end_logits`). Path patching
is the IOI task's (`experiments/ioi_task/paths.py`): Wang et al.'s form
(every other head frozen while the MLPs recompute) and receivers in
several layers at once are not the library's.

Direction. `source` activations are patched into the `target` run:
noising (Wang et al.'s direction) is ABC into clean, and the drop of the
logit difference measures what the clean run NEEDS from that head;
denoising is clean into ABC, what the head restores on its own.

Heads are query heads at `z` (`blocks.{l}.attn.z`, `[N, T, H, Dv]`):
under GQA a query head's own output. A path into keys or values reaches
a kv head, shared by `H // K` query heads (SmolLM2: 3), so it is said of
the group (`hooks.query_heads`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from experiments.ioi_task import forward
from experiments.ioi_task import paths
from mha_jax.interp import patch_positions
from mha_jax.interp import patching

ROLES = ("all", "S1", "IO", "S2", "END", "rest")


def role_masks(meta: dict, length: int, roles=ROLES) -> jax.Array:
  """`[R, N, T]` bool: where each role's patch applies ("all": every
  position; "rest": every position but the four roles'; else the role's
  position in each prompt)."""
  at = {"S1": meta["s1_pos"], "IO": meta["io_pos"], "S2": meta["s2_pos"],
        "END": meta["end"]}
  return patch_positions.role_masks(at, length, roles)


def activation_patching(model, target, source, meta, masks, *,
                        layers=None, batch_size=None) -> jax.Array:
  """`[L', H, R, N]`: the logit difference of the `target` run `[N, T]`
  with head (l, h)'s `z` replaced by the `source` run's at role r's
  positions (`masks [R, N, T]`, `role_masks`); `meta`'s `end`, `io`, `s`
  name the prompts' END and the two names. `layers=(start, stop)` patches
  the heads of those layers only (L' = stop - start; None: every layer),
  and each patched run starts at block `start` from the target run's
  stream there, so later layers cost fewer blocks."""
  start, stop = layers or (0, model.config.num_layers)
  sites = paths.z_sites(model.config.num_layers)[start:stop]
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  entry = f"blocks.{start}.resid_pre"
  _, tgt = forward.end_logits(model, target, end, capture=(entry,))

  def run(tokens, capture=(), patch=None):
    # Called as the model: logits, with what it captured when asked. The
    # library captures the source run (no patch: every block) and patches
    # the target run, which starts at block `start` from the target's
    # stream there.
    later = {} if patch is None else {"start": start, "stream": tgt[entry]}
    logits, got = forward.end_logits(model, tokens, end, capture=capture,
                                     patch=patch, **later)
    return (logits, got) if capture else logits

  out = patching.activation_patching(
      run, source, target, lambda logits: forward.logit_diff(logits, io, s),
      sites, positions=masks, normalise=False, batch_size=batch_size)
  return jnp.stack([out[site] for site in sites])  # [L', H, R, N]


def direct_path(model, target, source, meta) -> jax.Array:
  """`[L, H, N]`: the target run's logit difference when only the direct
  path of head (l, h) to the readout carries its source output: its
  change added to the final stream at END, read through the final norm
  (recomputed, not frozen) and the readout. No block runs again, so
  every head costs one norm and one dot product."""
  paths.check_blocks(model, "direct_path")
  if model.config.final_soft_cap is not None:
    raise ValueError("direct_path: the logit difference is read as a dot "
                     "product with the readout, which a final soft cap "
                     "would bend; the model has final_soft_cap="
                     f"{model.config.final_soft_cap}")
  c = model.config
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  rows = jnp.arange(target.shape[0])
  deltas = paths.head_deltas(model, target, source, end)[:, rows, end]  # [L,N,H,D]
  last = f"blocks.{c.num_layers - 1}.resid_post"
  _, base = forward.end_logits(model, target, end, capture=(last,))
  x = base[last][rows, end][None, :, None] + deltas  # [L, N, H, D]
  if model.final_ln is not None:
    x = model.final_ln(x)
  u = forward.unembed(model, io) - forward.unembed(model, s)  # [N, D]
  bias = 0.0
  if model.readout is not None and model.readout.bias is not None:
    b = model.readout.bias[...]
    bias = (b[io] - b[s])[None, None]
  return jnp.einsum("lnhd,nd->lhn", x, u) + bias
