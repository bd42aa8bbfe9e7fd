"""What each head does on the clean prompts, per prompt: where it
attends from END and from S2, what it writes to the logit difference,
and what it would write if it copied the IO name.

Shape letters: N prompts, T tokens, L layers, H query heads, K kv heads,
Dv per-head value width, D d_model.

Every measure is `[N, L, H]` (one value per prompt and head), so that the
run can bootstrap over prompts and compare heads with each other:

  end_io, end_s    attention from END to IO, and to S1 + S2 (a name
                   mover attends to IO more than to S)
  s2_s1            attention from S2 to S1: a duplicate-token head
  s2_after_s1      attention from S2 to the token after S1: an induction
                   head (the token after S's first mention)
  after_s1_s1      attention from the token after S1 to S1: a previous-
                   token head, which an induction head's key reads
  dla              the head's output at END read out as the logit
                   difference, through the final norm (and a sandwich
                   block's post-norm) frozen at this run (its direct
                   effect; a name mover's is positive)
  copy             the head's value at IO (what it would move if it
                   attended there alone) read out the same way: the IO
                   name's logit minus the mean of the other names' (a
                   copying OV circuit makes it positive)
  copy_top1        1 where IO is the top name of that readout

The uniform floor of each attention measure is 1 / (query position + 1):
a head spreading its weight evenly over the causal past.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import forward
from mha_jax import hooks as hooks_lib

MEASURES = ("end_io", "end_s", "s2_s1", "s2_after_s1", "after_s1_s1",
            "dla", "copy", "copy_top1")


def _pick(pattern, query, key):
  """`[N, H]`: pattern `[N, H, T, T]` at each prompt's (query, key)."""
  rows = jnp.arange(pattern.shape[0])
  return pattern[rows, :, query, key]


def measure(model, tokens, meta, name_ids, *, patch=None) -> dict:
  """`{measure: [N, L, H]}` (module docstring) on clean `tokens [N, T]`;
  `name_ids`: the token ids of every name in the pool (the copying
  score's competitors); `patch` as the model's call takes it (heads
  knocked out: what the others do then)."""
  c = model.config
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  s1, s2, io_pos = (jnp.asarray(meta[k]) for k in ("s1_pos", "s2_pos",
                                                     "io_pos"))
  last = f"blocks.{c.num_layers - 1}.resid_post"
  sites = [last]
  for l in range(c.num_layers):
    sites += [f"blocks.{l}.attn.{x}" for x in ("pattern", "z", "v")]
  _, acts = forward.end_logits(model, tokens, end, capture=sites,
                               patch=patch)
  rows = jnp.arange(tokens.shape[0])
  scale = forward.final_scale(model, acts[last][rows, end])  # [N, D]
  u = forward.unembed(model, name_ids)  # [M, D]
  u_io, u_s = forward.unembed(model, io), forward.unembed(model, s)
  is_io = jnp.asarray(name_ids)[None] == io[:, None]  # [N, M]
  out = {k: [] for k in MEASURES}
  for l in range(c.num_layers):
    p = acts[f"blocks.{l}.attn.pattern"]
    w_o = model.blocks[l].attn.w_o[...]  # [H, Dv, D]
    out["end_io"].append(_pick(p, end, io_pos))
    out["end_s"].append(_pick(p, end, s1) + _pick(p, end, s2))
    out["s2_s1"].append(_pick(p, s2, s1))
    out["s2_after_s1"].append(_pick(p, s2, s1 + 1))
    out["after_s1_s1"].append(_pick(p, s1 + 1, s1))
    z_end = acts[f"blocks.{l}.attn.z"][rows, end]  # [N, H, Dv]
    term, frozen = head_terms(model, l, z_end, scale)
    out["dla"].append(jnp.einsum("nhd,nd->nh", term, u_io - u_s))
    v_io = hooks_lib.expand_kv(acts[f"blocks.{l}.attn.v"][rows, io_pos],
                               c.num_heads)  # [N, H, Dv]
    moved = jnp.einsum("nhe,hed->nhd", v_io, w_o) * frozen
    names = jnp.einsum("nhd,md->nhm", moved, u)  # [N, H, M]
    own = jnp.sum(jnp.where(is_io[:, None], names, 0.0), -1)
    others = (jnp.sum(names, -1) - own) / (names.shape[-1] - 1)
    out["copy"].append(own - others)
    out["copy_top1"].append((jnp.argmax(names, -1) == jnp.argmax(
        is_io, -1)[:, None]).astype(jnp.float32))
  return {k: jnp.stack(v, axis=1) for k, v in out.items()}


def head_terms(model, layer, z_end, scale):
  """`(term [N, H, D], frozen [N, 1, D])`: what each head of `layer`
  adds to the END stream, from its output there `z_end [N, H, Dv]`, times
  both norms on the way out (a sandwich block's post-norm, the final norm
  `scale [N, D]`, `forward.final_scale`) frozen at this run, so each
  head's share is linear: its term dotted with a token's readout
  direction is its direct effect on that token's logit. `frozen` is the
  product of the two scales."""
  w_o = model.blocks[layer].attn.w_o[...]  # [H, Dv, D]
  frozen = (forward.post_scale(model, layer, z_end) * scale)[:, None]
  return jnp.einsum("nhe,hed->nhd", z_end, w_o) * frozen, frozen


def uniform_floors(meta) -> dict:
  """`[N]`: the weight uniform causal attention puts on one key from END
  and from S2 (two keys for `end_s`)."""
  end = np.asarray(meta["end"], np.float64)
  s2 = np.asarray(meta["s2_pos"], np.float64)
  s1 = np.asarray(meta["s1_pos"], np.float64)
  return {"end_io": 1 / (end + 1), "end_s": 2 / (end + 1),
          "s2_s1": 1 / (s2 + 1), "s2_after_s1": 1 / (s2 + 1),
          "after_s1_s1": 1 / (s1 + 2)}


def repeat_kind(ci) -> str:
  """The kind of a head that marks S2 as a repeat, from the interval `ci`
  of its attention from S2 to S1 minus to the token after S1:
  "duplicate-token" above 0, "induction" below, else "not resolved"."""
  return ("duplicate-token" if ci[0] > 0 else "induction" if ci[1] < 0
          else "not resolved")
