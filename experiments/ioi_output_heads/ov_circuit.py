"""Copy suppression through a head's OV circuit alone (McDougall et al.
2023): does a name's own logit come out among the most suppressed when
the head's values read that name's embedding?

Shape letters: M tokens tested (the pool's names), H query heads, K kv
heads, Dv per-head value width, D d_model, V vocabulary.

For each token t: its embedding (position 0) goes through block l's own
pre-attention norm and value projection (`forward.block_sites`, the
model's code), then W_O^h, a sandwich block's post-norm and the final
norm, and is read out over the whole vocabulary. The rank of t's own
logit counts the tokens below it: 0 means t is the most suppressed token
of all. McDougall et al. read GPT-2's "effective embedding" (the
embedding through the first MLP), since its embedding alone is a poor
input to later heads; here the embedding is read as the layer's norm
sees it, which is the same question asked of the raw token, and can
fail for a head whose input at a name is far from that name's
embedding. Norm scales are positive per vector, so they change no rank.
"""

from __future__ import annotations

import jax.numpy as jnp

from experiments.ioi_task import forward
from mha_jax import hooks as hooks_lib


def own_ranks(model, layer: int, token_ids) -> dict:
  """`{"vocab": [H, M], "names": [H, M]}`: for every head of `layer` and
  every token of `token_ids [M]`, how many other tokens of the
  vocabulary (of `token_ids`) get a logit at or below the token's own
  from the head's OV circuit on its embedding (module docstring); 0 is
  the most suppressed."""
  c = model.config
  if model.readout is not None and c.readout_bias:
    raise ValueError("ov_circuit.own_ranks: a readout bias would add a "
                     "per-token constant that is no part of the OV "
                     "circuit; the model has readout_bias=True")
  ids = jnp.asarray(token_ids)
  # Each token alone, a sequence of one at position 0.
  x = model.embed(ids[:, None], jnp.zeros((ids.shape[0], 1), jnp.int32))
  v = forward.block_sites(model, layer, x, ("attn.v",))["attn.v"][:, 0]
  v = hooks_lib.expand_kv(v, c.num_heads)  # [M, H, Dv]
  block = model.blocks[layer]
  o = jnp.einsum("mhe,hed->mhd", v, block.attn.w_o[...])
  if c.norm_placement == "sandwich":
    o = block.ln_attn_post(o)
  if model.final_ln is not None:
    o = model.final_ln(o)
  logits = model.logits(o).astype(jnp.float32)  # [M, H, V]
  own = jnp.take_along_axis(logits, ids[:, None, None], -1)  # [M, H, 1]
  # Ties count against the token: a head that writes nothing leaves
  # every logit equal, which suppresses no token.
  vocab = jnp.sum(logits <= own, -1) - 1
  names = jnp.sum(logits[..., ids] <= own, -1) - 1
  return {"vocab": vocab.T, "names": names.T}


def all_heads(model, token_ids) -> dict:
  """`{"vocab": [L, H, M], "names": [L, H, M]}`: `own_ranks` of every
  layer."""
  per = [own_ranks(model, l, token_ids)
         for l in range(model.config.num_layers)]
  return {k: jnp.stack([p[k] for p in per]) for k in ("vocab", "names")}
