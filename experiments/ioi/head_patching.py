"""Activation and path patching of heads, scored by the IOI logit
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
stays here: Wang et al.'s form (every other head frozen while the MLPs
recompute) and receivers in several layers at once are not the
library's.

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


def z_sites(num_layers: int) -> tuple:
  return tuple(f"blocks.{l}.attn.z" for l in range(num_layers))


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
  sites = z_sites(model.config.num_layers)[start:stop]
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


def head_deltas(model, target, source, end) -> jax.Array:
  """`[L, N, T, H, D]`: how much what block l's attention adds to the
  stream changes when head h's `z` takes the source run's value, every
  other head's staying at the target run's.

  Pre-norm blocks add z W_O, so that is (z_src - z_tgt)_h W_O^h. A
  sandwich block (Gemma) adds its post-norm of the attention's output o,
  so the change is N'(o + d_h) - N'(o) with o the target run's and d_h
  the head's change of it: the norm recomputed, not frozen, which is
  where one head's change also rescales its layer's other heads."""
  c = model.config
  check_blocks(model, "head_deltas")
  sites = z_sites(c.num_layers)
  _, tgt = forward.end_logits(model, target, end, capture=sites)
  _, src = forward.end_logits(model, source, end, capture=sites)
  out = []
  for l, x in enumerate(sites):
    attn = model.blocks[l].attn
    d = jnp.einsum("nthe,hed->nthd", src[x] - tgt[x], attn.w_o[...])
    if c.norm_placement == "sandwich":
      post = model.blocks[l].ln_attn_post
      o = forward.attention_output(attn, tgt[x])[:, :, None]  # [N,T,1,D]
      d = post(o + d) - post(o)
    out.append(d)
  return jnp.stack(out)


def check_blocks(model, fn: str) -> None:
  """A head's change is a term added to a later stream only where blocks
  add attention's output to the stream without a norm after the sum:
  pre-norm and sandwich blocks, sequential."""
  placement = model.config.norm_placement
  if placement not in ("pre", "sandwich") or model.config.parallel_block:
    raise ValueError(f"{fn}: a head's change is a term added to the stream "
                     f"only in pre-norm or sandwich sequential blocks; the "
                     f"model has norm_placement={placement!r}, "
                     f"parallel_block={model.config.parallel_block}")


def path_patching(model, target, source, meta, receivers, senders, *,
                  through_mlps: bool = True, batch_size=None) -> jax.Array:
  """`[S, N]`: the logit difference of the `target` run when sender head
  (l, h)'s change reaches the receivers' inputs and nothing else.

  `receivers`: `(layer, head, input)` triples, input "q" (head a query
  head), "k" or "v" (head a kv head: its whole group). `senders [S, 2]`:
  (layer, head) pairs; a sender at or after a receiver's layer sends it
  nothing.

  With `through_mlps` (Wang et al.'s form), the sender's `z` takes its
  source value in a run where every other head's `z` is frozen at its
  target value while the MLPs recompute, so the change reaches the
  receivers directly and through the MLPs between, never through another
  head; the receivers' inputs from that run are then patched into the
  target run, and what follows the receivers runs normally. Without it,
  only the direct path counts: each receiver layer's q, k, v are
  recomputed from the target run's stream plus the sender's output term.
  """
  check_blocks(model, "path_patching")
  c = model.config
  for r in receivers:
    if len(r) != 3 or r[2] not in ("q", "k", "v"):
      raise ValueError(f"path_patching: a receiver must be (layer, head, 'q'"
                       f" | 'k' | 'v'), got {r!r}")
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  senders = jnp.asarray(senders, jnp.int32)
  layers = sorted({r[0] for r in receivers})
  bases = tuple(f"blocks.{l}.resid_pre" for l in layers)
  inputs = tuple(f"blocks.{l}.attn.{x}" for l in layers for x in "qkv")
  sites = z_sites(layers[-1]) if through_mlps else ()
  # One target run gives the receivers' inputs and, for Wang's form, the
  # heads' outputs they are frozen at.
  _, base = forward.end_logits(model, target, end,
                               capture=bases + inputs + sites)
  if through_mlps:
    _, src = forward.end_logits(model, source, end, capture=sites)
  else:
    deltas = head_deltas(model, target, source, end)

  def moved_inputs(sender):
    """{receiver layer's q/k/v site: value} when the sender's change
    reaches that layer."""
    if through_mlps:
      patch = {}
      for j, site in enumerate(sites):
        on = (j == sender[0]) & (jnp.arange(c.num_heads) == sender[1])
        patch[site] = (lambda x, t=base[site], v=src[site],
                       on=on[None, None, :, None]: jnp.where(on, v, t))
      _, got = forward.end_logits(model, target, end, patch=patch,
                                  capture=inputs)
      return got
    d = deltas[sender[0], :, :, sender[1]]  # [N, T, D]
    got = {}
    for l, b in zip(layers, bases):
      moved = base[b] + jnp.where(l > sender[0], 1.0, 0.0) * d
      new = forward.block_sites(model, l, moved,
                                tuple(f"attn.{x}" for x in "qkv"))
      got |= {f"blocks.{l}.attn.{x}": new[f"attn.{x}"] for x in "qkv"}
    return got

  def one(sender):
    new = moved_inputs(sender)
    patch = {}
    for l in layers:
      for x in "qkv":
        heads = [r[1] for r in receivers if r[0] == l and r[2] == x]
        if not heads:
          continue
        site = f"blocks.{l}.attn.{x}"
        on = jnp.isin(jnp.arange(base[site].shape[2]), jnp.asarray(heads))
        patch[site] = (lambda v, on=on[None, None, :, None],
                       n=new[site]: jnp.where(on, n, v))
    # Nothing before the first receiver's block changes: start there.
    logits, _ = forward.end_logits(model, target, end, patch=patch,
                                   start=layers[0], stream=base[bases[0]])
    return forward.logit_diff(logits, io, s)

  return jax.lax.map(one, senders, batch_size=batch_size)


def direct_path(model, target, source, meta) -> jax.Array:
  """`[L, H, N]`: the target run's logit difference when only the direct
  path of head (l, h) to the readout carries its source output: its
  change added to the final stream at END, read through the final norm
  (recomputed, not frozen) and the readout. No block runs again, so
  every head costs one norm and one dot product."""
  check_blocks(model, "direct_path")
  if model.config.final_soft_cap is not None:
    raise ValueError("direct_path: the logit difference is read as a dot "
                     "product with the readout, which a final soft cap "
                     "would bend; the model has final_soft_cap="
                     f"{model.config.final_soft_cap}")
  c = model.config
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  rows = jnp.arange(target.shape[0])
  deltas = head_deltas(model, target, source, end)[:, rows, end]  # [L,N,H,D]
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
