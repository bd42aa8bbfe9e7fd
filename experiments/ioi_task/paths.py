"""Path patching of heads (Wang et al. 2022), scored by the IOI logit
difference per prompt: a sender's change reaches chosen receivers'
queries, keys or values and nothing else.

Shape letters: N prompts, T tokens, L layers, H query heads, D d_model,
S senders.

A sender is one head or a set of heads patched together (a class tested
as a whole against random sets of its size), written as an `[L, H]`
bool mask; `(layer, head)` pairs are the one-head masks. Heads are query
heads at `z` (`blocks.{l}.attn.z`); a path into keys or values reaches a
kv head, shared by `H // K` query heads. Shared by the ioi experiment
(one head at a time) and ioi_classes (a class's heads jointly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from experiments.ioi_task import forward


def z_sites(num_layers: int) -> tuple:
  return tuple(f"blocks.{l}.attn.z" for l in range(num_layers))


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
  """`[S, N]`: the logit difference of the `target` run when sender s's
  change reaches the receivers' inputs and nothing else.

  `receivers`: `(layer, head, input)` triples, input "q" (head a query
  head), "k" or "v" (head a kv head: its whole group). `senders`: `[S, 2]`
  (layer, head) pairs, or `[S, L, H]` bool masks, each a set of heads
  whose changes are sent together; a head at or after a receiver's layer
  sends it nothing.

  With `through_mlps` (Wang et al.'s form), the sender's heads take their
  source `z` in a run where every other head's `z` is frozen at its
  target value while the MLPs recompute, so the change reaches the
  receivers directly and through the MLPs between, never through another
  head; the receivers' inputs from that run are then patched into the
  target run, and what follows the receivers runs normally. Without it,
  only the direct path counts: each receiver layer's q, k, v are
  recomputed from the target run's stream plus the senders' output terms
  (for a set in a sandwich model, the sum of its heads' terms, each
  normalised alone: the one-head case is exact, a set's is not).
  """
  check_blocks(model, "path_patching")
  c = model.config
  for r in receivers:
    if len(r) != 3 or r[2] not in ("q", "k", "v"):
      raise ValueError(f"path_patching: a receiver must be (layer, head, 'q'"
                       f" | 'k' | 'v'), got {r!r}")
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  senders = sender_masks(senders, c.num_layers, c.num_heads)
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
        on = sender[j]
        patch[site] = (lambda x, t=base[site], v=src[site],
                       on=on[None, None, :, None]: jnp.where(on, v, t))
      _, got = forward.end_logits(model, target, end, patch=patch,
                                  capture=inputs)
      return got
    # [L, N, T, D]: each layer's term of the sender's heads.
    d = jnp.einsum("lh,lnthd->lntd", sender.astype(deltas.dtype), deltas)
    got = {}
    for l, b in zip(layers, bases):
      moved = base[b] + d[:l].sum(0)
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




def sender_masks(senders, num_layers: int, num_heads: int) -> jax.Array:
  """`[S, L, H]` bool: `senders` as masks, from `[S, 2]` (layer, head)
  pairs (one head each) or already `[S, L, H]` masks."""
  senders = jnp.asarray(senders)
  if senders.ndim == 3 and senders.shape[1:] == (num_layers, num_heads):
    return senders.astype(bool)
  if senders.ndim == 2 and senders.shape[1] == 2:
    s = senders.astype(jnp.int32)
    return ((jnp.arange(num_layers)[None, :, None] == s[:, 0, None, None])
            & (jnp.arange(num_heads)[None, None, :] == s[:, 1, None, None]))
  raise ValueError(f"path_patching: `senders` must be [S, 2] (layer, head) "
                   f"pairs or [S, {num_layers}, {num_heads}] masks, got "
                   f"shape {tuple(senders.shape)}")
